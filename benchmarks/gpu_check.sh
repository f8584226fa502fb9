#!/usr/bin/env bash
# The GPU check: one prepared script for a bare, offline GPU machine (docs/gpu.md). It uses the
# interpreter that already holds CUDA torch (python3; never a venv, never installs torch), installs
# the wheel bundle offline beside it (pip --no-index --no-deps --target, then PYTHONPATH), and runs
# its parts, most valuable first, each under its own limit, each with its own log and status, a
# failing part never hiding the next; it ends with ONE summary table and a RESULT line.
#
# It tells the truth or fails: every part runs on the GPU (--device cuda; no CPU fallback anywhere);
# part 1 fails without a CUDA device and then parts 2-4 are FAIL without running; a part that exits
# 0 is still judged on its evidence (benchmarks/gpu_verdict.py): decode needs the same tokens eager
# and graphed and a replayed graph in every batch, e2e a decode step run as a graph, gpu_tests that
# tests ran and none skipped. Tokens are compared before WAV bytes; cuBLAS runs with a fixed
# workspace (CUBLAS_WORKSPACE_CONFIG), the only way its results are bitwise reproducible.
#   1 env        nvidia-smi, GPU name, total/free memory, torch/CUDA/cuDNN, pip freeze, every
#                requirement's version; FAIL without a CUDA device                           [45 s]
#   2 decode     ms per decode step at the default precision (an fp32 talker) at 1 and 64 slots
#                and at the slots a run is sized for, eager and CUDA graphs, tokens compared
#                first, peak memory allocated/reserved per batch                             [55 s]
#   3 e2e        the night, end to end through a run folder as a user runs it (default
#                precision, the sized batch and slots) on full-size dummy weights, with the
#                frontend of the released geometry (benchmarks/released_frontend.py: built
#                here, offline; its prompts/s on the run's providers measured first): a
#                distinct prompt per row, 5-29 s, targets of 375 tokens (rows of about 30 s:
#                code2wav's budgets); loaded once, warmed up at the timed shape, one sized
#                batch timed (RTF, rows/s, frontend prompts/s, mean live slots, peak memory
#                against the sizing plan, each stage's share of the wall, graph steps)     [132 s]
#   4 gpu_tests  the tests marked gpu, only the files that hold them; a skip is a FAIL       [120 s]
#   5 parity     tests/parity -m "not slow" (reference: .gpu-bundle/reference): optional,
#                run when asked (--parts) or when parts 1-4 passed and its worst case still
#                fits the budget                                                             [50 s]
# Worst case of parts 1-4, every part interrupted at its limit, then killed KILL s later, then
# given up GRACE s later (stuck in the driver), the install and the version probe timed out:
#   PROBE 5 + INSTALL 30 + KILL 5 + (45 + 55 + 132 + 120) + 4 x (KILL 5 + GRACE 2) = 420 s <= BUDGET 420 s
# (a part's verdict, at most 5 s, runs only after the part exited within its limit: inside its
# KILL + GRACE). A CPU machine, a CPU-only torch or no driver: FAIL in seconds (parts 2-4 not run).
# Why these limits: part 1's own bounded commands (nvidia-smi twice at 8 s, pip freeze at 20 s) can
# take 36 s before torch starts, so 30 s could interrupt a healthy machine; the gpu tests build a
# tiny model, start CUDA and capture graphs in several files; part 3 builds a 240M-weight ONNX file
# (tens of seconds on the host's CPU) before its night, so it takes the largest share of seven minutes. No GPU has run the check yet: its first run's times are what to set them from.
# Logs and figures go to $OUT when set (7 files at most: N_part.log, figures.jsonl, summary.txt), else
# to $GPU_CHECK_LOGS (default out/gpu_check); each part's log is printed when the part ends.
# Usage, from the repo root:
#   bash benchmarks/gpu_check.sh             # on the GPU machine (carry .gpu-bundle): parts 1-4 (+5)
#   bash benchmarks/gpu_check.sh --dry-run   # all five parts on CPU at tiny sizes, same table
#   bash benchmarks/gpu_check.sh --parts 3   # only these parts (the others are SKIP in the table)
# PY: the interpreter (default python3); BUNDLE: the wheels (default .gpu-bundle/pyXY for PY's
# version; absent: nothing is installed and PY must already import them).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
PARTS=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --parts) PARTS=${2:-}; shift ;;
    *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run] [--parts 1,2,3,4,5]"; exit 2 ;;
  esac
  shift
