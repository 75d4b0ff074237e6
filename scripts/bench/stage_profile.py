"""Where an executor's time per image goes: the executor function's stages run one image at a time in one process
(the job's settings: 1 OpenVINO thread, 1 stream, batches of B), each stage under its own cProfile profiler, so that
every function's own time is charged to the stage that called it. Read by scripts/bench_executor.py (--profile).

cProfile adds a fixed cost per Python call: the Python-heavy stages read slower than unprofiled (the per-stage
wall times beside the profile are measured without it, by the same loop run first)."""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
import time
from pathlib import Path

PROFILED_STAGES = ("preprocess", "infer", "postprocess", "write")


def _profiled_task(task, profilers: dict[str, cProfile.Profile]):
    """The task with its label-map write charged to the write profiler (it runs inside postprocess_one)."""

    class Profiled(type(task)):
        def write_label_map(self, row, labels):
            profilers["postprocess"].disable()
            profilers["write"].enable()
            try:
                super().write_label_map(row, labels)
            finally:
                profilers["write"].disable()
                profilers["postprocess"].enable()

    return Profiled(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})


def _run(
    task, contents: list[tuple[str, bytes]], batch_size: int, profilers: dict | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Every image once through decode+preprocess, infer (batches of batch_size), postprocess (+ write): (wall
    seconds per stage, summed; this thread's CPU seconds per stage, summed: robust to other work on the machine,
    and infer's is only the wait's, its work being on OpenVINO's thread)."""
    from pipelines.results.result_rows import new_row

    seconds = dict.fromkeys(PROFILED_STAGES, 0.0)
    cpu = dict.fromkeys(PROFILED_STAGES, 0.0)
    model = task.model()
    names = model.manifest.outputs
    for first in range(0, len(contents), batch_size):
        pending = []
        for path, data in contents[first : first + batch_size]:
            start, cpu_start = time.perf_counter(), time.thread_time()
            if profilers:
                profilers["preprocess"].enable()
            tensor, size = task.decode_and_preprocess(data, path)
            if profilers:
                profilers["preprocess"].disable()
            seconds["preprocess"] += time.perf_counter() - start
            cpu["preprocess"] += time.thread_time() - cpu_start
            pending.append((path, size, tensor))
        start, cpu_start = time.perf_counter(), time.thread_time()
        if profilers:
            profilers["infer"].enable()
        outputs = model.ir.infer([tensor for _, _, tensor in pending])
        if profilers:
            profilers["infer"].disable()
        seconds["infer"] += time.perf_counter() - start
        cpu["infer"] += time.thread_time() - cpu_start
        for index, (path, (width, height), _) in enumerate(pending):
            row = new_row(_Record(path))
            row["width"], row["height"] = width, height
            raw = {role: outputs[name][index] for role, name in names.items()}
            start, cpu_start = time.perf_counter(), time.thread_time()
            if profilers:
                profilers["postprocess"].enable()
            task.postprocess_one(row, raw, model)
            if profilers:
                profilers["postprocess"].disable()
            seconds["postprocess"] += time.perf_counter() - start - row["timings"]["write_s"]
            seconds["write"] += row["timings"]["write_s"]
            cpu["postprocess"] += time.thread_time() - cpu_start  # the write's CPU included
    return seconds, cpu


@dataclasses.dataclass
class _Record:
    path: str
    size: int = 0
    modification_time: object = None


def profile_stages(task, paths: list[Path], batch_size: int, top: int = 8) -> dict:
    """{"images", "stage_ms" (unprofiled wall ms per image), "stage_cpu_ms" (this thread's CPU ms per image;
    postprocess's includes the write's), "profile": {stage: [(function, own ms per image, calls per image)]}} over
    `paths` (one warm-up pass first: compilation, first-call allocations)."""
    contents = [("file:" + str(p), p.read_bytes()) for p in paths]
    _run(task, contents[:batch_size], batch_size, None)  # warm-up
    plain, plain_cpu = _run(task, contents, batch_size, None)
    profilers = {stage: cProfile.Profile() for stage in PROFILED_STAGES}
    _run(_profiled_task(task, profilers), contents, batch_size, profilers)
    n = len(contents)
    summary = {}
    for stage, profiler in profilers.items():
        stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own s, cum s, callers)}
        ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
        summary[stage] = [
            (_function_name(key), round(1000 * value[2] / n, 3), round(value[1] / n, 1)) for key, value in ranked
        ]
    return {
        "images": n,
        "stage_ms": {s: round(1000 * v / n, 3) for s, v in plain.items()},
        "stage_cpu_ms": {s: round(1000 * v / n, 3) for s, v in plain_cpu.items() if s != "write"},
        "profile": summary,
    }


def _function_name(key: tuple) -> str:
    file, line, name = key
    if file == "~":  # a builtin or a C function
        return name
    parts = Path(file).parts
    for anchor in ("pipelines", "site-packages", "scripts"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + (anchor == "site-packages") :]
            break
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{line}({name})"


def report_lines(rows: list[dict]) -> list[str]:
    """The bench report's profile section for rows with a "stage_profile"."""
    lines = [
        "",
        "## Profile per stage (one process, cProfile)",
        "",
        "The executor's stages run image by image in one process (1 OpenVINO thread, the bench's batches), each "
        "under its own profiler: ms per image per stage measured without the profiler, then the functions with the "
        "most own time per image (cProfile's fixed cost per call inflates Python-heavy code; `infer` is OpenVINO's "
        "wait, native inference threads are not seen).",
    ]
    for r in rows:
        p = r.get("stage_profile")
        if not p:
            continue
        lines += [
            "",
            f"### {r['model']} {r['precision']}: {p['images']} images; ms per image: "
            + ", ".join(f"{s} {v}" for s, v in p["stage_ms"].items())
            + "; this thread's CPU ms per image (postprocess with the write): "
            + ", ".join(f"{s} {v}" for s, v in p.get("stage_cpu_ms", {}).items()),
            "",
            "| stage | function | own ms per image | calls per image |",
            "|---|---|---|---|",
        ]
        for stage, functions in p["profile"].items():
            lines += [f"| {stage} | `{name}` | {ms} | {calls} |" for name, ms, calls in functions]
    return lines
