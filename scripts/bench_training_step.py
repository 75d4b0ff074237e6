"""Training-step benchmark without Spark or Java (`scripts/bench_training.py --device cuda|cpu` runs this):
images/s of the full training step (the rank's loop, TrainingSession.steps: prepared Parquet shards decoded and
augmented by the loader workers, copied to the device, matching, YOLACT loss, backward, optimizer step) against the model-only ceiling
(forward + backward of the same model with a trivial loss on a batch already on the device), measured in the same
run, per model and precision. Also: the loader alone (images/s its workers deliver), the full step on batches
already on the device (the step without input), and the full step with each step's loss read before the next step
is launched (one at a time: the loop's launch ahead, side by side). Writes OUT/training_<device>.json and .md.

    python scripts/bench_training.py --device cuda                      # R50 550 b32 and r18_small 352 b64, f32+bf16
    python scripts/bench_training.py --device cpu --models yolact_r18_small:64:4 --steps 2 --warmup 1 --images 8

The data: synthetic road images (pipelines.datasets.synthetic_roads, 640x480) written as shards with the plain
Python writer (pipelines.training.shard_rows), read through pipelines.training.shards as a rank does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench.machine import cpu_isa  # noqa: E402

LOG = logging.getLogger("bench_training_step")
DEFAULT_MODELS = "yolact_resnet50:550:32,yolact_r18_small:352:64"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="config:input_size:batch, comma-separated")
    parser.add_argument("--precisions", default="f32,bf16")
    parser.add_argument(
        "--cuda-graphs",
        default=None,
        help="train.cuda_graphs values to measure side by side, e.g. off,on (default: off,on on cuda, off on cpu)",
    )
    parser.add_argument("--steps", type=int, default=40, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=6, help="untimed steps first (cuDNN autotuning, workers)")
    parser.add_argument("--images", type=int, default=256, help="synthetic training images (reused across steps)")
    parser.add_argument(
        "--workers", type=int, default=None, help="loader workers (default: cores - 2, at most 14, on cuda; 1 on cpu)"
    )
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the training process")
    parser.add_argument("--data", default=None, help="where the synthetic data and shards go (default: a temp dir)")
    parser.add_argument("--out", default=str(REPO / "reports"), help="report directory")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        help="also profile this many steps without input (torch.profiler): the device's busy share "
        "of the wall time, host waits, the top kernels (OUT/<name>_profile.txt)",
    )
    return parser.parse_args(argv)


def machine(device) -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    info["cpu"], info["cpu_isa"] = cpu_isa()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=torch.cuda.get_device_name(device),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    return info


def prepare_data(root: Path, count: int) -> tuple[Path, int]:
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.training.shard_rows import write_plain_shards

    prepared = root / "prepared"
    marker = prepared / f"_rows_{count}"
    if marker.exists():
        return prepared, int(marker.read_text())
    started = time.time()
    dataset = generate_road_dataset(root / "roads", count, 4242, RoadSceneConfig(formats=("coco",)))
    rows = write_plain_shards(
        dataset, root / "roads" / "images", prepared, tuple(c.name for c in dataset.categories), num_shards=4
    )
    marker.write_text(str(rows))
    LOG.info("data: %d synthetic images -> %d shard rows in %.1f s", count, rows, time.time() - started)
    return prepared, rows


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_only_steps(session, images, steps: int) -> None:
    """Forward + backward of the model with a trivial loss (sum of every output's mean), `steps` times, run as the
    step runs it (replayed as CUDA graphs once the step captured them)."""
    from pipelines.training.trainer import autocast_for

    model, device = session.model, session.device
    for _ in range(steps):
        model.zero_grad(set_to_none=not session.runner.keeps_grads)
        with autocast_for(device, session.cfg.train.precision):
            outputs = session.runner.forward(images)
            loss = sum(v.float().mean() for v in outputs.values())
        loss.backward()


def ceiling_images(session, batch: int, size: int):
    import torch

    return torch.randn(batch, 3, size, size, device=session.device).contiguous(memory_format=torch.channels_last)


def ceiling(session, batch: int, size: int, steps: int, warmup: int) -> float:
    """images/s of forward + backward with a trivial loss, input already on the device (model_only_steps)."""
    images = ceiling_images(session, batch, size)
    model_only_steps(session, images, warmup)
    synchronize(session.device)
    started = time.perf_counter()
    model_only_steps(session, images, steps)
    synchronize(session.device)
    return steps * batch / (time.perf_counter() - started)


def first_step_terms(session, rows: dict, plan: list[list[int]]) -> list[float]:
    """The loss terms of one step on the plan's first micro-batch from the freshly initialized model (seeded: the
    same weights in every session of a model): graphs off and on compared."""
    from pipelines.training.loader import micro_batch_stream

    stream = micro_batch_stream(rows, plan[:1], session.loader_spec(0))
    terms = session.train_step([next(stream)])
    stream.close()
    return [float(v) for v in terms]


def micro_batch_plan(rows: int, batch: int, steps: int, seed: int) -> list[list[int]]:
    import numpy as np

    order = np.concatenate(
        [np.random.default_rng([seed, k]).permutation(rows) for k in range(steps * batch // rows + 1)]
    )
    return [order[i * batch : (i + 1) * batch].tolist() for i in range(steps)]


def full_step(session, rows: dict, plan: list[list[int]], warmup: int, one_at_a_time: bool = False) -> float:
    """images/s of train_step fed by the loader (its workers' decode + augmentation included). one_at_a_time: each
    step's terms are read before the next step is launched (TrainingSession.steps' settle on every step), the
    side-by-side figure for the launch ahead."""
    from pipelines.training.loader import micro_batch_stream

    stream = micro_batch_stream(rows, plan, session.loader_spec(0))
    started, graphs = 0.0, 0
    settle = (lambda k: True) if one_at_a_time else (lambda k: k + 1 == warmup)
    for step, _ in enumerate(session.steps(stream, [1] * len(plan), settle=settle)):
        if step + 1 == warmup:
            synchronize(session.device)
            started, graphs = time.perf_counter(), compiled_graphs()
    synchronize(session.device)
    stream.close()
    timed = plan[warmup:]
    COMPILED_IN_TIMED_STEPS.append(compiled_graphs() - graphs)
    return sum(len(mb) for mb in timed) / (time.perf_counter() - started)


COMPILED_IN_TIMED_STEPS: list[int] = []  # graphs torch.compile made during each full_step's timed steps


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def fused_states() -> dict[str, str]:
    """Each FusedOnCuda function of the step: compiled (on a GPU), fell back (compiling failed: it runs eagerly, and
    the figures measure that), or eager (not called on a GPU)."""
    from pipelines.training import batches, boxes, yolact_loss

    functions = {
        "colour": batches.distorted_normalized,
        "best_overlaps": boxes.best_overlaps,
        "match_targets": boxes.match_targets,
        "loss_sums": yolact_loss.loss_sums,
        "cropped_mask_bce": yolact_loss.cropped_mask_bce,
    }
    return {
        name: "fell back" if f.failed else "compiled" if f.compiled is not None else "eager"
        for name, f in functions.items()
    }


def step_without_input(session, rows: dict, plan: list[list[int]], warmup: int, steps: int) -> float:
    """images/s of train_step on two micro-batches made beforehand (no input pipeline in the time)."""
    from pipelines.training.loader import micro_batch_stream

    cached = itertools.cycle(list(micro_batch_stream(rows, plan[:2], session.loader_spec(0))))
    started = 0.0
    for step, _ in enumerate(session.steps(cached, [1] * (warmup + steps), settle=lambda k: k + 1 == warmup)):
        if step + 1 == warmup:
            synchronize(session.device)
            started = time.perf_counter()
    synchronize(session.device)
    return steps * len(plan[0]) / (time.perf_counter() - started)


def profile_steps(session, rows: dict, plan: list[list[int]], steps: int) -> tuple[dict, str]:
    """torch.profiler over `steps` full steps (fed by the loader), `steps` steps without input and `steps`
    model-only steps (each after 3 untimed): the device's busy share of the window (union of kernel intervals /
    wall), the host's waits for the device and other host calls per step, and the step without input's top
    operations by device time and by host time."""
    from pipelines.training.loader import micro_batch_stream

    stream = micro_batch_stream(
        rows, micro_batch_plan(len(rows), len(plan[0]), steps + 3, seed=len(rows) + 1), session.loader_spec(0)
    )
    full_stepper = session.steps(stream, [1] * (steps + 3), settle=lambda k: k == 2)
    for _ in range(3):
        next(full_stepper)
    full_summary, _ = profiled(session.device, steps, lambda: [None for _ in full_stepper])
    stream.close()
    cached = itertools.cycle(list(micro_batch_stream(rows, plan[:2], session.loader_spec(0))))
    stepper = session.steps(cached, [1] * (steps + 3), settle=lambda k: k == 2)
    for _ in range(3):
        next(stepper)
    step_summary, averages = profiled(session.device, steps, lambda: [None for _ in stepper])
    images = ceiling_images(session, len(plan[0]), session.input_spec.size)
    model_only_steps(session, images, 3)
    ceiling_summary, _ = profiled(session.device, steps, lambda: model_only_steps(session, images, steps))
    tables = [
        averages.table(sort_by=key, row_limit=20, max_name_column_width=70)
        for key in (
            ("self_cuda_time_total", "self_cpu_time_total")
            if session.device.type == "cuda"
            else ("self_cpu_time_total",)
        )
    ]
    return {"full_step": full_summary, "step": step_summary, "model_only": ceiling_summary}, "\n".join(tables)


def component_times(session, rows: dict, plan: list[list[int]], repeats: int = 10) -> dict:
    """ms per call of each part of a step alone (waited for: host and device time), on the plan's first
    micro-batch: colour distortion + normalization, matching, the model (forward + backward), the loss (its
    sums and their backward into the model's outputs), zeroing the gradients, the optimizer step."""
    import torch

    from pipelines.training.loader import micro_batch_stream
    from pipelines.training.trainer import autocast_for

    stream = micro_batch_stream(rows, plan[:1], session.loader_spec(0))
    raw = next(stream)
    stream.close()
    device, spec, loss = session.device, session.input_spec, session.loss
    moved = raw.targets_to(device)
    moved.images = moved.images.to(device)
    batch = session.to_device([raw])[0]
    normalizer = session.normalizer([batch])
    images = batch.images.contiguous(memory_format=torch.channels_last)

    def model_pass():
        with autocast_for(device, session.cfg.train.precision):
            outputs = session.runner.forward(images)
            sum(v.float().mean() for v in outputs.values()).backward()

    with autocast_for(device, session.cfg.train.precision):
        outputs = {k: v.detach().requires_grad_() for k, v in session.runner.forward(images).items()}

    def loss_pass():
        terms = normalizer.apply(loss.sums(outputs, batch.targets, batch.matches))
        sum(terms.values()).backward()

    parts = {
        "colour and normalization": lambda: moved.finish_images(spec),
        "matching": lambda: loss.match(batch.targets),
        "loss sums + backward": loss_pass,
        "model forward + backward": model_pass,
        "optimizer step": session.optimizer.step,
        "zero gradients": lambda: session.optimizer.zero_grad(set_to_none=not session.runner.keeps_grads),
    }
    times, tables = {}, []
    for name, part in parts.items():
        part()
        synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            part()
        synchronize(device)
        times[name] = round((time.perf_counter() - started) * 1000 / repeats, 2)
        summary, averages = profiled(device, repeats, lambda part=part: [part() for _ in range(repeats)])
        times[f"{name}: device busy"] = summary["device_busy_ms_per_step"]
        if name != "model forward + backward":
            tables.append(
                f"### {name} ({repeats} calls)\n"
                + averages.table(
                    sort_by="self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total",
                    row_limit=12,
                    max_name_column_width=70,
                )
            )
    return times, "\n".join(tables)


WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def profiled(device, steps: int, run) -> tuple[dict, object]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        run()
        synchronize(device)
        wall = time.perf_counter() - started
    intervals = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA
    )
    busy, end = 0.0, float("-inf")
    for start, stop in intervals:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    averages = prof.key_averages()
    calls = {
        e.key: round(e.count / steps, 2)
        for e in averages
        if e.key in (*WAIT_CALLS, "aten::_local_scalar_dense", "aten::nonzero", "cudaMemcpyAsync")
    }
    waited = sum(e.self_cpu_time_total for e in averages if e.key in WAIT_CALLS) / 1000 / steps
    return {
        "profiled_steps": steps,
        "wall_ms_per_step": round(wall * 1000 / steps, 2),
        "device_busy_ms_per_step": round(busy / 1000 / steps, 2),
        "device_busy_share": round(busy / 1e6 / wall, 3) if wall else None,
        "host_wait_ms_per_step": round(waited, 2),
        "host_calls_per_step": calls,
    }, averages


