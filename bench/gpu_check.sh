#!/usr/bin/env bash
# bench/gpu_check.sh — the one prepared GPU check of both trainers. Under 8 minutes in all on one
# H200: every step has its own time limit and the script goes on after a failed or timed-out step;
# it exits 1 if any step failed or timed out.
#
#   bash bench/gpu_check.sh                 # results on stdout and in $OUT/gpu_check.txt
#                                           # ($OUT defaults to a new temporary directory)
#   bash bench/gpu_check.sh --smoke         # the same steps on the CPU at tiny sizes (tests/test_gpu_check.py
#                                           # runs it, so a moved module or a refused config fails CI, not a GPU)
# Steps (limits in seconds, GPU):
#   1 environment (10)          nvidia-smi, torch / CUDA versions, the device name
#   2 CUDA tests (60)           tests/test_trainer_torch_cuda.py: fp16 skips = CPU, bf16, exact resume, MFU key
#   3 fp16 training (35)        configs/seed_binary.toml on CUDA (float16 autocast + GradScaler state machine)
#   4 bf16 training (35)        the same with precision.dtype = "bfloat16" (no loss scaling)
#   5 GPT-2 small, eager (60)   configs/gpt2_small.toml, 30 updates, bf16, no checkpoints
#   6 GPT-2 small, compiled (100)  the same with torch.compile, 40 updates
#   7 summary (10)              median tokens/s and MFU (vs the device's dense bf16 peak) after the
#                               first 10 updates of steps 5 and 6; the fp16 / bf16 runs' skips and accuracy
#   8 trainer vs minimal loop (130)  bench/gpu_throughput.py: GPT-2 small compiled, the trainer against a
#                               hand-written loop (nanoGPT's), tokens/s, MFU and their ratio
#   9 optimizer step (30)       bench/optimizer_step.py on CUDA: twinstep's torch optimizers / bare torch.optim
#  10 JAX trainer (100)         bench/gpu_jax.py: GPT-2 small tokens/s and MFU, step / bare optax
#                               (prints SKIPPED where jaxlib has no CUDA: `pip install -U "jax[cuda13]"`)
set -u -o pipefail
cd "$(dirname "$0")/.."
SMOKE=0
case "${1:-}" in
  --smoke) SMOKE=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--smoke]" >&2; exit 2 ;;
esac
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
FAILED=()

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
  [ "$rc" -eq 0 ] || FAILED+=("$name")
}

if [ "$SMOKE" -eq 1 ]; then  # the same steps on the CPU, tiny: what they import and the configs they run
  DEV=cpu LIMIT=120 WARM=2 EAGER=4 COMPILED=4 SEED_UPDATES=4
  TINY=(--set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.block_size=32
        --set model.vocab_size=128 --set data.batch_size=2 --set accumulation.steps=2 --set schedule.warmup_steps=1)
  THROUGHPUT=(--device cpu --updates 4 --skip 2 "${TINY[@]}" --set run.compile=false)
  OPTIM=(--device cpu --skip-jax --repeats 1 --steps 1 --optimizers adamw,sgd)
  JAXARGS=(--device cpu --updates 3 --skip 1 --steps 1 --repeats 1 "${TINY[@]}")
else
  DEV=cuda LIMIT=0 WARM=10 EAGER=30 COMPILED=40 SEED_UPDATES=0
  TINY=(--set schedule.warmup_steps=10)  # gpt2_small's 50 warm-up updates are longer than these runs
  THROUGHPUT=(--device cuda --updates 40 --skip 10 "${TINY[@]}")
  OPTIM=(--device cuda --skip-jax --repeats 5)
  JAXARGS=(--updates 20 --skip 5 --steps 5 --repeats 2 "${TINY[@]}")
