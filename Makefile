# cosyclone developer entry points. `make test` and `make demo` work on a fresh machine:
# they create .venv and install what they need first (with the eval extra, so the eval tests run).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without a GPU install the CPU build of torch (a CUDA build is several GB).
# CUDA / ROCm users: `make install TORCH_SPEC="torch" TORCH_INDEX=` (or preinstall torch yourself).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install test test-gpu lint bench demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev,eval,ray]"
	touch $(STAMP)

install: $(STAMP)

# The CPU suite. Reference vectors: $$COSYCLONE_REFERENCE_VECTORS, default ../shared/reference/vectors;
# COSYCLONE_REQUIRE_REFERENCE=1 (set by .ci/run) turns missing reference material into failures.
test: $(STAMP)
	$(BIN)/python -m pytest tests -m "not gpu"

# The GPU check script: only the tests marked `gpu` (run it on a CUDA/ROCm machine).
test-gpu: $(STAMP)
	$(BIN)/python -m pytest tests -m gpu -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check cosyclone tests benchmarks

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

demo: $(STAMP)
	$(BIN)/cosyclone make-tiny-model .tiny-model --force
	$(BIN)/cosyclone synth manifests/example.jsonl --model-dir .tiny-model --out demo --overwrite
	@echo "WAVs are in demo/wavs/, per-row diagnostics in demo/diagnostics.jsonl, totals in demo/summary.json"

clean:
	rm -rf $(VENV) .tiny-model demo .pytest_cache
