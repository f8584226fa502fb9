#!/usr/bin/env bash
# CPU rehearsal of the GPU machine (`make gpu-rehearsal`, docs/gpu.md): the proof that the wheel
# bundle is complete and that benchmarks/gpu_check.sh needs nothing from the development venv.
#   1. a fresh venv (.gpu-rehearsal/venv) holding only what the device image holds that the check
#      needs: CPU torch 2.13.0 in place of the image's CUDA torch 2.11 (its wheel is on this
#      machine's disk, for CPython 3.11: so the venv is the base Python's version, 3.11 here),
#      transformers 5.17.0 and onnxruntime 1.30.0 as on the image (else the nearest that installs),
#      numpy, pyyaml, regex, rich, typer, tqdm, safetensors, pytest, hypothesis, onnx (make-tiny-model
#      exports its ONNX stand-ins with it), einops and scipy (s3tokenizer's modules, speakerlab-slim's
#      requirement; the image's torchaudio has no build for torch 2.13: benchmarks/released_frontend.py
#      imports s3tokenizer without it); every package in
#      it must be on benchmarks/gpu_image_packages.txt;
#   2. the bundle built by that venv's Python for its own version (.gpu-bundle/pyXY);
#   3. gpu_check.sh --dry-run with PY=the venv's python: the bundle installed with --no-index
#      --no-deps --target as on the device, then the five parts to the summary table and RESULT: PASS
#      (the dry run is the only run that may pass on a CPU: without --dry-run the check says FAIL there).
# Network: PyPI (pip) for steps 1 and 2 only. REHEARSAL_PY: the base interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${REHEARSAL_PY:-python3}
DIR=.gpu-rehearsal
VENV=$DIR/venv
rm -rf "$VENV"
mkdir -p "$DIR"
"$BASE" -m venv "$VENV"
V=$VENV/bin/python
VER=$("$V" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
echo "== rehearsal venv $VENV (Python $VER)"
"$V" -m pip install -q --upgrade pip
# CPU torch: the wheel on disk when there is one (never PyPI's CUDA build), else PyTorch's CPU index
if ! "$V" -m pip install -q --no-deps --no-index --find-links /opt/wheels torch==2.13.0 2>/dev/null; then
  "$V" -m pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
fi
# typer<0.29: from 0.29 it needs pydantic, which the image lacks (it holds click, shellingham and
# annotated-doc: an older typer); the check below refuses any package the image does not list
IMAGE_SET=(numpy pyyaml regex rich "typer<0.29" tqdm safetensors pytest hypothesis packaging onnx pyarrow einops scipy)
"$V" -m pip install -q torch==2.13.0 "transformers==5.17.0" "onnxruntime==1.30.0" "${IMAGE_SET[@]}" \
  || "$V" -m pip install -q torch==2.13.0 "transformers>=5.17,<5.25" "onnxruntime>=1.30" "${IMAGE_SET[@]}"
"$V" - <<'EOF'
import re
import sys
from importlib import metadata

import torch

if torch.version.cuda:
    sys.exit(f"the rehearsal venv got a CUDA torch ({torch.__version__}): it must be the CPU build")
image = set()
for line in open("benchmarks/gpu_image_packages.txt"):
    line = line.split("#", 1)[0].strip()
    if line:
        image.add(re.sub(r"[-_.]+", "-", line.split("==")[0]).lower())
# installed distributions only: the checkout itself (a cosyclone.egg-info left by `pip install -e .` in
# the working tree, found through the current directory) travels as the working tree, not as a package
site = [p for p in sys.path if p.endswith("site-packages")]
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions(path=site)}
extra = sorted(set(have) - image)
print("rehearsal venv:", ", ".join(f"{k} {have[k]}" for k in ("torch", "transformers", "onnxruntime", "numpy")))
if extra:
    sys.exit(f"the rehearsal venv holds packages the device image lacks: {extra}")
print(f"all {len(have)} packages of the venv are on the image's list")
EOF
echo "== bundle for CPython $VER, built by the rehearsal venv's Python"
"$V" -m benchmarks.gpu_bundle build --python-version "$VER" --reference "${REFERENCE:-../shared/reference}"
echo "== gpu_check.sh --dry-run with PY=$V (nothing from the development venv)"
env -u PYTHONPATH -u VIRTUAL_ENV PATH="/usr/bin:/bin" PY="$V" BUNDLE=".gpu-bundle/py${VER/./}" \
  GPU_CHECK_LOGS="$DIR/logs" bash benchmarks/gpu_check.sh --dry-run
