# Both targets create or refresh .venv by themselves (pip, not uv: the CPU torch wheel is local).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench bench-suite peers wheel clean

# The editable install compiles the scanner's Cython core (setup.py): editing the .pyx
# re-runs it here; by hand, `pip install -e .` rebuilds it.
$(STAMP): pyproject.toml setup.py ci/constraints.txt $(wildcard src/pickleshard/*.pyx)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=25.1"
	$(PY) -m pip install -q -c ci/constraints.txt -e . --group dev
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m pickleshard demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

# the wheel a user installs (README "Install"): dist/pickleshard-*.whl, the compiled core inside
wheel: $(STAMP)
	$(PY) -m build --wheel

# The peers (LitData, Mosaic Streaming) pin an older numpy than pickleshard's environment: they
# get their own virtualenv, used by the suite's peer rows through --peer-python.
PEERS := .venv-peers
$(PEERS)/.installed: ci/constraints.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q -c ci/constraints.txt torch litdata mosaicml-streaming datasets psutil
	touch $@

peers: $(PEERS)/.installed

bench-suite: $(STAMP) peers
	$(PY) -m bench --suite full --peer-python $(PEERS)/bin/python

clean:
	rm -rf $(VENV) $(PEERS) build dist .pytest_cache .mypy_cache .ruff_cache
	rm -f src/pickleshard/*.so src/pickleshard/*.c
