"""Batch YOLACT inference on Spark: images in from any storage, detections and masks out.

    spark-submit jobs/infer_yolact.py --config conf/yarn.yaml --input hdfs:///images --output hdfs:///out
    python jobs/infer_yolact.py            # the embedded default: local[*] on samples/images -> ./output

Arguments, exit codes and the summary are shared with the other job scripts (pipelines/job_cli.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines import job_cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return job_cli.main(argv, family="yolact", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
