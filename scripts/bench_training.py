"""Benchmark the training strategies on this machine (not a test): images/s, epoch time, speedup T1/Tp and
efficiency speedup/p against `local`, each run through the real job path (Spark preparation, TorchDistributor,
gloo). Writes OUT/training_report.json and OUT/training_report.md.

    .venv/bin/python scripts/bench_training.py                      # 4 strategies, 256x256, global batch 8
    .venv/bin/python scripts/bench_training.py --steps 6 --size 128 --out output/bench

Strategies (processes x threads): local 1x2; ddp 2x1; pipeline 2 stages, 4 micro-batches (2x1); hybrid
2 replicas x 2 stages (4x1, oversubscribed on a 2-core machine: reported as measured).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STRATEGIES = [  # name, overrides
    ("local", {"distributed.strategy": "local", "distributed.num_processes": 1, "distributed.threads_per_process": 2}),
    ("ddp", {"distributed.strategy": "ddp", "distributed.num_processes": 2, "distributed.threads_per_process": 1}),
    ("pipeline", {"distributed.strategy": "pipeline", "distributed.num_processes": 2,
                  "distributed.pipeline_stages": 2, "distributed.threads_per_process": 1}),
    ("hybrid", {"distributed.strategy": "hybrid", "distributed.num_processes": 4, "distributed.pipeline_stages": 2,
                "distributed.threads_per_process": 1}),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "output" / "bench"), help="report directory")
    parser.add_argument("--size", type=int, default=256, help="network input side")
    parser.add_argument("--images", type=int, default=48, help="synthetic training images")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per strategy (plus 2 warm-up steps)")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2, help="GPipe micro-batch (8/2 = 4 micro-batches)")
    parser.add_argument("--only", nargs="*", help="strategy names to run")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.spark_session import local_session
    from pipelines.training.config import load_train_config
    from pipelines.training.launcher import run_training

    out = Path(args.out)
    data = out / "bench_roads"
    if not (data / "annotations.json").exists():
        generate_road_dataset(data, args.images, 4242, RoadSceneConfig(formats=("coco",)))
    spark = local_session("sparkseg-bench-training", "local[2]")
    results = []
    try:
        for name, overrides in STRATEGIES:
            if args.only and name not in args.only:
                continue
            run_dir = out / "runs" / name
            settings = {
                "run_dir": str(run_dir), "data.images": str(data / "images"),
                "data.annotations": str(data / "annotations.json"), "data.prepared": str(out / "prepared"),
                "data.val_fraction": 0.0, "model.max_size": args.size, "train.epochs": 100,
                "train.max_steps": args.steps + 2, "train.global_batch": args.global_batch,
                "train.micro_batch": args.micro_batch, "checkpoint.every_steps": 0, "checkpoint.resume": False,
                "eval.every_epochs": 0, "tracking.mlflow_uri": str(out / "mlruns"), "tracking.plots": False,
                "tracking.progress_bar": False, "tracking.run_name": f"bench-{name}",
                "tracking.baseline": str(out / "runs" / "local" / "summary.json") if name != "local" else None,
                **overrides,
            }
            started = time.time()
            summary = run_training(spark, load_train_config(None, settings))
            speed = summary["speed"]
            results.append({"strategy": name, "processes": summary["world"], "stages": summary["stages"],
                            "threads_per_process": overrides["distributed.threads_per_process"],
                            "images_per_second": speed["images_per_second"],
                            "step_seconds": round(args.global_batch / speed["images_per_second"], 3),
                            "speedup": speed.get("speedup", 1.0 if name == "local" else None),
                            "efficiency": speed.get("efficiency", 1.0 if name == "local" else None),
                            "wall_seconds": round(time.time() - started, 1)})
            print(json.dumps(results[-1]), flush=True)
    finally:
        spark.stop()
    report = {"machine": machine(), "size": args.size, "global_batch": args.global_batch,
              "micro_batch": args.micro_batch, "timed_steps": args.steps, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "training_report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def machine() -> dict:
    import os
    import platform

    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "load_average_at_end": [round(v, 2) for v in load] if load else None}


def markdown(report: dict) -> str:
    lines = [f"# Training strategies: yolact_r18_small at {report['size']}x{report['size']}, global batch "
             f"{report['global_batch']}, micro-batch {report['micro_batch']}",
             "", f"Machine: {report['machine']}", "",
             "| strategy | processes x threads | stages | images/s | s/step | speedup T1/Tp | efficiency |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['strategy']} | {r['processes']} x {r['threads_per_process']} | {r['stages']} | "
                     f"{r['images_per_second']} | {r['step_seconds']} | {r['speedup']} | {r['efficiency']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
