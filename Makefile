# hf_minitx — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# torch is installed first and pinned, so that the package's own `torch` requirement is already
# satisfied and pip never pulls a CUDA build onto a CPU machine. Bring your own torch elsewhere:
# `make install TORCH_SPEC=torch` (or skip it with TORCH_SPEC=).
TORCH_SPEC ?= torch==2.13.0

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test test-fast demo lint

install:
	@if [ -n "$(TORCH_SPEC)" ]; then $(PIP) install -q "$(TORCH_SPEC)"; fi
	$(PIP) install -q -e ".[demo,dev]"

test: install
	$(PYTHON) -m pytest -q -n auto --dist loadfile tests

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" tests

lint:
	$(PYTHON) -m ruff check hf_minitx scripts tests

demo: install
	$(PYTHON) -m hf_minitx demo
