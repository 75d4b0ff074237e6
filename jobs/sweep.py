"""Sweep the inference job over a grid of settings (partitions, executors, cores, task cpus, batch size, OpenVINO
streams/threads, precision, engine) and write sweep.csv, report.md and plots/*.png.

    python jobs/sweep.py                                   # conf/sweep.yaml -> reports/sweep/
    python jobs/sweep.py --config my_sweep.yaml --mode local --out reports/sweep-local

Every point is a separate run of jobs/infer_yolact.py in its own driver process (see pipelines/sweeps/).
Exit code: 0 when every point ran, 3 when some failed (their rows say why), 2 for a bad config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines.errors import report_error  # noqa: E402
from pipelines.job_config import REPO_ROOT, ConfigError  # noqa: E402
from pipelines.sweeps.config import load_sweep_config  # noqa: E402
from pipelines.sweeps.sweep import run_sweep  # noqa: E402

DEFAULT_CONFIG = REPO_ROOT / "conf" / "sweep.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="sweep YAML (default conf/sweep.yaml)")
    parser.add_argument("--out", dest="out_dir", help="output directory (overrides out_dir)")
    parser.add_argument("--mode", choices=["local", "standalone"], help="overrides mode")
    parser.add_argument("--repeats", type=int, help="runs per point (overrides repeats)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_sweep_config(args.config, {"out_dir": args.out_dir, "mode": args.mode, "repeats": args.repeats})
    except ConfigError as err:
        return report_error(err)
    rows, paths = run_sweep(config)
    print(f"sweep: {len(rows)} runs, {sum(row['status'] == 'ok' for row in rows)} ok -> {paths['report']}")
    failed = [row for row in rows if row["status"] == "failed"]
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