done
if [ -n "$PARTS" ] && ! [[ $PARTS =~ ^[1-5](,[1-5])*$ ]]; then echo "--parts takes e.g. 1,2,3 (parts 1-5)"; exit 2; fi
BUDGET=420   # s: parts 1-4 at worst, with the probe, the install and every margin (header)
PROBE=5      # s: reading PY's version (then KILL)
INSTALL=30   # s: the bundle's offline install (then KILL after KILL s)
KILL=5       # s between a part's interrupt (SIGINT: a Python traceback) and its KILL
GRACE=2      # s after the KILL before a part still running (stuck in the driver) is given up
PY=${PY:-python3}
PYTAG=$(timeout -k 1 $((PROBE - 1)) "$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")') \
  || { echo "no Python at $PY"; echo "RESULT: FAIL (no Python at $PY)"; exit 2; }
BUNDLE=${BUNDLE:-.gpu-bundle/py$PYTAG}
LOGS=${OUT:-${GPU_CHECK_LOGS:-out/gpu_check}}
mkdir -p "$LOGS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# offline, reproducible: no hub lookups; cuBLAS bitwise reproducible (one fixed workspace config)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 GPU_CHECK_FIGURES="$LOGS/figures.jsonl" \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
: >"$GPU_CHECK_FIGURES"
if [ -z "${COSYCLONE_REFERENCE_VECTORS:-}" ] && [ -d .gpu-bundle/reference/vectors ]; then
  export COSYCLONE_REFERENCE_VECTORS=$ROOT/.gpu-bundle/reference/vectors  # the copy that travels with the bundle
fi

if [ "$DRY" = 1 ]; then
  MODE="dry run on CPU, tiny sizes"
  DEFAULT_PARTS=1,2,3,4,5
  LIMITS=(120 240 300 240 300)
  ENV_FLAG=
  STEP_ARGS=(--tiny --device cpu --dtype fp32 --batches 1,3,sized)
  # the released frontend's structure at one block (the packages and the plumbing; 12 blocks take a minute)
  E2E_ARGS=(--tiny --device cpu --dtype fp32 --rows 3 --batch 3 --n-timesteps 2 --max-tokens 8 --frontend-layers 1
            --frontend-prompts 1)
  GPU_TEST_ARGS=(--collect-only)  # on CPU: the files import and the marker selects their tests
  E2E_VERDICT=(e2e "$GPU_CHECK_FIGURES")  # no CUDA graph on a CPU
  TEST_VERDICT=(pytest "$LOGS/4_gpu_tests.log" --collect-only)  # at least one test selected
  PARITY=(tests/parity/test_text_parity.py tests/parity/test_sampling_parity.py)
else
  MODE="GPU"
  DEFAULT_PARTS=1,2,3,4  # parity (5) too when 1-4 passed and it still fits the budget
  LIMITS=(45 55 132 120 50)
  ENV_FLAG=--require-cuda
  STEP_ARGS=(--device cuda)  # the default precision; batches 1, 64 and the sized slots
  E2E_ARGS=(--device cuda --max-tokens 375)  # the sized batch; random weights never stop: 15 s targets
  GPU_TEST_ARGS=()
  E2E_VERDICT=(e2e "$GPU_CHECK_FIGURES" --require-graphs)
  TEST_VERDICT=(pytest "$LOGS/4_gpu_tests.log")  # tests ran, none failed, none skipped
  PARITY=(tests/parity)
fi
AUTO_PARITY=0
if [ -z "$PARTS" ]; then PARTS=$DEFAULT_PARTS; [ "$DRY" = 1 ] || AUTO_PARITY=1; fi
# the files that hold gpu-marked tests (not `-m gpu` over every module: many import soundfile and more)
mapfile -t GPU_FILES < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu|mark\.gpu\b' tests 2>/dev/null | sort)

