#!/usr/bin/env bash
# bench/gpu/validate.sh — the validation run of the CUDA library on a bare
# GPU host: the check every GPU change is proven with (docs/gpu.md). Needs
# the source tree, a C compiler, make and a CUDA toolkit (nvcc, cudart; not
# cuBLAS); Python with PyTorch only for the peers. No bun, npm or network,
# and no models/ (the shipped models are used where present).
#
#   bench/gpu/validate.sh [--no-gpu] [--quick] [--out DIR] [--build DIR] [--budget SECONDS] [--commit SHA]
#
# Stages, each recorded as JSON lines (bench/gpu/driver/report.c) and
# gathered by bench/gpu/report.awk into DIR/gpu.json, with a summary table
# printed last:
#   build      both libraries (bench/gpu/Makefile: the CUDA library fails on a
#              register spill), the driver and the CPU harness
#   harness    the CUDA library's arithmetic and schedules on the host against
#              the CPU library, bit for bit: the quantized kernels'
#              (kernels/cuda/quant_math.h), the exit gate's (exit_math.h) and
#              the schedule of blocks where rows exit early (block_steps.h)
#   checks     the driver: the CUDA library held to the CPU library on every
#              model case (bench/gpu/driver/cases.c), and what it reports
#              and refuses
#   figures    loopserve's decode (one stream at loops 1, 8 and 16, 64
#              rows), the PyTorch CUDA-graph decode of the same block and a
#              copy probe (bench/gpu/torch_decode.py)
#   sanitizer  compute-sanitizer memcheck and racecheck on the driver's
#              short run of every kernel path, in the time the run has left
# Without a usable GPU (or with --no-gpu) the GPU stages are reported as not
# available and the driver runs every check with the CPU library against
# itself (its best SIMD path against the portable one), so CI proves the
# script, the driver and the harness (test/deploy/cuda.test.ts).
#
# --quick: the checks' short run only (compute-sanitizer's four small
# models). --out: where gpu.json and validate.log go (default
# bench/results). --build: the build folder (default build/gpu; build/
# reuses what build.ts compiled). --budget: the seconds the run may take
# (default 540: a GPU host's command limit is 10 minutes); a stage still
# running then is stopped and recorded, and the report is written all the
# same. --commit: the commit to name when the tree has no .git. Models
# are written under $TMPDIR/loopserve-gpu-validate. Exit status 0 when
# every check passed.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/gpu
OUT=$ROOT/bench/results
NO_GPU=0
QUICK=0
COMMIT=""
BUILD=$ROOT/build/gpu
BUDGET=540
while [ $# -gt 0 ]; do
  case $1 in
    --no-gpu) NO_GPU=1 ;;
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    --commit) COMMIT=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    *) echo "usage: bench/gpu/validate.sh [--no-gpu] [--quick] [--out DIR] [--build DIR] [--budget SECONDS] [--commit SHA]" >&2; exit 2 ;;
  esac
  shift
done

STARTED=$(date +%s)
DEADLINE=$(( STARTED + BUDGET ))
TMP=${TMPDIR:-/tmp}/loopserve-gpu-validate
MODELS=$ROOT/models
mkdir -p "$OUT" "$TMP" "$BUILD"
RECORDS=$TMP/records.jsonl
LOG=$OUT/validate.log
: >"$RECORDS"
: >"$LOG"

