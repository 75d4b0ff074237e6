#!/usr/bin/env bash
# Train the bundled detector (factornet_small FactorNet Faster R-CNN, 320x320, road-distress classes) on SYNTHETIC
# data, export it to samples/models/detector_default/ and measure its box AP on a fresh synthetic val split.
# Training is the Spark-free single-process path (python -m pipelines.training.detector_trainer: the same session,
# step and augmentation as jobs/train_detector.py's ranks, reading the COCO folder directly), so it runs on a GPU
# machine without Java. Resumable: run it again after a kill and training continues from the newest checkpoint.
#
#   scripts/train_default_detector.sh                      # everything, on CUDA when visible (else CPU: slow)
#   scripts/train_default_detector.sh --device cuda --only train     # data + training only (a GPU box)
#   scripts/train_default_detector.sh --skip-train         # export, bundle, evaluate an existing run
#   PY=/path/to/python OUT=/tmp/x scripts/train_default_detector.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-output/training/detector_default}
BUNDLE=${BUNDLE:-samples/models/detector_default}
DEVICE=auto
ONLY=all
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --skip-train) ONLY=bundle; shift ;;
    *) echo "usage: $0 [--device auto|cpu|cuda] [--only train|bundle] [--skip-train]" >&2; exit 2 ;;
  esac
done
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$PY} SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}

if [ "$ONLY" != bundle ]; then
  # 1. 1000 synthetic 640x480 images, seed 2 (the YOLACT bundle uses 1, the val split below 3, tests others).
  if [ ! -f "$OUT/roads/annotations.json" ]; then
    $PY -m pipelines.datasets.synthetic_roads --out "$OUT/roads" --count 1000 --seed 2 --size 640x480 --format coco
  fi
  # 2. Train: 1 process, global batch 16 (one micro-batch), AdamW 2e-3, 1500 steps (24 epochs), mirror only.
  $PY -m pipelines.training.detector_trainer --config conf/train_detector.yaml --device "$DEVICE" \
    --set run_dir="$OUT/run" --set data.images="$OUT/roads/images" --set data.annotations="$OUT/roads/annotations.json" \
    --set distributed.threads_per_process=8 --set train.epochs=100 --set train.max_steps=1500 \
    --set train.global_batch=16 --set train.micro_batch=16 --set train.lr=0.002 --set train.warmup_steps=100 \
    --set "train.lr_milestones=[0.7, 0.9]" --set checkpoint.every_steps=100 --set checkpoint.keep_last=1
fi
[ "$ONLY" = train ] && exit 0

# 3. Export the last checkpoint with the export CLI; bundle the inference files only.
CKPT=$(ls "$OUT"/run/checkpoints/step_*.pt | tail -1)
rm -rf "$OUT/export"
$PY -m model_export detector --config factornet_small --weights "$CKPT" --out "$OUT/export"
mkdir -p "$BUNDLE"
for f in manifest.json model.xml model.bin parity.json; do cp "$OUT/export/$f" "$BUNDLE/$f"; done
$PY scripts/set_manifest_note.py "$BUNDLE/manifest.json" \
  "Road-distress detector (FactorNet Faster R-CNN, factornet_small: pothole, crack, patch, puddle boxes) " \
  "trained only on SYNTHETIC top-down asphalt images (pipelines.datasets.synthetic_roads, 640x480, " \
  "320x320 network input). Meant for road surfaces like those; on other photos its detections are " \
  "meaningless. Cracks (thin lines) are found poorly."

# 4. Box AP on a fresh val split it never saw (seed 3), through the Spark job and pycocotools.
if [ ! -f "$OUT/val/annotations.json" ]; then
  $PY -m pipelines.datasets.synthetic_roads --out "$OUT/val" --count 100 --seed 3 --size 640x480 --format coco
fi
rm -rf "$OUT/val_output"
$PY jobs/infer_detector.py --model "$BUNDLE" --input "$OUT/val/images" --output "$OUT/val_output"
$PY -m pipelines.report.evaluate --output "$OUT/val_output" --annotations "$OUT/val/annotations.json" \
  --score-threshold 0.05 --group blobs=pothole,patch,puddle
echo "bundled $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE; evaluation: $OUT/val_output/evaluation.json"
