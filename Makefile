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

test: venv lint
	$(BIN)/pytest

demo: venv
	$(BIN)/python -m meteorseed_scrapy.testing.demo

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache .demo
