#!/usr/bin/env bash
# bench/gpu_check.sh — the one prepared GPU check of the torch trainer (issue 6). Under 10 minutes in
# all: every step has its own time limit and the script goes on after a failed or timed-out step.
#
#   bash bench/gpu_check.sh                 # results on stdout and in $OUT/gpu_check.txt
#                                           # ($OUT defaults to a new temporary directory)
# Steps (limits in seconds):
#   1 environment (10)          nvidia-smi, torch / CUDA versions, the device name
#   2 CUDA tests (90)           tests/test_trainer_torch_cuda.py: fp16 skips = CPU, bf16, exact resume, MFU key
#   3 fp16 training (45)        configs/seed_binary.toml on CUDA (float16 autocast + GradScaler state machine)
#   4 bf16 training (45)        the same with precision.dtype = "bfloat16" (no loss scaling)
#   5 GPT-2 small, eager (90)   configs/gpt2_small.toml, 30 updates, bf16, no checkpoints
#   6 GPT-2 small, compiled (150)  the same with torch.compile, 60 updates
#   7 summary (10)              median tokens/s and MFU (vs the H200's dense bf16 peak, 989 TFLOP/s)
#                               over the updates after the first 10 of steps 5 and 6
#   8 trainer overhead (60)     bench/trainer_overhead.py on CUDA: trainer / seed loop for mlp and gpt
#   9 optimizer step (45)       bench/optimizer_step.py on CUDA: twinstep's torch optimizers / bare torch.optim
#  10 JAX trainer (45)          bench/gpu_jax.py: GPT-2 small tokens/s and MFU, step / bare optax
#                               (prints SKIPPED where jaxlib has no CUDA: `pip install -U "jax[cuda13]"`)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUTDIR"
RESULTS="$OUTDIR/gpu_check.txt"
RUNS="$OUTDIR/runs"
rm -rf "$RUNS" && mkdir -p "$RUNS"
: > "$RESULTS"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
PY="${PYTHON:-python}"
export CUBLAS_WORKSPACE_CONFIG=":4096:8"   # deterministic cuBLAS: must be set before CUDA starts
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
T0=$(date +%s)

log() { echo "$*" | tee -a "$RESULTS"; }

step() {  # step NAME LIMIT_S COMMAND...: run with a limit, keep the last lines on screen, all in the file
  local name=$1 limit=$2 start rc
  shift 2
  log ""
  log "== $name (limit ${limit}s, $(( $(date +%s) - T0 ))s elapsed)"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >> "$RESULTS.part" 2>&1
  rc=$?
  tail -n 25 "$RESULTS.part" | tee -a "$RESULTS"
  rm -f "$RESULTS.part"
  [ "$rc" -eq 124 ] && log "-- $name: TIMED OUT after ${limit}s" || log "-- $name: exit $rc in $(( $(date +%s) - start ))s"
}

TRAIN=("$PY" -m conformance train --backend torch --progress lines)
GPT2=(configs/gpt2_small.toml --set 'checkpoint.every=0' --set 'checkpoint.at_end=false' --set 'run.eval_every=0')

step "1 environment" 10 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", \
  torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else \"-\")'"
step "2 CUDA tests" 90 "$PY" -m pytest tests/test_trainer_torch_cuda.py -q -x -p no:cacheprovider
step "3 fp16 training (seed 000 loop)" 45 "${TRAIN[@]}" configs/seed_binary.toml --out "$RUNS/fp16" \
  --set 'run.device="cuda"'
step "4 bf16 training" 45 "${TRAIN[@]}" configs/seed_binary.toml --out "$RUNS/bf16" \
  --set 'run.device="cuda"' --set 'precision.dtype="bfloat16"' --set 'precision.loss_scale="none"'
step "5 GPT-2 small eager bf16" 90 "${TRAIN[@]}" "${GPT2[@]}" --out "$RUNS/gpt2_eager" \
  --set 'run.max_updates=30' --set 'run.compile=false'
step "6 GPT-2 small compiled bf16" 150 "${TRAIN[@]}" "${GPT2[@]}" --out "$RUNS/gpt2_compiled" \
  --set 'run.max_updates=60' --set 'run.compile=true'
step "7 summary" 10 "$PY" - "$RUNS" <<'EOF'
import json, statistics, sys
from pathlib import Path
from conformance.metrics import evals, read_metrics, updates
runs = Path(sys.argv[1])
for name in ("fp16", "bf16"):
    f = runs / name / "metrics.jsonl"
    if f.exists():
        recs = read_metrics(f)
        ups, evs = updates(recs), evals(recs)
        skipped = sum(r["skipped"] for r in ups)
        last = evs[-1] if evs else {}
        print(f"{name}: {len(ups)} updates, {skipped} skipped, final loss scale {ups[-1]['loss_scale']}, "
              f"val_loss {last.get('val_loss')}, val_accuracy {last.get('val_accuracy')}")
for name in ("gpt2_eager", "gpt2_compiled"):
    f = runs / name / "metrics.jsonl"
    if not f.exists():
        print(f"{name}: no metrics (step failed)")
        continue
    ups = updates(read_metrics(f))[10:]
    if not ups:
        print(f"{name}: fewer than 11 updates")
        continue
    tps = statistics.median(r["tokens_per_s"] for r in ups)
    mfu = statistics.median(r.get("mfu") or float("nan") for r in ups)
    mem = max(r["peak_memory_bytes"] for r in ups) / 2**30
    print(f"{name}: median {tps:,.0f} tokens/s, MFU {mfu:.1%} of the dense bf16 peak, peak memory {mem:.1f} GiB, "
          f"last loss {ups[-1]['loss']:.4f} ({len(ups)} updates after warm-up)")
EOF
step "8 trainer overhead on CUDA" 60 "$PY" bench/trainer_overhead.py --device cuda --dtype bfloat16 \
  --models mlp,gpt --updates 100 --repeats 2 --processes 0 --threads 4
step "9 optimizer step on CUDA" 45 "$PY" bench/optimizer_step.py --device cuda --skip-jax --repeats 5
step "10 JAX trainer on the GPU" 45 "$PY" bench/gpu_jax.py --updates 20
log ""
log "gpu_check: done in $(( $(date +%s) - T0 ))s; results in $RESULTS"
