#!/usr/bin/env bash
# The GPU check: one prepared script, under 8 minutes on one GPU (each part has a timeout; 450 s in all). It prints
#   1. the parity suite's result (tests/parity -m "not slow") and the `gpu`-marked tests on CUDA
#      (the parity tests pin device="cpu" themselves; the CUDA checks are the `gpu` tests, e.g.
#      CUDA-graph tokens == eager tokens in fp32 and bf16),
#   2. ms per talker decode step at batch 1/16/64 in bf16, eager and with CUDA graphs, on
#      full-size dummy weights (benchmarks/gpu_step.py steps),
#   3. RTF at batch 16: `cosyclone synth` over a generated 16-row manifest, --load-format dummy,
#      --cuda-graphs auto (and the resolved value the run recorded).
# It installs nothing when .venv exists (else runs `make install`). Usage, from the repo root:
#   bash benchmarks/gpu_check.sh            # on a CUDA/ROCm machine
#   bash benchmarks/gpu_check.sh --dry-run  # on CPU: tiny sizes, no pytest, checks that it all runs
# PY=/path/to/python overrides the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ -z "${PY:-}" ]; then
  [ -x .venv/bin/python ] || make install
  PY=.venv/bin/python
fi
COSY=("$PY" -m cosyclone.cli)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
say() { printf '\n== %s\n' "$*"; }

say "machine"
"$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", getattr(torch.version, "hip", None))
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU only)")
EOF

if [ "$DRY" = 1 ]; then
  say "tests: skipped (--dry-run)"
  STEP_ARGS=(--tiny --device cpu --dtype fp32 --batches 1,3)
  ROWS=3
  "${COSY[@]}" make-tiny-model "$WORK/model" --force >/dev/null
  SYNTH_ARGS=(--model-dir "$WORK/model" --device cpu --n-timesteps 2 --max-tokens 8)
else
  say "parity suite (tests/parity -m 'not slow'; CPU-pinned tests) [at most 140 s]"
  timeout 140 "$PY" -m pytest tests/parity -m "not slow" -p no:cacheprovider || echo "PARITY: FAILED (rc $?)"
  say "gpu-marked tests on CUDA [at most 80 s]"
  timeout 80 "$PY" -m pytest tests -m gpu -p no:cacheprovider || echo "GPU TESTS: FAILED (rc $?)"
  STEP_ARGS=(--dtype bf16 --batches 1,16,64)
  ROWS=16
  SYNTH_ARGS=(--load-format dummy --dtype bf16)
fi

say "ms per decode step, eager vs CUDA graphs [at most 120 s]"
timeout 120 "$PY" -m benchmarks.gpu_step steps "${STEP_ARGS[@]}" || echo "STEP BENCH: FAILED (rc $?)"

say "RTF at batch $ROWS (cosyclone synth, dummy weights, --cuda-graphs auto) [at most 110 s]"
"$PY" -m benchmarks.gpu_step manifest "$WORK/m/m.jsonl" --rows "$ROWS"
if timeout 110 "${COSY[@]}" synth "$WORK/m/m.jsonl" --out "$WORK/run" --batch-size "$ROWS" --cuda-graphs auto \
    --quiet "${SYNTH_ARGS[@]}"; then
  "$PY" -m benchmarks.gpu_step rtf "$WORK/run"
else
  echo "SYNTH: FAILED (rc $?)"
fi
say "done"