declare -a NAMES STATUS SECS NOTES
NEEDS_CUDA=""  # set when part 1 found no CUDA device: why parts 2-4 do not run
asked() { [[ ",$PARTS," == *",$1,"* ]]; }
# run_part N NAME LIMIT [VERDICT...] -- CMD...: CMD under its limit (INT, KILL after KILL s, given up after
# GRACE s more), output to LOGS/N_NAME.log (printed when it ends); on exit 0, `gpu_verdict VERDICT...`
# judges what it left (no VERDICT: the exit status alone). Status: PASS, FAIL(rc), FAIL (the verdict's
# reason), TIMEOUT, KILLED, HUNG; only PASS and SKIP pass.
run_part() {
  local n=$1 name=$2 limit=$3 verdict=()
  shift 3
  while [ "$1" != -- ]; do verdict+=("$1"); shift; done
  shift
  local log="$LOGS/${n}_${name}.log" t0=$SECONDS rc note
  NAMES[n]=$name
  if ! asked "$n"; then STATUS[n]=SKIP; SECS[n]=0; NOTES[n]="not asked for (--parts $PARTS)"; return; fi
  if [ -n "$NEEDS_CUDA" ] && [ "$n" -ge 2 ] && [ "$n" -le 4 ]; then
    STATUS[n]=FAIL; SECS[n]=0; NOTES[n]="not run: ${NEEDS_CUDA:0:140}"
    printf '\n== part %s: %s not run: %s\n' "$n" "$name" "$NEEDS_CUDA"; return
  fi
  [ "$n" = 1 ] || : >"$log"
  printf '\n== part %s: %s (at most %s s) -> %s\n' "$n" "$name" "$limit" "$log"
  # (a subshell, so that bash's "Killed" notice goes to the log, not into the table)
  (GPU_CHECK_LIMIT=$limit timeout --signal=KILL $((limit + KILL + GRACE)) \
    timeout --signal=INT --kill-after=$KILL "$limit" "$@" >>"$log" 2>&1 </dev/null; exit $?) 2>>"$log"
  rc=$?
  if [ "$n" = 1 ]; then sed '/^--- pip freeze/,/^--- end of pip freeze/d' "$log"; else cat "$log"; fi
  note=$(grep -E '^SUMMARY: ' "$log" | tail -n 1 | cut -c10-)
  [ -z "$note" ] && note=$(grep -E '([0-9]+ (passed|failed|error|errors|skipped|deselected)|tests? collected|no tests ran)' "$log" | tail -n 1)
  case $rc in
    0) STATUS[n]=PASS
       if [ ${#verdict[@]} -gt 0 ]; then
         if ! timeout -k 1 4 "$PY" -m benchmarks.gpu_verdict "${verdict[@]}" >>"$log" 2>&1; then
           STATUS[n]=FAIL; note=$(grep -E '^VERDICT: ' "$log" | tail -n 1 | cut -c15-)
           note=${note:-the verdict did not run (see the log)}
         fi
         tail -n 1 "$log"
       fi ;;
    124) STATUS[n]=TIMEOUT; note="interrupted after ${limit} s (traceback in the log) ${note}" ;;
    137) if [ $((SECONDS - t0)) -ge $((limit + KILL + GRACE)) ]; then
           STATUS[n]=HUNG; note="still running ${KILL}+${GRACE} s after its KILL: given up (stuck in the driver?) ${note}"
         elif [ $((SECONDS - t0)) -ge "$limit" ]; then
           STATUS[n]=KILLED; note="killed ${KILL} s after its interrupt at ${limit} s ${note}"
         else STATUS[n]="FAIL(137)"; note="killed (SIGKILL) before its limit: out of host memory? ${note}"; fi ;;
    *) STATUS[n]="FAIL($rc)"; [ -z "$note" ] && note=$(grep -vE '^\s*$' "$log" | tail -n 1) ;;
  esac
  SECS[n]=$((SECONDS - t0)); NOTES[n]=${note:0:150}
  printf '%s part %s %s: %s\n' "${STATUS[n]}" "$n" "$name" "${NOTES[n]}"
}

