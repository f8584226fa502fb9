#!/usr/bin/env bash
# The GPU check: one prepared script for a bare, offline GPU machine (docs/gpu.md). It uses the
# interpreter that already holds CUDA torch (python3; never a venv, never installs torch), installs
# the wheel bundle offline beside it (pip --no-index --no-deps --target, then PYTHONPATH), and runs
# five parts, most valuable first, each under its own timeout (SIGINT first, so a hang prints a
# Python traceback; KILL 10 s later), each with its own log and PASS/FAIL line, a failing part not
# hiding the next; it ends with ONE summary table. Typical run under 4 minutes, worst case under 8
# (every part interrupted, then killed, the install timed out: 370 + 5 x 10 + 60 = 480 s):
#   1 env        GPU, torch, CUDA, the bundle installed, every requirement's version     [30 s]
#   2 decode     ms per decode step at batch 1/16/64, bf16, eager and CUDA graphs, same
#                tokens both ways, peak memory allocated/reserved per batch               [95 s]
#   3 e2e        warm end-to-end on full-size dummy weights: loaded once, one warm-up batch,
#                48 rows at batch 16 timed (RTF, rows/s, peak memory, seconds per stage,
#                decode steps that really ran as graphs)                                 [125 s]
#   4 gpu_tests  the tests marked gpu, only the files that hold them                     [70 s]
#   5 parity     tests/parity -m "not slow" (reference: .gpu-bundle/reference)          [50 s]
# Logs and figures go to $OUT when set (7 files: N_part.log, figures.jsonl, summary.txt), else to
# $GPU_CHECK_LOGS (default out/gpu_check).
# Usage, from the repo root:
#   bash benchmarks/gpu_check.sh             # on the GPU machine (carry .gpu-bundle)
#   bash benchmarks/gpu_check.sh --dry-run   # the same parts on CPU at tiny sizes, same table
#   bash benchmarks/gpu_check.sh --parts 3   # only these parts (the others are SKIP in the table)
# PY: the interpreter (default python3); BUNDLE: the wheels (default .gpu-bundle/pyXY for PY's
# version; absent: nothing is installed and PY must already import them).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
PARTS=1,2,3,4,5
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --parts) PARTS=$2; shift ;;
    *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run] [--parts 1,2,3,4,5]"; exit 2 ;;
  esac
  shift
done
PY=${PY:-python3}
PYTAG=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")') || { echo "no Python at $PY"; exit 2; }
BUNDLE=${BUNDLE:-.gpu-bundle/py$PYTAG}
LOGS=${OUT:-${GPU_CHECK_LOGS:-out/gpu_check}}
mkdir -p "$LOGS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 GPU_CHECK_FIGURES="$LOGS/figures.jsonl"
: >"$GPU_CHECK_FIGURES"
if [ -z "${COSYCLONE_REFERENCE_VECTORS:-}" ] && [ -d .gpu-bundle/reference/vectors ]; then
  export COSYCLONE_REFERENCE_VECTORS=$ROOT/.gpu-bundle/reference/vectors  # the copy that travels with the bundle
fi

if [ "$DRY" = 1 ]; then
  MODE="dry run on CPU, tiny sizes"
  LIMITS=(120 240 300 240 300)
  STEP_ARGS=(--tiny --device cpu --dtype fp32 --batches 1,3)
  E2E_ARGS=(--tiny --device cpu --dtype fp32 --rows 6 --batch 3 --n-timesteps 2 --max-tokens 8)
  GPU_TEST_ARGS=(--collect-only)  # on CPU: the files import and the marker selects their tests
  PARITY=(tests/parity/test_text_parity.py tests/parity/test_sampling_parity.py)
else
  MODE="GPU"
  LIMITS=(30 95 125 70 50)
  STEP_ARGS=(--dtype bf16 --batches 1,16,64)
  E2E_ARGS=(--dtype bf16 --rows 48 --batch 16 --max-tokens 200)  # random weights never stop: 8 s of audio a row
  GPU_TEST_ARGS=()
  PARITY=(tests/parity)
fi
# the files that hold gpu-marked tests (not `-m gpu` over every module: many import soundfile and more)
mapfile -t GPU_FILES < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu|mark\.gpu\b' tests | sort)

