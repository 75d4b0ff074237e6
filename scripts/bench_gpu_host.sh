#!/usr/bin/env bash
# The figures that need a GPU host (one NVIDIA GPU, 16 cores), in one run of at most LIMIT seconds, on a host with
# python3 + torch (CUDA) and no project env or network: the wheels of scripts/gpu_host_wheels.sh in WHEELS.
# In order, each step only if the time it needs is left:
#   1. preflight: the executor function on the bundled model, 1 process (a missing module fails here, in seconds);
#   2. the executor function against benchmark_app at P = all cores: YOLACT-R50 550 (random init) bf16: unpinned,
#      with inference.pin_cores, with inference in the calling thread (--thread), and benchmark_app also as P
#      processes x 1 stream (the executors' layout);
#   3. the training step on the GPU against its model-only ceiling: yolact_r18_small 352 b64, bf16, CUDA graphs on
#      (scripts/bench_training_step.py);
#   4. the executor against benchmark_app, R50 550 f32; 5. the GPU training step of YOLACT-R50 550 b32;
#   6. the executor against benchmark_app, the bundled default model f32.
# Everything is logged to OUT/run.log (the reports' tables too); the reports' .json go to OUT/executor and
# OUT/training.
#
#   WHEELS=.whl OUT=/tmp/out LIMIT=540 scripts/bench_gpu_host.sh
set -u
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-reports/gpu_host}
LIMIT=${LIMIT:-540}
START=$(date +%s)
SITE=$(mktemp -d /tmp/sparkseg-site.XXXXXX)   # the packages, the reports before they are copied, the scratch
trap 'rm -rf "$SITE"' EXIT
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
log() { echo "=== $(date +%T) (+$(( $(date +%s) - START )) s) $*" | tee -a "$OUT/run.log"; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 -m zipfile -e "$WHEELS/openvino-pruned.zip" "$SITE" || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 3
mkdir -p "$SITE/bin"
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
printf '#!%s\nfrom openvino.tools.benchmark.main import main\nmain()\n' "$(command -v python3)" >"$SITE/bin/benchmark_app"
chmod +x "$SITE/bin/benchmark_app"
log machine
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread"
  grep -o -w 'amx_[a-z0-9]*\|avx512_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import openvino, torch, numpy, PIL, pyarrow; print('openvino', openvino.__version__, 'torch',
torch.__version__, 'numpy', numpy.__version__, 'Pillow', PIL.__version__, 'pyarrow', pyarrow.__version__)"
} >>"$OUT/run.log" 2>&1
EXECUTOR_ARGS=(--no-job --no-before --no-boxes-only --no-draft)

executor() {   # name, seconds it needs, bench_executor.py arguments...
  local name=$1 needs=$2
  shift 2
  [ "$(left)" -gt "$needs" ] || { log "skipped (time): executor $name"; return; }
  log "executor vs benchmark_app: $name, P = all cores"
  timeout -k 5 $(( $(left) - 5 )) python3 scripts/bench_executor.py "$@" "${EXECUTOR_ARGS[@]}" \
    --out "$SITE/executor_$name" >>"$OUT/run.log" 2>&1
  log "executor $name: exit $?"
  cat "$SITE/executor_$name/executor.md" >>"$OUT/run.log" 2>/dev/null
  mkdir -p "$OUT/executor" && cp "$SITE/executor_$name/executor.json" "$OUT/executor/$name.json" 2>/dev/null
}

training() {   # config:size:batch, seconds it needs
  [ "$(left)" -gt "$2" ] || { log "skipped (time): training step $1"; return; }
  log "training step on the GPU: $1 bf16, CUDA graphs on"
  timeout -k 5 $(( $(left) - 5 )) python3 scripts/bench_training.py --device cuda --steps 25 --warmup 5 \
    --images 192 --precisions bf16 --cuda-graphs on --models "$1" --data "$SITE/training-data" \
    --out "$SITE/training-$1" >>"$OUT/run.log" 2>&1
  log "training step $1: exit $?"
  mkdir -p "$OUT/training" && cp "$SITE/training-$1/training_gpu.json" "$OUT/training/${1%%:*}.json" 2>/dev/null
}

log "preflight: the executor function, bundled model, 1 process"
timeout -k 5 90 python3 scripts/bench_executor.py -P 1 --images 8 --rounds 1 --seconds 1 "${EXECUTOR_ARGS[@]}" \
  --no-pinned --no-process-ceiling --out "$SITE/preflight" --work-dir "$SITE/work" >>"$OUT/run.log" 2>&1 \
  || { log "preflight failed"; exit 1; }
log "export YOLACT-R50 550 (random init)"
timeout -k 5 150 python3 -c "
import sys; sys.path[:0] = ['scripts', '.']
import bench_executor as b
b.export('yolact', 'yolact_resnet50', b.R50_DIR, b.R50_EXPORT_GATES)" >>"$OUT/run.log" 2>&1
log "export: exit $?"
executor r50_bf16 120 --model work/bench/r50 --precisions bf16 --rounds 2 --seconds 10 --thread
training yolact_r18_small:352:64 120
executor r50_f32 120 --model work/bench/r50 --precisions f32 --rounds 2 --seconds 10 --no-pinned --no-process-ceiling
training yolact_resnet50:550:32 110
executor default_f32 60 --precisions f32 --rounds 1 --seconds 8 --no-pinned --no-process-ceiling
log done