def loader_only(session, rows: dict, plan: list[list[int]]) -> float:
    """images/s the loader workers deliver alone (first micro-batch excluded: worker start)."""
    from pipelines.training.loader import micro_batch_stream

    stream = micro_batch_stream(rows, plan, session.loader_spec(1))
    next(stream)
    started = time.perf_counter()
    count = sum(len(mb.indices) for mb in stream)
    return count / (time.perf_counter() - started)


def measure(
    args,
    device,
    prepared: Path,
    rows: dict,
    config: str,
    size: int,
    batch: int,
    precision: str,
    workers: int,
    cuda_graphs: bool,
) -> dict:
    import torch

    from pipelines.training.config import load_train_config
    from pipelines.training.topology import make_topology
    from pipelines.training.trainer import TrainingSession

    run_dir = Path(tempfile.mkdtemp(prefix="bench-step-"))
    cfg = load_train_config(
        None,
        {
            "run_dir": str(run_dir),
            "data.prepared": str(prepared),
            "data.loader_workers": workers,
            "data.loader_prefetch": args.prefetch,
            "model.config": config,
            "model.max_size": size,
            "distributed.use_gpu": device.type == "cuda",
            "train.global_batch": batch,
            "train.micro_batch": batch,
            "train.precision": precision,
            "train.cuda_graphs": cuda_graphs,
            "train.optimizer": "sgd",
            "train.lr": 1e-4,
            "train.warmup_steps": 0,
            "checkpoint.every_steps": 0,
            "eval.every_epochs": 0,
        },
    )
    session = TrainingSession(cfg, make_topology("local", 1), device)
    plan = micro_batch_plan(len(rows), batch, args.warmup + args.steps, seed=len(rows))
    result = {
        "model": config,
        "input_size": size,
        "batch": batch,
        "precision": precision,
        "loader_workers": workers,
        "channels_last": cfg.train.channels_last,
        "cuda_graphs": cuda_graphs,
        "augment": cfg.augment.__dict__,
    }
    result["first_step_terms"] = first_step_terms(session, rows, plan)
    result["graphed"] = getattr(session.runner, "graphed", None) is not None
    result["ceiling_images_per_s"] = round(ceiling(session, batch, size, args.steps, args.warmup), 1)
    result["full_step_images_per_s"] = round(full_step(session, rows, plan, args.warmup), 1)
    result["full_step_one_at_a_time_images_per_s"] = round(full_step(session, rows, plan, args.warmup, True), 1)
    result["step_without_input_images_per_s"] = round(
        step_without_input(session, rows, plan, args.warmup, args.steps), 1
    )
    result["loader_only_images_per_s"] = round(loader_only(session, rows, plan[: args.steps]), 1)
    result["fused"] = fused_states()
    result["graphs_compiled_in_timed_full_steps"] = COMPILED_IN_TIMED_STEPS[-2:]
    if args.profile:
        result["profile"], table = profile_steps(session, rows, plan, args.profile)
        result["profile"]["component_ms"], component_tables = component_times(session, rows, plan)
        table += "\n" + component_tables
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"training_{device.type}_profile.txt", "a") as f:
            f.write(f"## {config} {size} batch {batch} {precision}: {json.dumps(result['profile'])}\n{table}\n")
    result["ratio_full_to_ceiling"] = round(result["full_step_images_per_s"] / result["ceiling_images_per_s"], 3)
    if device.type == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
        torch.cuda.reset_peak_memory_stats(device)
    del session
    shutil.rmtree(run_dir, ignore_errors=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    LOG.info("%s", json.dumps(result))
    return result


def markdown(report: dict) -> str:
    m = report["machine"]
    where = m.get("gpu") or f"CPU {m.get('cpu')}"
    lines = [
        f"# Training step vs model-only ceiling on {where}",
        "",
        f"torch {m['torch']}, CUDA {m.get('cuda')}, cuDNN {m.get('cudnn')}; CPU {m.get('cpu')} "
        f"({m['cpus']} cores, ISA {', '.join(m['cpu_isa']) or '?'}, torch CPU capability "
        f"{m['torch_cpu_capability']}); {m['platform']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"{report['steps']} timed steps after {report['warmup']} warm-up steps per figure; "
        f"{report['images']} synthetic 640x480 road images in Parquet shards, augmentation on "
        "(photometric, random crop, mirror: conf/train_yolact.yaml's defaults); SGD.",
        "",
        "- ceiling: forward + backward with a trivial loss (sum of the outputs' means), batch already on the device;",
        "- full step: the rank's loop (TrainingSession.steps) fed by the loader workers (decode, augmentation, targets), "
        "matching, YOLACT loss, backward, optimizer step;",
        "- full step, one at a time: the same, each step's loss read before the next step is launched (the loop "
        "launches a step ahead once the update is gated on the device);",
        "- step without input: the same step on two micro-batches made beforehand;",
        "- loader only: what the loader workers deliver with nothing else running;",
        "- CUDA graphs: train.cuda_graphs (the model's forward and backward replayed as CUDA graphs, the ceiling "
        "too); off and on measured one after the other in this run.",
        "",
        "| model | input | batch | precision | CUDA graphs | loader workers | ceiling img/s | full step img/s |"
        " full / ceiling | full step, one at a time img/s | step without input img/s | loader only img/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        graphs = "on" if r.get("graphed") else "off"
        lines.append(
            f"| {r['model']} | {r['input_size']} | {r['batch']} | {r['precision']} | {graphs} | "
            f"{r['loader_workers']} | "
            f"{r['ceiling_images_per_s']} | {r['full_step_images_per_s']} | {r['ratio_full_to_ceiling']} | "
            f"{r['full_step_one_at_a_time_images_per_s']} | "
            f"{r['step_without_input_images_per_s']} | {r['loader_only_images_per_s']} |"
        )
    lines += [
        "",
        "Compiled parts of the step (FusedOnCuda: compiled on a GPU; fell back: compiling failed and the "
        "figures measure the eager code) and graphs torch.compile made during the two timed full steps "
        "(a recompilation there is time the figure counts):",
        "",
    ]
    for r in report["results"]:
        states = ", ".join(f"{name} {state}" for name, state in r.get("fused", {}).items())
        lines.append(
            f"- {r['model']} {r['input_size']} b{r['batch']} {r['precision']}: {states}; graphs in the "
            f"timed steps: {r.get('graphs_compiled_in_timed_full_steps')}"
        )
    lines += [
        "",
        "First step's loss terms (box, conf, mask, semantic) from the same seeded weights and micro-batch, "
        "graphs off vs on (largest relative difference):",
        "",
    ]
    for (model, precision), rows in group_rows(report["results"]).items():
        if len(rows) == 2:
            lines.append(
                f"- {model} {precision}: {rows[0]['first_step_terms']} vs {rows[1]['first_step_terms']}: "
                f"{largest_relative_difference(rows[0]['first_step_terms'], rows[1]['first_step_terms']):.2e}"
            )
    return "\n".join(lines) + "\n"


def group_rows(results: list[dict]) -> dict:
    groups: dict = {}
    for r in results:
        groups.setdefault((f"{r['model']} {r['input_size']} b{r['batch']}", r["precision"]), []).append(r)
    return groups


def largest_relative_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s")
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        LOG.error("--device cuda but torch sees no CUDA device")
        return 2
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    cores = os.cpu_count() or 2
    workers = args.workers if args.workers is not None else (min(14, max(cores - 2, 1)) if args.device == "cuda" else 1)
    torch.set_num_threads(args.threads or (2 if args.device == "cuda" else max(cores - workers, 1)))
    data_root = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="bench-step-data-"))
    prepared, count = prepare_data(data_root, args.images)
    from pipelines.training.shards import ShardIndex

    rows = ShardIndex.open(str(prepared / "train")).read(range(count))
    graph_settings = [
        value.strip() == "on"
        for value in (args.cuda_graphs or ("off,on" if device.type == "cuda" else "off")).split(",")
    ]
    report = {
        "machine": machine(device),
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "steps": args.steps,
        "warmup": args.warmup,
        "images": args.images,
        "results": [],
    }
    LOG.info("machine: %s", json.dumps(report["machine"]))
    try:
        for spec in args.models.split(","):
            config, size, batch = spec.split(":")
            for precision in args.precisions.split(","):
                for graphs in graph_settings:
                    report["results"].append(
                        measure(args, device, prepared, rows, config, int(size), int(batch), precision, workers, graphs)
                    )
    finally:
        if not args.data:  # a temp dir of this run's own
            shutil.rmtree(data_root, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "training_gpu" if device.type == "cuda" else "training_cpu_step"
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
