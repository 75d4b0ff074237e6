#!/usr/bin/env bash
# Train the bundled default YOLACT (yolact_r18_small, 256x256, road-distress classes) on SYNTHETIC data and
# export it to samples/models/yolact_default/. Resumable: run it again after a kill and training continues from
# the newest checkpoint. Every step is a plain command (see docs/training.md).
#
#   scripts/train_default_models.sh              # generate data, train, export, bundle
#   PY=/path/to/python OUT=/tmp/x scripts/train_default_models.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-output/training/default}
BUNDLE=${BUNDLE:-samples/models/yolact_default}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$PY} SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}

# 1. 900 synthetic 640x480 images, seed 1 (train and val split from these; tests use other seeds).
if [ ! -f "$OUT/roads/annotations.json" ]; then
  $PY -m pipelines.datasets.synthetic_roads --out "$OUT/roads" --count 900 --seed 1 --size 640x480 --format coco
fi

# 2. Train: local strategy (1 process x 2 threads), 256x256 input, global batch 4, 2 epochs (404 steps),
#    mirror-only augmentation (the CPU budget allows ~1600 images: no time to learn through heavy augmentation).
$PY jobs/train_yolact.py --config conf/train_yolact.yaml --run-dir "$OUT/run" --epochs 2 \
  --set data.images="$OUT/roads/images" --set data.annotations="$OUT/roads/annotations.json" \
  --set data.prepared="$OUT/prepared" --set model.max_size=256 \
  --set train.global_batch=4 --set train.micro_batch=4 --set train.lr=0.0015 --set train.warmup_steps=50 \
  --set "train.lr_milestones=[0.75, 0.92]" --set checkpoint.every_steps=50 --set eval.max_images=60 \
  --set augment.photometric=false --set augment.sample_crop=false --set augment.expand=false \
  --set eval.early_stopping_patience=0 --set tracking.mlflow_uri="$OUT/mlruns"

# 3. Export the best checkpoint (val mask AP) with the export CLI; bundle the inference files only.
rm -rf "$OUT/export"
$PY -m model_export yolact --config yolact_r18_small --input-size 256 \
  --weights "$OUT/run/checkpoints/best.pt" --out "$OUT/export"
mkdir -p "$BUNDLE"
for f in manifest.json model.xml model.bin priors.npy parity.json; do cp "$OUT/export/$f" "$BUNDLE/$f"; done
# What the model is for, shown in every job summary and report (the manifest's optional "note").
$PY scripts/set_manifest_note.py "$BUNDLE/manifest.json" \
  "Road-distress YOLACT (pothole, crack, patch, puddle) trained only on SYNTHETIC top-down asphalt images " \
  "(pipelines.datasets.synthetic_roads, 640x480, 256x256 network input). It is meant for road surfaces like " \
  "those (make demo, samples/images/synthetic_road_*.jpg); on other photos (people, animals, objects) its " \
  "detections are meaningless. Cracks are found poorly (low recall)."
echo "bundled $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