say() { echo "validate: $*" | tee -a "$LOG" >&2; }
# A record of a stage this script runs itself: name, status, detail, seconds.
record() {
  local detail=${3//\\/\\\\}
  detail=${detail//\"/\\\"}
  printf '{"kind":"check","name":"%s","status":"%s","value":null,"bar":"%s","seconds":%s,"detail":"%s"}\n' \
    "$1" "$2" "${5:-}" "$4" "$(printf '%s' "$detail" | tr '\n\t' '  ')" >>"$RECORDS"
}
# Seconds left before the deadline (at least 1).
left() { local s=$(( DEADLINE - $(date +%s) )); echo $(( s > 0 ? s : 1 )); }
# Runs a command within the time left, its output to the log; JSON lines it
# prints join the records. Returns the command's status (124: out of time).
records_of() {
  timeout "$(left)" "$@" 2>>"$LOG" | tee -a "$LOG" | grep '^{' >>"$RECORDS"
  return "${PIPESTATUS[0]}"
}

# ---- the host ----
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$COMMIT" ] || COMMIT=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
say "commit $COMMIT; GPU: ${GPU_NAME:-none}; nvcc: ${NVCC:-none}"

# ---- build ----
t0=$(date +%s)
TARGETS="cpu-lib driver harness"
[ -n "$NVCC" ] && TARGETS="$TARGETS cuda-lib"
if make --no-print-directory -f "$HERE/Makefile" -j"$(nproc)" BUILD="$BUILD" NVCC="$NVCC" $TARGETS >>"$LOG" 2>&1; then
  record build/libraries pass "built: $TARGETS" $(( $(date +%s) - t0 )) "builds"
else
  record build/libraries fail "make failed: $(tail -5 "$LOG")" $(( $(date +%s) - t0 )) "builds"
fi
CUDA_LIB=-
if [ -f "$BUILD/libloopserve_cuda.so" ] && [ -n "$NVCC" ]; then
  CUDA_LIB=$BUILD/libloopserve_cuda.so
  record build/no-register-spills pass "ptxas -v: no kernel spills (bench/gpu/spills.awk)" 0 "0 bytes"
fi

# ---- is there a GPU to run on ----
GPU=0
if [ $NO_GPU = 0 ] && [ "$CUDA_LIB" != - ] && [ -x "$BUILD/gpu_driver" ]; then
  [ "$("$BUILD/gpu_driver" devices "$CUDA_LIB" 2>>"$LOG")" -gt 0 ] 2>/dev/null && GPU=1
fi
[ $GPU = 1 ] && MODE=gpu || MODE=no-gpu
CPU_FLAG=$([ $GPU = 1 ] || echo --cpu)
QUICK_FLAG=$([ $QUICK = 1 ] && echo --quick)
say "mode: $MODE"

# ---- harness and checks ----
t0=$(date +%s)
if [ -x "$BUILD/harness" ]; then
  # the exit schedule's models: the driver's stack, and the shipped one where models/ has it
  stacks=()
  for c in stack-2-layers trained-ouro; do
    f=$("$BUILD/gpu_driver" model "$c" "$TMP" "$MODELS" 2>>"$LOG") && stacks+=("$f")
  done
  records_of "$BUILD/harness" ${stacks[@]+"${stacks[@]}"}
fi
if [ -x "$BUILD/gpu_driver" ] && [ -f "$BUILD/libloopserve.so" ]; then
  records_of "$BUILD/gpu_driver" checks "$BUILD/libloopserve.so" "$CUDA_LIB" "$TMP" "$MODELS" $CPU_FLAG $QUICK_FLAG
  rc=$?
  [ $rc -le 1 ] || record driver/checks fail "the driver stopped (exit $rc$([ $rc = 124 ] && echo ': out of time')): see validate.log" $(( $(date +%s) - t0 ))
fi

# ---- figures ----
if [ -x "$BUILD/gpu_driver" ] && [ -f "$BUILD/libloopserve.so" ]; then
  records_of "$BUILD/gpu_driver" figures "$BUILD/libloopserve.so" "$CUDA_LIB" "$TMP" "$MODELS" $CPU_FLAG
fi
peers() { # case rows peers
  local file
  file=$("$BUILD/gpu_driver" model "$1" "$TMP" "$MODELS" 2>>"$LOG") || return 0
  PYTHONUNBUFFERED=1 timeout "$(left)" python3 "$HERE/torch_decode.py" "$file" --name "$1" --loops 8 --rows "$2" --peers "$3" \
    2>>"$LOG" | tee -a "$LOG" | grep '^{' | sed 's/^{/{"kind":"peer",/' >>"$RECORDS"
}
if [ $GPU = 1 ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>>"$LOG"; then
  peers dim2048-fp16 1,64 graph,copy
  peers trained 1 graph
  record figures/pytorch-peer pass "bench/gpu/torch_decode.py ran" 0 "present"
else
  record figures/pytorch-peer skip "not available: $([ $GPU = 1 ] && echo 'no PyTorch with CUDA' || echo 'no GPU')" 0 "present"
fi
# llama.cpp's CUDA build needs bench/peer's source bundle (npm) and the
# unrolled GGUF (written by bun): bench:serve -- --gpu runs it where they are.
record figures/llama-cpp skip "not run here: needs bench/peer's llama.cpp source bundle (npm) and bun to write the unrolled GGUF; bench:serve -- --gpu runs it" 0 "present"

# ---- sanitizer ----
# Last of the stages, each with a share of the time left (a sanitized run is
# the slowest part): what ran before it is kept whatever happens here.
sanitize() { # tool, runs left after this one
  local name=sanitizer/$1 t0 budget
  t0=$(date +%s)
  budget=$(( (DEADLINE - t0) / ($2 + 1) ))
  if [ $GPU = 0 ]; then record "$name" skip "not available: no GPU" 0 "0 errors"; return; fi
  if [ $budget -lt 30 ]; then record "$name" skip "not run: the run's time budget is spent" 0 "0 errors"; return; fi
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -z "$cs" ]; then record "$name" skip "not available: compute-sanitizer is not installed" 0 "0 errors"; return; fi
  local out=$TMP/sanitizer-$1.txt
  timeout "$budget" "$cs" --tool "$1" --error-exitcode 99 "$BUILD/gpu_driver" checks "$BUILD/libloopserve.so" "$CUDA_LIB" \
    "$TMP" "$MODELS" --quick >"$out" 2>&1
  local rc=$?
  cat "$out" >>"$LOG"
  local summary
  # memcheck ends with "ERROR SUMMARY: N errors", racecheck with "RACECHECK SUMMARY: N hazards displayed (...)"
  summary=$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out" || true)
  if [ $rc = 0 ] && [ -n "$summary" ]; then record "$name" pass "$summary" $(( $(date +%s) - t0 )) "0 errors"
  elif grep -q 'Device not supported\|not supported on this platform' "$out"; then
    record "$name" skip "not available: compute-sanitizer refused the device: $(grep -m1 'not supported' "$out")" $(( $(date +%s) - t0 )) "0 errors"
  elif [ $rc = 124 ]; then record "$name" fail "timed out after $budget s" $(( $(date +%s) - t0 )) "0 errors"
  else record "$name" fail "exit $rc; ${summary:-no summary}: $(grep -m3 '=========.*\(Invalid\|Race\|Error\)' "$out" | tr '\n' ' ')" $(( $(date +%s) - t0 )) "0 errors"
  fi
}
sanitize memcheck 1
sanitize racecheck 0

# ---- the report ----
SECONDS_TOTAL=$(( $(date +%s) - STARTED ))
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
awk -v gpu="${GPU_NAME:-none}" -v commit="$COMMIT" -v date="$DATE" -v mode="$MODE" -v seconds="$SECONDS_TOTAL" \
  -v json="$OUT/gpu.json" -f "$HERE/report.awk" "$RECORDS" | tee -a "$LOG"
if [ $GPU = 1 ]; then
  slug=$(echo "$GPU_NAME" | sed 's/^NVIDIA //; s/[^A-Za-z0-9]\{1,\}/-/g' | tr 'A-Z' 'a-z')
  mkdir -p "$ROOT/bench/gpu-runs"
  cp "$OUT/gpu.json" "$ROOT/bench/gpu-runs/gpu-${DATE:0:10}-$slug.json"
  say "wrote $OUT/gpu.json and bench/gpu-runs/gpu-${DATE:0:10}-$slug.json (commit it with the change it measured)"
else
  say "wrote $OUT/gpu.json"
fi
grep -q '"status":"fail"' "$RECORDS" && exit 1
exit 0
