# Two commands set up everything on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs what it needs; the CPU torch pin goes in first unless torch is
# already importable (an unpinned torch would pull a multi-GB CUDA build).

PYTHON ?= python3
VENV ?= .venv
TORCH_PIN ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmfront-installed

.PHONY: demo test bench lint pytest install

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --disable-pip-version-check "$(TORCH_PIN)"
	$(PY) -m pip install --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmfront demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest

test: lint pytest

bench: $(STAMP)
	$(VENV)/bin/mmfront bench
