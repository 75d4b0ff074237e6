"""Batch road-distress detection on Spark (the FactorNet Faster R-CNN): images in from any storage, boxes out.

    spark-submit jobs/infer_detector.py --config conf/yarn.yaml --model models/detector --input hdfs:///images \
        --output hdfs:///out
    python jobs/infer_detector.py --model DIR --input DIR --output DIR     # local[*]

DIR for --model: an export directory made by `python -m model_export detector ...`. Same arguments, outputs
(detections/ with boxes and no masks, errors/, summary.json) and exit codes as jobs/infer_yolact.py (both are
pipelines/job_cli.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines import job_cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return job_cli.main(argv, family="detector", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
