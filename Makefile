# cosyclone developer entry points. `make test` and `make demo` work on a fresh machine:
# they create .venv and install what they need first (with the eval and report extras, so their tests run).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed only when none is importable. By default the CPU build, from PyTorch's CPU index
# (PyPI's Linux wheel is the CUDA build, several GB). GPU machines: the index of your CUDA/ROCm version,
# e.g. `make install TORCH_INDEX=https://download.pytorch.org/whl/cu128`, `TORCH_INDEX=` for PyPI's
# default build, or preinstall torch into $(VENV) yourself. Only torch comes from that index (--no-deps):
# its dependencies come with cosyclone's from the default index on the next line.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.installed
# benchmarks/released_frontend.py (the frontend of the released geometry, random weights): the torch modules
# of the v3 speech tokenizer and of CAM++, without their requirements (torchaudio has no build for torch 2.13;
# the hub clients are never used). The same pins travel to the GPU machine in benchmarks/gpu_bundle_pins.txt.
RELEASED_FRONTEND := s3tokenizer==0.3.0 speakerlab-slim==0.1.0

.PHONY: install test test-gpu lint bench demo clean gpu-bundle gpu-check gpu-rehearsal

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--no-deps --index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev,eval,ray,lhotse,report]"
	$(BIN)/python -m pip install -q --no-deps $(RELEASED_FRONTEND)
	touch $(STAMP)

install: $(STAMP)

# The CPU suite. Reference vectors: $$COSYCLONE_REFERENCE_VECTORS, default ../shared/reference/vectors;
# COSYCLONE_REQUIRE_REFERENCE=1 (set by .ci/run) turns missing reference material into failures.
test: $(STAMP)
	$(BIN)/python -m pytest tests -m "not gpu"

# Only the tests marked `gpu` (run it on a CUDA/ROCm machine; without one they skip, which proves nothing:
# `make gpu-check` fails on a skip). A fixed cuBLAS workspace: its results are then bitwise reproducible.
test-gpu: $(STAMP)
	CUBLAS_WORKSPACE_CONFIG=:4096:8 $(BIN)/python -m pytest tests -m gpu -p no:cacheprovider

# A bare, offline GPU machine (docs/gpu.md). gpu-bundle: the wheels its python3 lacks for synth, say and
# the gpu tests, for CPython $(PYVER), into .gpu-bundle/ (git-ignored; needs PyPI), plus a copy of the
# reference material for the parity part. gpu-check: the check itself (run it ON the GPU machine with
# .gpu-bundle carried; it installs nothing else; parts 1-4 within 7 minutes; on a CPU it says FAIL;
# GPU_CHECK_ARGS="--parts 3" reruns one part). gpu-rehearsal: the same check as a dry run on CPU, in a
# fresh venv holding only what the image holds, with a bundle built for that venv's Python.
PYVER ?= 3.12
REFERENCE ?= ../shared/reference
gpu-bundle:
	$(PY) -m benchmarks.gpu_bundle build --python-version $(PYVER) --reference $(REFERENCE)

gpu-check:
	bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)

gpu-rehearsal:
	REFERENCE=$(REFERENCE) bash benchmarks/gpu_rehearsal.sh

# ruff over everything, mypy over the package (configured in pyproject.toml; .ci/run runs this after the tests)
lint: $(STAMP)
	$(BIN)/ruff check cosyclone tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

demo: $(STAMP)
	$(BIN)/cosyclone make-tiny-model .tiny-model --force
	$(BIN)/cosyclone synth manifests/example.jsonl --model-dir .tiny-model --out demo --overwrite
	@echo "WAVs are in demo/wavs/, per-row diagnostics in demo/diagnostics.jsonl, totals in demo/summary.json"
	@echo "NOTE: .tiny-model has tiny RANDOM weights, so these WAVs are noise, not speech: the demo checks the"
	@echo "install and shows the outputs. For speech, download Fun-CosyVoice3-0.5B-2512 (README, 'Getting the model'):"
	@echo "  $(BIN)/cosyclone synth manifests/example.jsonl --model-dir /models/Fun-CosyVoice3-0.5B --out out"
	@echo "The cosyclone command is $(BIN)/cosyclone; or run 'source $(BIN)/activate' once and type 'cosyclone'."

clean:
	rm -rf $(VENV) .tiny-model demo .pytest_cache .gpu-rehearsal