fi
limit() { [ "$LIMIT" -gt 0 ] && echo "$LIMIT" || echo "$1"; }  # the smoke's steps share one generous limit
SEED_SET=(--set "run.device=\"$DEV\"")
[ "$SEED_UPDATES" -gt 0 ] && SEED_SET+=(--set "run.max_updates=$SEED_UPDATES" --set run.eval_every=2)

TRAIN=("$PY" -m conformance train --backend torch --progress lines)
GPT2=(configs/gpt2_small.toml --set 'checkpoint.every=0' --set 'checkpoint.at_end=false' --set 'run.eval_every=0'
      --set "run.device=\"$DEV\"" "${TINY[@]}")

step "1 environment" "$(limit 10)" bash -c "(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  || echo 'nvidia-smi: not available'); $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", \
  torch.version.cuda, \"available\", torch.cuda.is_available(), torch.cuda.get_device_name() if \
  torch.cuda.is_available() else \"-\")'"
step "2 CUDA tests" "$(limit 60)" "$PY" -m pytest tests/test_trainer_torch_cuda.py -q -x -p no:cacheprovider -n 0
step "3 fp16 training (seed 000 loop)" "$(limit 35)" "${TRAIN[@]}" configs/seed_binary.toml --out "$RUNS/fp16" \
  "${SEED_SET[@]}"
step "4 bf16 training" "$(limit 35)" "${TRAIN[@]}" configs/seed_binary.toml --out "$RUNS/bf16" "${SEED_SET[@]}" \
  --set 'precision.dtype="bfloat16"' --set 'precision.loss_scale="none"'
step "5 GPT-2 small eager bf16" "$(limit 60)" "${TRAIN[@]}" "${GPT2[@]}" --out "$RUNS/gpt2_eager" \
  --set "run.max_updates=$EAGER" --set 'run.compile=false'
step "6 GPT-2 small compiled bf16" "$(limit 100)" "${TRAIN[@]}" "${GPT2[@]}" --out "$RUNS/gpt2_compiled" \
  --set "run.max_updates=$COMPILED" --set 'run.compile=true'
step "7 summary" "$(limit 10)" "$PY" - "$RUNS" "$WARM" <<'EOF'
import statistics, sys
from pathlib import Path
from conformance.run.metrics import evals, read_metrics, updates
runs, warm = Path(sys.argv[1]), int(sys.argv[2])
failed = False
for name in ("fp16", "bf16"):
    f = runs / name / "metrics.jsonl"
    if not f.exists():
        print(f"{name}: no metrics (step failed)")
        failed = True
    else:
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
        failed = True
        continue
    ups = updates(read_metrics(f))[warm:]
    if not ups:
        print(f"{name}: no update after the first {warm}")
        failed = True
        continue
    tps = statistics.median(r["tokens_per_s"] for r in ups)
    mfu = statistics.median(r.get("mfu") or float("nan") for r in ups)
    mem = max(r["peak_memory_bytes"] for r in ups) / 2**30
    print(f"{name}: median {tps:,.0f} tokens/s, MFU {mfu:.1%} of the dense bf16 peak, peak memory {mem:.1f} GiB, "
          f"last loss {ups[-1]['loss']:.4f} ({len(ups)} updates after warm-up)")
sys.exit(1 if failed else 0)
EOF
step "8 trainer vs minimal loop" "$(limit 130)" "$PY" bench/gpu_throughput.py "${THROUGHPUT[@]}"
step "9 optimizer step" "$(limit 30)" "$PY" bench/optimizer_step.py "${OPTIM[@]}"
step "10 JAX trainer" "$(limit 100)" "$PY" bench/gpu_jax.py "${JAXARGS[@]}"
log ""
if [ "${#FAILED[@]}" -gt 0 ]; then
  log "gpu_check: ${#FAILED[@]} step(s) failed: ${FAILED[*]}; done in $(( $(date +%s) - T0 ))s; results in $RESULTS"
  exit 1
fi
log "gpu_check: every step passed in $(( $(date +%s) - T0 ))s; results in $RESULTS"
