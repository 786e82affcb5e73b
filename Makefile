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

# transformers' own common model tests ship in its sdist, not its wheel: `make test` fetches the sources of the
# installed version once into this folder (tests/models/test_transformers_common.py runs them; skipped without)
TRANSFORMERS_TESTS ?= .cache/transformers-tests

.PHONY: install transformers-tests test test-fast demo lint

install:
	@if [ -n "$(TORCH_SPEC)" ]; then $(PIP) install -q "$(TORCH_SPEC)"; fi
	$(PIP) install -q -e ".[demo,dev]"

transformers-tests: install
	@v=$$($(PYTHON) -c "import transformers; print(transformers.__version__)"); \
	if [ ! -d "$(TRANSFORMERS_TESTS)/transformers-$$v/tests" ]; then \
		mkdir -p "$(TRANSFORMERS_TESTS)" && \
		$(PIP) download -q --no-deps --no-binary transformers "transformers==$$v" -d "$(TRANSFORMERS_TESTS)" && \
		tar xzf "$(TRANSFORMERS_TESTS)/transformers-$$v.tar.gz" -C "$(TRANSFORMERS_TESTS)" || \
		echo "transformers' test sources could not be fetched: its common tests will be skipped" >&2; \
	fi

test: transformers-tests
	MINITX_TRANSFORMERS_TESTS="$$(cd $(TRANSFORMERS_TESTS) 2>/dev/null && pwd)/transformers-$$($(PYTHON) -c \
		"import transformers; print(transformers.__version__)")" $(PYTHON) -m pytest -q -n auto --dist loadfile tests

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" tests

lint:
	$(PYTHON) -m ruff check hf_minitx scripts tests

demo: install
	$(PYTHON) -m hf_minitx demo
