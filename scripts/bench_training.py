"""Benchmark the training strategies on this machine (not a test): images/s, epoch time, speedup T1/Tp and
efficiency speedup/p against `local`, each run through the real job path (Spark preparation, TorchDistributor,
gloo). Writes OUT/training_report.json and OUT/training_report.md.

    .venv/bin/python scripts/bench_training.py                      # 4 strategies x 2 rounds, 256x256, batch 8
    .venv/bin/python scripts/bench_training.py --steps 6 --size 128 --out output/bench

Strategies (processes x threads): local 1x2; ddp 2x1; pipeline 2 stages, 4 micro-batches (2x1); hybrid
2 replicas x 2 stages (4x1, oversubscribed on a 2-core machine: reported as measured).

With --device cuda|cpu it measures the training step on one device instead, without Spark or Java: full step
(real shards, augmentation on) vs the model-only ceiling, per model and precision (scripts/bench_training_step.py,
see its --help).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench.machine import cpu_isa  # noqa: E402

STRATEGIES = [  # name, overrides
    ("local", {"distributed.strategy": "local", "distributed.num_processes": 1, "distributed.threads_per_process": 2}),
    ("ddp", {"distributed.strategy": "ddp", "distributed.num_processes": 2, "distributed.threads_per_process": 1}),
    (
        "pipeline",
        {
            "distributed.strategy": "pipeline",
            "distributed.num_processes": 2,
            "distributed.pipeline_stages": 2,
            "distributed.threads_per_process": 1,
        },
    ),
    (
        "hybrid",
        {
            "distributed.strategy": "hybrid",
            "distributed.num_processes": 4,
            "distributed.pipeline_stages": 2,
            "distributed.threads_per_process": 1,
        },
    ),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "output" / "bench"), help="report directory")
    parser.add_argument("--size", type=int, default=256, help="network input side")
    parser.add_argument("--images", type=int, default=48, help="synthetic training images")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per strategy (plus 2 warm-up steps)")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2, help="GPipe micro-batch (8/2 = 4 micro-batches)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds over all strategies (interleaved); each strategy's best round is reported, "
        "which damps the load of other jobs on a shared machine",
    )
    parser.add_argument("--only", nargs="*", help="strategy names to run")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        import bench_training_step  # the training step on one device, no Spark (scripts/bench_training_step.py)

        return bench_training_step.main(argv)
    args = parse_args(argv)
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.spark.spark_session import local_session

    out = Path(args.out)
    data = out / "bench_roads"
    if not (data / "annotations.json").exists():
        generate_road_dataset(data, args.images, 4242, RoadSceneConfig(formats=("coco",)))
    spark = local_session("sparkseg-bench-training", "local[2]")
    runs = []
    try:
        for round_number in range(args.rounds):
            for name, overrides in STRATEGIES:
                if args.only and name not in args.only:
                    continue
                runs.append(run_one(args, out, data, name, overrides, round_number, spark))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        spark.stop()
    results = best_rounds(runs)
    report = {
        "machine": machine(),
        "size": args.size,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "timed_steps": args.steps,
        "rounds": args.rounds,
        "results": results,
        "all_runs": runs,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "training_report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def run_one(args, out: Path, data: Path, name: str, overrides: dict, round_number: int, spark) -> dict:
    from pipelines.training.config import load_train_config
    from pipelines.training.launcher import run_training

    run_dir = out / "runs" / f"{name}-{round_number}"
    settings = {
        "run_dir": str(run_dir),
        "data.images": str(data / "images"),
        "data.annotations": str(data / "annotations.json"),
        "data.prepared": str(out / "prepared"),
        "data.val_fraction": 0.0,
        "model.max_size": args.size,
        "train.epochs": 100,
        "train.max_steps": args.steps + 2,
        "train.global_batch": args.global_batch,
        "train.micro_batch": args.micro_batch,
        "checkpoint.every_steps": 0,
        "checkpoint.resume": False,
        "eval.every_epochs": 0,
        "tracking.mlflow_uri": str(out / "mlruns"),
        "tracking.plots": False,
        "tracking.progress_bar": False,
        "tracking.run_name": f"bench-{name}-{round_number}",
        "tracking.baseline": str(out / "runs" / f"local-{round_number}" / "summary.json") if name != "local" else None,
        **overrides,
    }
    started = time.time()
    summary = run_training(spark, load_train_config(None, settings))
    return {
        "strategy": name,
        "round": round_number,
        "processes": summary["world"],
        "stages": summary["stages"],
        "threads_per_process": overrides["distributed.threads_per_process"],
        "images_per_second": summary["speed"]["images_per_second"],
        "epoch_seconds_mean": summary["speed"]["epoch_seconds_mean"],
        "wall_seconds": round(time.time() - started, 1),
    }


def best_rounds(runs: list[dict]) -> list[dict]:
    """Per strategy its fastest round; speedup T1/Tp = images/s over local's, efficiency = speedup / processes."""
    best: dict[str, dict] = {}
    for run in runs:
        if run["strategy"] not in best or run["images_per_second"] > best[run["strategy"]]["images_per_second"]:
            best[run["strategy"]] = dict(run)
    base = best.get("local", {}).get("images_per_second")
    for run in best.values():
        if base:
            run["speedup"] = round(run["images_per_second"] / base, 3)
            run["efficiency"] = round(run["speedup"] / run["processes"], 3)
    return list(best.values())


def machine() -> dict:
    import os
    import platform

    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu, isa = cpu_isa()
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "instruction_sets": isa,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "load_average_at_end": [round(v, 2) for v in load] if load else None,
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Training strategies: yolact_r18_small at {report['size']}x{report['size']}, global batch "
        f"{report['global_batch']}, micro-batch {report['micro_batch']}",
        "",
        f"Machine: {report['machine']}",
        "",
        f"Best of {report['rounds']} interleaved rounds per strategy; {report['timed_steps']} timed steps each.",
        "",
        "| strategy | processes x threads | stages | images/s | epoch s | speedup T1/Tp | efficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['strategy']} | {r['processes']} x {r['threads_per_process']} | {r['stages']} | "
            f"{r['images_per_second']} | {r['epoch_seconds_mean']} | {r.get('speedup')} | "
            f"{r.get('efficiency')} |"
        )
    lines += [
        "",
        "All runs (images/s): "
        + ", ".join(f"{r['strategy']}#{r['round']} {r['images_per_second']}" for r in report["all_runs"]),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
