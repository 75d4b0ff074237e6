"""Benchmark the training input workers' per-image work (not a test): ``batches.make_micro_batch`` in its workers'
form (uint8 images, colour draws deferred, targets packed at the loss's mask sizes), the current code against the
previous one (tests/reference_micro_batch.py: expand canvas, crop, mirror and float resize of full-size masks),
alternating in one process, on the same micro-batches; the outputs are checked equal, tensor by tensor (the masks but
for pixels at the threshold: see assert_equal). Then where the current code spends its time (cProfile's top
functions). Writes OUT/loader.md and OUT/loader.json.

    .venv/bin/python scripts/bench_loader.py                       # r18_small 352 and R50 550, expand off and on
    .venv/bin/python scripts/bench_loader.py --images 32 --rounds 3 --models yolact_r18_small:352

The data: synthetic road images (pipelines.datasets.synthetic_roads, 640x480, 1-6 instances each, seed 4242: the
images scripts/bench_training_step.py trains on) as prepared rows in memory (pipelines.training.shard_rows).
One torch thread, as in a loader worker (the float resize kernel torch picks depends on the thread count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench.machine import cpu_isa, isa_text  # noqa: E402

DEFAULT_MODELS = "yolact_r18_small:352,yolact_resnet50:550"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="config:input_size, comma-separated")
    parser.add_argument("--images", type=int, default=64, help="synthetic 640x480 images")
    parser.add_argument("--max-instances", type=int, default=6, help="instances per image at most (at least 1)")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2, help="epochs (augmentation draws) per round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="alternating rounds (previous, current); the best and the median round are reported",
    )
    parser.add_argument("--expand", default="off,on", help="augment.expand settings to measure")
    parser.add_argument("--out", default=str(REPO / "reports"), help="report directory")
    return parser.parse_args(argv)


def make_rows(count: int, max_instances: int) -> dict[int, dict]:
    """Prepared rows (shards.ShardIndex.read's form) of `count` synthetic images, in memory."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.training.shard_rows import image_rows

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        root = Path(tmp)
        dataset = generate_road_dataset(
            root, count, 4242, RoadSceneConfig(max_instances=max_instances, formats=("coco",))
        )
        names = [c.name for c in dataset.categories]
        class_of = {c.id: names.index(c.name) for c in dataset.categories}
        return {
            i: {
                "image_id": r[0],
                "file_name": r[1],
                "width": r[4],
                "height": r[5],
                "image": (root / "images" / r[1]).read_bytes(),
                "labels": r[6],
                "boxes": r[7],
                "rles": r[8],
            }
            for i, r in enumerate(image_rows(dataset, "train", class_of, 1))
        }


def model_spec(name: str, size: int):
    """(InputSpec, mask_sizes) as TrainingSession makes them: the model's proto size and its P3 size."""
    from model_export.models.yolact import Yolact, get_config
    from pipelines.training.batches import InputSpec

    model = Yolact(get_config(name, max_size=size))
    spec = InputSpec(model.cfg.max_size, model.cfg.mean, model.cfg.std)
    return spec, [tuple(model.proto_size()), tuple(model.feature_map_sizes()[0])]


def assert_equal(a, b) -> None:
    """Two packed micro-batches are equal, tensor by tensor; the masks but for pixels at the threshold (at most 1 in
    500: the previous code's come from torch's resize, whose rounding depends on the size and instruction set;
    tests/test_training_augment_speed_equal.py's TIES_PER_PIXEL)."""
    ta, tb = a.targets, b.targets
    checks = {
        "images": (a.images, b.images),
        "colour": (a.colour, b.colour),
        "boxes": (ta.boxes, tb.boxes),
        "labels": (ta.labels, tb.labels),
        "valid": (ta.valid, tb.valid),
    }
    checks.update({f"masks {size}": (ta.small_masks[size], tb.small_masks.get(size)) for size in ta.small_masks})
    for name, (x, y) in checks.items():
        ties = x.numel() / 500 if name.startswith("masks") else 0
        if y is None or x.dtype != y.dtype or x.shape != y.shape or int((x != y).sum()) > ties:
            raise AssertionError(f"micro-batch {a.indices}: {name} differ")
    if ta.seeds != tb.seeds or set(ta.small_masks) != set(tb.small_masks):
        raise AssertionError(f"micro-batch {a.indices}: seeds or mask sizes differ")


def total_times(rows, batches, spec, cfg, mask_sizes, args) -> dict:
    """ms per image of the previous and the current make_micro_batch, alternating round by round."""
    import torch

    from pipelines.training.batches import make_micro_batch
    from tests import reference_micro_batch as reference

    flows = {"previous": reference.make_micro_batch, "current": make_micro_batch}
    for indices in batches:  # warm-up, and the outputs checked equal
        current = make_micro_batch(rows, indices, spec, cfg, 0, 0, mask_sizes)
        reference.make_micro_batch(rows, indices, spec, cfg, 0, 0, mask_sizes)
        torch.set_num_threads(2)  # the previous code's values with torch's generic resize kernel (resize.py)
        previous = reference.make_micro_batch(rows, indices, spec, cfg, 0, 0, mask_sizes)
        torch.set_num_threads(1)
        assert_equal(current, previous)
    times = defaultdict(list)
    images = sum(len(b) for b in batches) * args.epochs
    for _ in range(args.rounds):
        for name, flow in flows.items():
            started = time.perf_counter()
            for epoch in range(1, args.epochs + 1):
                for indices in batches:
                    flow(rows, indices, spec, cfg, 0, epoch, mask_sizes)
            times[name].append((time.perf_counter() - started) / images * 1000)
    return {
        name: {"best_ms": round(min(t), 3), "median_ms": round(statistics.median(t), 3)} for name, t in times.items()
    }


def profile_split(rows, batches, spec, cfg, mask_sizes, top: int = 10) -> dict:
    """Where the current make_micro_batch spends its time: the functions with the most own time (cProfile, one
    epoch of draws), ms per image."""
    import cProfile
    import pstats

    from pipelines.training.batches import make_micro_batch

    profiler = cProfile.Profile()
    profiler.enable()
    for indices in batches:
        make_micro_batch(rows, indices, spec, cfg, 0, 1, mask_sizes)
    profiler.disable()
    images = sum(len(b) for b in batches)
    stats = pstats.Stats(profiler).stats
    own = sorted(((value[2], f"{Path(key[0]).name}:{key[1]} {key[2]}") for key, value in stats.items()), reverse=True)
    return {name: round(seconds * 1000 / images, 3) for seconds, name in own[:top]}


def object_counts(rows, batches, spec, cfg) -> dict:
    """Objects per image in the rows, and kept after the augmentation (mean over the measured epochs)."""
    import numpy as np

    from pipelines.training.batches import make_micro_batch

    kept = [int(make_micro_batch(rows, indices, spec, cfg, 0, 1, [(8, 8)]).targets.valid.sum()) for indices in batches]
    return {
        "objects_per_image": round(float(np.mean([len(r["labels"]) for r in rows.values()])), 2),
        "kept_per_image": round(sum(kept) / sum(len(b) for b in batches), 2),
    }


def machine() -> dict:
    import torch

    model, isa = cpu_isa()
    return {
        "cpu": model,
        "cpu_isa": isa,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }


def write_report(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "loader.json").write_text(json.dumps(report, indent=2))
    m = report["machine"]
    lines = [
        "# Loader workers: make_micro_batch per image, previous vs current",
        "",
        f"CPU: {m['cpu']}, {m['cpus']} cores, {isa_text(m['cpu_isa'])}; torch {m['torch']} "
        f"(CPU capability {m['torch_cpu_capability']}), {m['torch_threads']} thread (as a loader worker).",
        f"Data: {report['images']} synthetic 640x480 road images (JPEG q90), micro-batches of "
        f"{report['micro_batch']}, {report['epochs']} epochs of draws per round, {report['rounds']} alternating "
        "rounds; the outputs of both checked equal, tensor by tensor. ms per image (best round / median round).",
        "",
        "| model | input | mask sizes | expand | objects / kept per image | previous ms | current ms | "
        "speedup (best) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        p, c = run["total"]["previous"], run["total"]["current"]
        lines.append(
            f"| {run['model']} | {run['size']} | {run['mask_sizes']} | {run['expand']} | "
            f"{run['objects']['objects_per_image']} / {run['objects']['kept_per_image']} | "
            f"{p['best_ms']} / {p['median_ms']} | {c['best_ms']} / {c['median_ms']} | "
            f"**{p['best_ms'] / c['best_ms']:.2f}x** |"
        )
    for run in report["runs"]:
        lines += [
            "",
            f"## Current code, {run['model']} {run['size']}, expand {run['expand']}: own time of the top "
            "functions (cProfile, ms per image; the profiler's cost included)",
            "",
            "| function | ms |",
            "|---|---|",
        ]
        lines += [f"| `{name}` | {ms} |" for name, ms in run["profile"].items()]
    (out / "loader.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from pipelines.training.augment import AugmentConfig

    torch.set_num_threads(1)
    info = machine()
    print(
        f"CPU: {info['cpu']} ({info['cpus']} cores), ISA: {', '.join(info['cpu_isa']) or 'none'}; torch "
        f"{info['torch']} capability {info['torch_cpu_capability']}",
        flush=True,
    )
    rows = make_rows(args.images, args.max_instances)
    order = list(rows)
    batches = [order[i : i + args.micro_batch] for i in range(0, len(order), args.micro_batch)]
    report = {
        "machine": info,
        "images": args.images,
        "micro_batch": args.micro_batch,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "runs": [],
    }
    for item in args.models.split(","):
        name, size = item.split(":")
        spec, mask_sizes = model_spec(name, int(size))
        for expand in args.expand.split(","):
            cfg = AugmentConfig(expand=expand == "on")
            run = {
                "model": name,
                "size": spec.size,
                "mask_sizes": mask_sizes,
                "expand": expand,
                "objects": object_counts(rows, batches, spec, cfg),
                "total": total_times(rows, batches, spec, cfg, mask_sizes, args),
                "profile": profile_split(rows, batches, spec, cfg, mask_sizes),
            }
            report["runs"].append(run)
            p, c = run["total"]["previous"]["best_ms"], run["total"]["current"]["best_ms"]
            print(
                f"{name} {spec.size} expand {expand}: previous {p} ms/image, current {c} ms/image, {p / c:.2f}x",
                flush=True,
            )
    write_report(Path(args.out), report)
    print(f"wrote {Path(args.out) / 'loader.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
