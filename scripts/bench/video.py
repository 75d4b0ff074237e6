"""The bench's video row: a 60 frames/s 1080p H.264 clip through the job (frames/s), beside PyAV's decode-only rate.

    python -m scripts.bench.video --seconds 5     # this row alone -> reports/bench_video.md
    python scripts/bench.py --video-seconds 5     # the whole bench, this row appended to reports/bench.md

The clip: synthetic road scenes rendered at 1920x1080 and panned, encoded by libx264 (B-frames, keyframe every
60 frames), cached under the work directory. The job runs in its own process (local[2], 2 partitions, f32,
segments of SEGMENT_FRAMES frames, so a short clip still spreads over both tasks) with the bundled default model;
frames/s counts the job's wall time from the summary (planning, scan, decode, inference, writing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "samples" / "models" / "yolact_default"
WIDTH, HEIGHT, FPS = 1920, 1080, 60
SEGMENT_FRAMES = 60


def make_clip(path: Path, seconds: float, scenes: int = 4) -> Path:
    """A `seconds` long 60 frames/s 1080p clip at `path` (reused when it exists)."""
    import av

    from pipelines.datasets.synthetic_roads import RoadSceneConfig, render_scene

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = [render_scene(rng, RoadSceneConfig(width=WIDTH, height=HEIGHT)).image for _ in range(scenes)]
    count = int(round(seconds * FPS))
    per_scene = -(-count // scenes)
    partial = path.with_suffix(".partial.mp4")
    with av.open(str(partial), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"bf": "2", "g": "60", "crf": "23", "preset": "veryfast"}
        for index in range(count):
            rgb = np.ascontiguousarray(np.roll(images[index // per_scene], 8 * (index % per_scene), axis=1))
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    partial.replace(path)
    return path


def decode_rate(path: Path) -> float:
    """PyAV's decode-only frames/s on this clip (one process, frames converted to RGB as the job does)."""
    import av

    started, frames = time.perf_counter(), 0
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            frame.to_ndarray(format="rgb24")
            frames += 1
    return frames / (time.perf_counter() - started)


def run_video(work: Path, seconds: float, timeout_s: float = 1800) -> dict:
    """The row: {"clip", "frames", "job_frames_per_s", "job_wall_s", "decode_frames_per_s", "stage_seconds"}."""
    clip = make_clip(work / f"video-{seconds:g}s" / f"road_{HEIGHT}p{FPS}.mp4", seconds)
    output = work / "runs" / f"video-{seconds:g}s"
    config = work / "runs" / "video.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"input:\n  video:\n    segment_frames: {SEGMENT_FRAMES}\nrun:\n  progress_interval_s: 0\n")
    command = [
        sys.executable,
        str(REPO / "jobs" / "infer_yolact.py"),
        "--config",
        str(config),
        "--input",
        str(clip.parent),
        "--output",
        str(output),
        "--model",
        str(MODEL),
        "--precision",
        "f32",
        "--partitions",
        "2",
        "--master",
        "local[2]",
        "--force",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"video bench job failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((output / "summary.json").read_text(encoding="utf-8"))
    return {
        "clip": f"{seconds:g} s, {WIDTH}x{HEIGHT}, {FPS} frames/s, H.264 with B-frames",
        "frames": summary["counts"]["frames"],
        "job_frames_per_s": summary["frames_per_second"],
        "job_wall_s": summary["wall_seconds"],
        "decode_frames_per_s": round(decode_rate(clip), 1),
        "stage_seconds": summary["stage_seconds"],
    }


def markdown(row: dict) -> list[str]:
    return [
        "",
        "## Video",
        "",
        f"One clip ({row['clip']}) through the job, local[2], 2 partitions, f32, the bundled default model "
        f"(`samples/models/yolact_default`, 256 px input), segments of {SEGMENT_FRAMES} frames:",
        "",
        "| row | frames | frames/s | wall s | PyAV decode-only frames/s (1 process) |",
        "|---|---|---|---|---|",
        f"| spark job, video | {row['frames']} | {row['job_frames_per_s']} | {row['job_wall_s']} | "
        f"{row['decode_frames_per_s']} |",
        "",
        f"Stage seconds (summed over tasks): {json.dumps(row['stage_seconds'])}; `read` is decoding.",
    ]


if __name__ == "__main__":
    import argparse

    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--work-dir", default=str(REPO / "work" / "bench"))
    parser.add_argument("--out", default=str(REPO / "reports" / "bench_video.md"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    row = run_video(Path(args.work_dir), args.seconds)
    text = (
        "\n".join(
            [
                "# sparkseg bench: video",
                "",
                f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores; "
                f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (a "
                "shared machine: a load above the core count slows the row).",
            ]
            + markdown(row)
        )
        + "\n"
    )
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