declare -a NAMES STATUS SECS NOTES
# run_part N NAME LIMIT CMD...: the command under its timeout, output to the terminal and LOGS/N_NAME.log
run_part() {
  local n=$1 name=$2 limit=$3
  shift 3
  local log="$LOGS/${n}_${name}.log" t0=$SECONDS rc note
  NAMES[n]=$name
  if [[ ",$PARTS," != *",$n,"* ]]; then STATUS[n]=SKIP; SECS[n]=0; NOTES[n]="not asked for (--parts $PARTS)"; return; fi
  [ "$n" = 1 ] || : >"$log"
  printf '\n== part %s: %s (at most %s s) -> %s\n' "$n" "$name" "$limit" "$log"
  GPU_CHECK_LIMIT=$limit timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  note=$(grep -E '^SUMMARY: ' "$log" | tail -n 1 | cut -c10-)
  [ -z "$note" ] && note=$(grep -E '([0-9]+ (passed|failed|error|errors|skipped|deselected)|tests? collected|no tests ran)' "$log" | tail -n 1)
  case $rc in
    0) STATUS[n]=PASS ;;
    124|130) STATUS[n]="TIMEOUT"; note="interrupted after ${limit} s (traceback in the log) ${note}" ;;
    137) STATUS[n]="KILLED"; note="killed after ${limit}+10 s ${note}" ;;
    *) STATUS[n]="FAIL($rc)"; [ -z "$note" ] && note=$(grep -vE '^\s*$' "$log" | tail -n 1) ;;
  esac
  SECS[n]=$((SECONDS - t0)); NOTES[n]=${note:0:150}
  printf '%s part %s %s: %s\n' "${STATUS[n]}" "$n" "$name" "${NOTES[n]}"
}

part_env() {
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)'))"
  echo "bundle: $BUNDLE -> $SITE (installed before this part: see above)"
  "$PY" -m benchmarks.gpu_step env || return 1
  # every requirement of cosyclone and of the bundle's wheels, against the versions importable now
  if [ -d "$BUNDLE" ]; then "$PY" -m benchmarks.gpu_bundle installed --bundle "$BUNDLE" || return 1; fi
  "$PY" -c 'import soundfile, wetext, inflect, cosyclone.cli; print("imports: soundfile", soundfile.__version__, "wetext, inflect, cosyclone.cli OK")'
}
export -f part_env
export PY BUNDLE

# the bundle, offline, beside the interpreter's own packages (part 1's log starts with it)
SITE=$WORK/site
export SITE
: >"$LOGS/1_env.log"
{
  echo "mode: $MODE; logs: $LOGS"
  if compgen -G "$BUNDLE/*.whl" >/dev/null; then
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --find-links "$BUNDLE" --target "$SITE" "$BUNDLE"/*.whl && echo "installed $(ls "$BUNDLE"/*.whl | wc -l) wheels from $BUNDLE" \
      || echo "BUNDLE INSTALL FAILED"
  else
    echo "no wheels in $BUNDLE: nothing installed (build them with: make gpu-bundle PYVER=${PYTAG:0:1}.${PYTAG:1})"
  fi
} 2>&1 | tee -a "$LOGS/1_env.log"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

run_part 1 env "${LIMITS[0]}" bash -c part_env
run_part 2 decode "${LIMITS[1]}" "$PY" -m benchmarks.gpu_step steps "${STEP_ARGS[@]}"
run_part 3 e2e "${LIMITS[2]}" "$PY" -m benchmarks.gpu_step e2e "${E2E_ARGS[@]}"
run_part 4 gpu_tests "${LIMITS[3]}" "$PY" -m pytest "${GPU_FILES[@]}" -m gpu -p no:cacheprovider -rs \
  -o faulthandler_timeout=$((LIMITS[3] - 15)) "${GPU_TEST_ARGS[@]}"
run_part 5 parity "${LIMITS[4]}" "$PY" -m pytest "${PARITY[@]}" -m "not slow" -p no:cacheprovider -rs \
  -o faulthandler_timeout=$((LIMITS[4] - 15))

{
  printf '\nGPU CHECK SUMMARY (%s; %s s in all)\n' "$MODE" "$SECONDS"
  printf '%-2s %-10s %-11s %5s  %s\n' "#" part status secs result
  for n in 1 2 3 4 5; do
    printf '%-2s %-10s %-11s %5s  %s\n' "$n" "${NAMES[n]}" "${STATUS[n]}" "${SECS[n]}" "${NOTES[n]}"
  done
} | tee "$LOGS/summary.txt"
for n in 1 2 3 4 5; do case ${STATUS[n]} in PASS|SKIP) ;; *) exit 1 ;; esac; done
exit 0
