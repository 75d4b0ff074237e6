"""summary.json, the record of a job's last run at its output: written by the job, read by the next run (to warn of
changed output settings) and by the report and the evaluation (which model's rows are current). No Spark."""

from __future__ import annotations

import json
import logging

from pipelines.io.storage import Location

log = logging.getLogger(__name__)
SUMMARY_NAME = "summary.json"


def write_summary(output: Location, summary: dict) -> None:
    (output / SUMMARY_NAME).write_bytes_atomic((json.dumps(summary, indent=2, default=str) + "\n").encode())


def read_summary(output: Location) -> dict | None:
    """The summary.json the last run left at `output` (any store); None where there is none or it is unreadable
    (logged): a run rewrites it at its end, and a report without it reads every model's rows."""
    location = output / SUMMARY_NAME
    try:
        return json.loads(location.read_bytes()) if location.exists() else None
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable (%s); ignored, the next run rewrites it", location.uri, err)
        return None