# part 1: what the figures are measured on; exit 3 from gpu_step env (no CUDA device) keeps parts 2-4 off
part_env() {
  local problems=() rc summary
  echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)'))"
  echo "bundle: $(cat "$WORK/install")"
  echo "variables: HF_HUB_OFFLINE=$HF_HUB_OFFLINE TRANSFORMERS_OFFLINE=$TRANSFORMERS_OFFLINE" \
       "CUBLAS_WORKSPACE_CONFIG=$CUBLAS_WORKSPACE_CONFIG CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
  if command -v nvidia-smi >/dev/null; then  # bounded: a broken driver can hang it
    echo "--- nvidia-smi"
    timeout -k 2 8 nvidia-smi || echo "nvidia-smi failed (exit $?)"
    timeout -k 2 8 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv
  else
    echo "nvidia-smi: not on PATH"
  fi
  echo "--- torch"
  # shellcheck disable=SC2086  # one flag or none
  "$PY" -m benchmarks.gpu_step env $ENV_FLAG | tee "$WORK/env.out"
  rc=${PIPESTATUS[0]}
  summary=$(grep -E '^SUMMARY: ' "$WORK/env.out" | tail -n 1 | cut -c10-)
  case $rc in
    0) : >"$WORK/cuda_ok" ;;
    3) echo "$summary" >"$WORK/no_cuda"; problems+=("$summary") ;;
    *) if "$PY" -c 'import torch' >/dev/null 2>&1; then problems+=("gpu_step env failed (exit $rc)")
       else echo "NO CUDA: $PY has no torch" >"$WORK/no_cuda"; problems+=("NO CUDA: $PY has no torch"); fi ;;
  esac
  echo "--- pip freeze (PY's packages and the bundle's)"
  timeout -k 2 20 "$PY" -m pip freeze --all 2>/dev/null || timeout -k 2 20 "$PY" -c \
    'import importlib.metadata as m; print("\n".join(sorted(d.metadata["Name"] + "==" + d.version for d in m.distributions())))'
  echo "--- end of pip freeze"
  if [ -d "$BUNDLE" ]; then  # every requirement of cosyclone and of the bundle's wheels, as importable now
    "$PY" -m benchmarks.gpu_bundle installed --bundle "$BUNDLE" || problems+=("requirements not met (REQUIREMENT lines)")
  fi
  grep -q FAILED "$WORK/install" && problems+=("$(cat "$WORK/install")")
  "$PY" -c 'import soundfile, wetext, inflect, cosyclone.cli; print("imports: soundfile", soundfile.__version__, "wetext, inflect, cosyclone.cli OK")' \
    || problems+=("soundfile/wetext/inflect/cosyclone.cli do not import ($(cat "$WORK/install"))")
  if [ ${#problems[@]} -gt 0 ]; then
    local line=${problems[0]} p
    for p in "${problems[@]:1}"; do line="$line; $p"; done
    echo "SUMMARY: $line"
    return 1
  fi
  echo "SUMMARY: $summary"
}
export -f part_env
export PY BUNDLE WORK

# the bundle, offline, beside the interpreter's own packages (part 1's log starts with it)
SITE=$WORK/site
: >"$LOGS/1_env.log"
{
  echo "mode: $MODE; logs: $LOGS$([ "$DRY" = 1 ] || echo "; parts 1-4 at most $BUDGET s")"
  if ! asked 1 && ! asked 3 && ! asked 4 && ! asked 5; then
    echo "no bundle needed for parts $PARTS" >"$WORK/install"
  elif compgen -G "$BUNDLE/*.whl" >/dev/null; then
    if timeout -k $KILL $INSTALL "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --find-links "$BUNDLE" --target "$SITE" "$BUNDLE"/*.whl </dev/null; then
      echo "installed $(ls "$BUNDLE"/*.whl | wc -l) wheels from $BUNDLE" >"$WORK/install"
    else
      echo "BUNDLE INSTALL FAILED ($BUNDLE, exit $?)" >"$WORK/install"
    fi
  else
    echo "no wheels in $BUNDLE: nothing installed (build them with: make gpu-bundle PYVER=${PYTAG:0:1}.${PYTAG:1})" \
      >"$WORK/install"
  fi
  cat "$WORK/install"
} >>"$LOGS/1_env.log" 2>&1
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

export ENV_FLAG
run_part 1 env "${LIMITS[0]}" -- bash -c part_env
# parts 2-4 need the GPU: not run when part 1 found none, or could not ask (its probe hung)
if [ "$DRY" = 0 ] && asked 1 && [ ! -e "$WORK/cuda_ok" ]; then
  if [ -e "$WORK/no_cuda" ]; then NEEDS_CUDA="no CUDA device (part 1): $(sed 's/^NO CUDA: //' "$WORK/no_cuda")"
  elif [ "${STATUS[1]}" != PASS ] && [[ ${STATUS[1]} != FAIL* ]]; then
    NEEDS_CUDA="part 1's CUDA probe did not finish (${STATUS[1]}): the GPU does not answer"
  fi
fi
run_part 2 decode "${LIMITS[1]}" decode "$GPU_CHECK_FIGURES" --require-graphs -- \
  "$PY" -m benchmarks.gpu_step steps "${STEP_ARGS[@]}"
run_part 3 e2e "${LIMITS[2]}" "${E2E_VERDICT[@]}" -- "$PY" -m benchmarks.gpu_e2e "${E2E_ARGS[@]}"
if asked 4 && [ ${#GPU_FILES[@]} -eq 0 ]; then  # pytest without files would run every test under -m gpu
  NAMES[4]=gpu_tests; STATUS[4]=FAIL; SECS[4]=0; NOTES[4]="no file under tests/ holds a gpu-marked test"
else
  run_part 4 gpu_tests "${LIMITS[3]}" "${TEST_VERDICT[@]}" -- \
    "$PY" -m pytest "${GPU_FILES[@]}" -m gpu -p no:cacheprovider -rs -o faulthandler_timeout=$((LIMITS[3] - 15)) \
    "${GPU_TEST_ARGS[@]}"
fi
if [ "$AUTO_PARITY" = 1 ]; then
  why=""
  for n in 1 2 3 4; do [ "${STATUS[n]}" = PASS ] || why="parts 1-4 did not all pass"; done
  [ -z "$why" ] && [ $((SECONDS + LIMITS[4] + KILL + GRACE)) -gt "$BUDGET" ] && why="its worst case would pass the $BUDGET s budget"
  if [ -z "$why" ]; then PARTS=$PARTS,5; else NAMES[5]=parity; STATUS[5]=SKIP; SECS[5]=0; NOTES[5]="optional, not run: $why"; fi
fi
[ -z "${STATUS[5]:-}" ] && run_part 5 parity "${LIMITS[4]}" pytest "$LOGS/5_parity.log" --allow-skips -- \
  "$PY" -m pytest "${PARITY[@]}" -m "not slow" -p no:cacheprovider -rs -o faulthandler_timeout=$((LIMITS[4] - 15))

RESULT=PASS
for n in 1 2 3 4 5; do case ${STATUS[n]} in PASS|SKIP) ;; *) RESULT=FAIL ;; esac; done
{
  printf '\nGPU CHECK SUMMARY (%s; %s s in all%s)\n' "$MODE" "$SECONDS" "$([ "$DRY" = 1 ] || echo "; parts 1-4 at most $BUDGET s")"
  printf '%-2s %-10s %-11s %5s  %s\n' "#" part status secs result
  for n in 1 2 3 4 5; do
    printf '%-2s %-10s %-11s %5s  %s\n' "$n" "${NAMES[n]}" "${STATUS[n]}" "${SECS[n]}" "${NOTES[n]}"
  done
  echo "RESULT: $RESULT"
} | tee "$LOGS/summary.txt"
[ "$RESULT" = PASS ]
