# Two commands set up everything on a fresh machine: `make demo` and `make test`.
# Each creates its virtual environment(s) and installs what it needs; the CPU torch pin goes in
# first unless torch is already importable (an unpinned torch would pull a multi-GB CUDA build).
#
# `make test` runs ruff and mypy, then the whole suite twice: in .venv (the newest transformers
# pyproject.toml allows: the Offsets backend) and in .venv-legacy (transformers 5.14.1: the
# Legacy backend, selected for real).
# .venv, and so its overlay .venv-legacy, gets torchvision (TORCHVISION_PIN, the release built for
# TORCH_PIN, an 8 MB wheel, installed without dependencies so it never moves torch): transformers
# builds no video processor without it, and with it no Qwen2-VL, Qwen2.5-VL, Qwen3-VL or
# LLaVA-OneVision processor. Beside CPU torch its compiled ops do not load; mmfront's import shim
# covers that (docs/models.md, "torchvision"). Likewise torchaudio (TORCHAUDIO_PIN, 1.8 MB, the
# newest on the index, built for torch 2.11): Granite Speech's and FunASR-Nano's feature
# extractors need it, and a second shim lets it import without its compiled extension
# (docs/models.md, "torchaudio").
# .venv gets the `ray` extra, so the processing lanes' Ray executor is tested against a local Ray
# instance (under the newest transformers only: nothing in the Ray path depends on its version). .venv-legacy is an overlay of .venv: its own site-packages holds only transformers
# 5.14.1 and the huggingface-hub/tokenizers it needs, found first; a .pth file then adds .venv's
# site-packages (torch, mmfront editable, the test tools) behind them. Installing it takes seconds
# where a second full install took minutes of the 15-minute budget.

PYTHON ?= python3
TORCH_PIN ?= torch==2.13.0
TORCHVISION_PIN ?= torchvision==0.28.0
TORCHAUDIO_PIN ?= torchaudio==2.11.1
VENV ?= .venv
LEGACY_VENV ?= .venv-legacy
LEGACY_TRANSFORMERS ?= 5.14.1
# pip byte-compiles what it installs, every module of every package: 61 s for .venv's site-packages
# (torch 8.7 s, transformers 9.9 s, Ray 5.1 s), most of it modules no test imports. `make demo`'s
# install keeps it: where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) no process
# would write them, and each would compile torch's and transformers' modules again (measured: the
# two suites took 20.7 min instead of 11.6 when nothing could write them). `make test`'s installs
# skip it (--no-compile): its targets let processes write bytecode (below), so what the suite
# imports is compiled once, by its first importer (the pytest workers' collection), and kept.
PIP_FLAGS := --disable-pip-version-check
# find_spec, not import: beside CPU torch, PyPI's torchvision imports only once mmfront is imported
HAS_MODULE := import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)

PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.mmfront-base
STAMP := $(VENV)/.mmfront-installed
LEGACY_PY := $(LEGACY_VENV)/bin/python
LEGACY_STAMP := $(LEGACY_VENV)/.mmfront-installed

.PHONY: demo test bench soak soak-http lint pytest pytest-legacy install

install: $(STAMP)

# What `make demo` needs, and what serving every family of docs/models.md needs: mmfront, its runtime
# dependencies, the `demo` extra (OpenAI's client, which sends the demo's requests to `mmfront
# serve`), the `video` extra (PyAV: video items) and torchvision and torchaudio as `make test` installs
# them (the families whose processors need them, see above); no test tools, no Ray. So
# `mmfront fixtures build FAMILY DIR` and `mmfront serve DIR` work in it for every family.
# `make test`'s install is the same recipe with the test tools and Ray among the extras, in one pip
# call: mmfront is built (its C extension compiled, in pip's isolated build environment) once, not
# once for the base and again for the extras (measured: 15 to 20 s of wall time each build).
BASE_EXTRAS := demo,video
TEST_EXTRAS := $(BASE_EXTRAS),test,ray
define INSTALL
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(PIP_FLAGS) $(2) "$(TORCH_PIN)"
	$(PY) -m pip install $(PIP_FLAGS) $(2) -e ".[$(1)]"
	$(PY) -c "$(HAS_MODULE)" torchvision || $(PY) -m pip install $(PIP_FLAGS) $(2) --no-deps "$(TORCHVISION_PIN)"
	$(PY) -c "$(HAS_MODULE)" torchaudio || $(PY) -m pip install $(PIP_FLAGS) $(2) --no-deps "$(TORCHAUDIO_PIN)"
endef

$(BASE_STAMP): pyproject.toml setup.py src/mmfront/_pixels.c
	$(call INSTALL,$(BASE_EXTRAS))
	touch $(BASE_STAMP)

$(STAMP): pyproject.toml setup.py src/mmfront/_pixels.c
	$(call INSTALL,$(TEST_EXTRAS),--no-compile)
	touch $(BASE_STAMP) $(STAMP)

# Run by .venv-legacy's python with .venv's site-packages as argument: the .pth file of the overlay.
export OVERLAY := import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], 'mmfront-base-venv.pth').write_text(f'import site; site.addsitedir({sys.argv[1]!r})\n')

$(LEGACY_STAMP): $(STAMP)
	rm -rf $(LEGACY_VENV)
	$(PYTHON) -m venv $(LEGACY_VENV)
	$(LEGACY_PY) -c "$$OVERLAY" "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(LEGACY_PY) -m pip install $(PIP_FLAGS) --no-compile "transformers==$(LEGACY_TRANSFORMERS)"
	touch $(LEGACY_STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/mmfront demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy --num-workers 2
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests/test_architecture.py

# Two workers (CI has 2 cores): much of the suite waits on engine processes and handshakes, which
# overlap; --dist loadscope keeps each module's fixtures (a worker, a server) in one process, and
# --no-loadscope-reorder deals the modules in tests/conftest.py's order (slow modules first).
PYTEST_ARGS ?= -n 2 --dist loadscope --no-loadscope-reorder

# Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), every one of the suite's
# processes would compile mmfront's modules again, and each pytest worker would rewrite the asserts
# of all ~250 test modules (6 s of CPU each, measured): lint and the suites write their caches,
# which later steps read, and the bytecode of what they import, which `make test`'s installs leave
# uncompiled (above). __pycache__ is ignored by git.
lint pytest pytest-legacy: export PYTHONDONTWRITEBYTECODE :=

pytest: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

pytest-legacy: $(LEGACY_STAMP)
	$(LEGACY_PY) -c "import transformers; assert transformers.__version__ == '$(LEGACY_TRANSFORMERS)', transformers.__version__"
	$(LEGACY_PY) -m pytest $(PYTEST_ARGS) -m "not vllm_side_by_side"

test: lint pytest pytest-legacy

bench: $(STAMP)
	$(VENV)/bin/mmfront bench

# Not part of `test`: 50,000 requests with injected faults, about half an hour on 2 cores (see
# docs/reliability.md). SOAK_ARGS shortens or varies it, e.g. SOAK_ARGS="--requests 5000 --cache shm".
SOAK_ARGS ?=
soak: $(STAMP)
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

# Not part of `test` either: `mmfront serve` under issue 36's HTTP attacks for 10 minutes after a
# 2-minute attack-free baseline (docs/benchmarks.md, "The HTTP soak"). SOAK_HTTP_ARGS varies it,
# e.g. SOAK_HTTP_ARGS="--minutes 1 --baseline-minutes 1 --json".
SOAK_HTTP_ARGS ?=
soak-http: $(STAMP)
	$(PY) benchmarks/bench_soak_http.py $(SOAK_HTTP_ARGS)
