"""Stop a training run after it wrote a checkpoint: with a terminal's Ctrl-C (SIGINT to the job's process group:
driver, pyspark's wrapper, torchrun, which stops the rank), with `kill -INT` of the driver alone (which stops its
ranks itself), or with a kill (SIGKILL to that group; the rank, in a session of its own, ends with its torchrun);
run the same command again: it resumes there and its losses are those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.training.checkpoints import step_checkpoints
from tests.fixtures_training import REPO, tiny_roads  # noqa: F401
from tests.process_io import read_line

STEPS, EVERY = 10, 2  # a stop that comes a checkpoint late still leaves the next stop one to come


def job_command(data: Path, prepared: Path, run_dir: Path) -> list[str]:
    settings = {
        "data.images": data / "images",
        "data.annotations": data / "annotations.json",
        "data.prepared": prepared,
        "data.num_shards": 2,
        "data.val_fraction": 0.25,
        "model.max_size": 64,
        "distributed.threads_per_process": 1,
        "train.max_steps": STEPS,
        "train.global_batch": 4,
        "train.micro_batch": 2,
        "train.warmup_steps": 2,
        "train.lr_milestones": "[0.5]",
        "checkpoint.every_steps": EVERY,
        "eval.every_epochs": 0,
        "tracking.mlflow_uri": run_dir / "mlruns",
        "tracking.progress_bar": "false",
        "tracking.plots": "false",
    }
    command = [sys.executable, str(REPO / "jobs" / "train_yolact.py"), "--run-dir", str(run_dir), "--epochs", "5"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def run_job(
    command: list[str], log: Path, stop_in: Path | None = None, signal_number=signal.SIGKILL, whole_group: bool = True
) -> int:
    """The job's exit code; with stop_in (its run directory), once the run wrote a checkpoint there that was not
    there when it started, signal_number goes to the job's process group (whole_group) or to its driver alone."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    before = checkpoints(stop_in) if stop_in else set()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
        if stop_in is None:
            return process.wait(timeout=900)
        deadline = time.time() + 900
        while checkpoints(stop_in) <= before and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, f"the run ended before it could be stopped: {log.read_text()[-2000:]}"
        if whole_group:
            os.killpg(process.pid, signal_number)
        else:
            os.kill(process.pid, signal_number)
        return process.wait(timeout=300)


def checkpoints(run_dir: Path) -> set[str]:
    """The names of the run's step checkpoints (not a checkpoint being written: a hidden temp file)."""
    return {path.name for path in step_checkpoints(run_dir)}


def assert_interrupted(code: int, log: Path) -> None:
    said = log.read_text()
    assert code == 130, said[-3000:]
    assert "Traceback" not in said and "sparkseg: stopping (Ctrl-C again to quit at once)" in said, said[-3000:]
    assert said.strip().splitlines()[-1] == (
        "error: interrupted (Ctrl-C): the run keeps its checkpoints; run the "
        "same command again to resume from the newest"
    ), said[-3000:]


def losses(run_dir: Path) -> dict[int, list[float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: [m["loss"], m["box"], m["conf"], m["mask"], m["semantic"]] for m in rows if m["kind"] == "step"}


def test_stopped_runs_resume_and_reproduce_the_uninterrupted_losses(tiny_roads, tmp_path):
    prepared = tmp_path / "prepared"
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run_job(job_command(tiny_roads, prepared, straight), tmp_path / "straight.log") == 0
    expected = losses(straight)
    assert sorted(expected) == list(range(1, STEPS + 1))
    summary = (straight / "summary.json").read_bytes()
    assert run_job(job_command(tiny_roads, prepared, straight), tmp_path / "again.log") == 0  # finished already
    again = (tmp_path / "again.log").read_text()
    assert f"the run in {straight} is finished (step {STEPS} of {STEPS}): nothing to train" in again
    assert "nothing trained:" in again and (straight / "summary.json").read_bytes() == summary
    assert losses(straight) == expected

    command = job_command(tiny_roads, prepared, stopped)
    assert_interrupted(run_job(command, tmp_path / "ctrl-c.log", stopped, signal.SIGINT), tmp_path / "ctrl-c.log")
    # the driver alone (a scheduler's or an operator's `kill -INT`): the rank does not get it, the driver ends it
    assert_interrupted(
        run_job(command, tmp_path / "driver.log", stopped, signal.SIGINT, whole_group=False), tmp_path / "driver.log"
    )
    assert not (stopped / "summary.json").exists()  # stopped, not trained to the end with the driver waiting
    assert run_job(command, tmp_path / "killed.log", stopped) == -signal.SIGKILL
    assert run_job(command, tmp_path / "resumed.log") == 0
    resumed_log = (tmp_path / "resumed.log").read_text()
    assert "resumed from" in resumed_log and "other settings than the checkpoint's" not in resumed_log
    got = losses(stopped)
    assert sorted(got) == sorted(expected)
    np.testing.assert_allclose(
        [got[s] for s in sorted(got)], [expected[s] for s in sorted(expected)], rtol=1e-5, atol=1e-6
    )


def test_a_resume_with_another_schedule_names_what_changed():
    from pipelines.training.run_state import schedule_changes

    before = {"train": {"epochs": 10, "lr": 0.001, "lr_milestones": [0.5]}, "model": {"max_size": 128}}
    now = {"train": {"epochs": 12, "lr": 0.001, "lr_milestones": [0.5], "max_steps": 100}, "model": {"max_size": 128}}
    assert schedule_changes(before, now) == ["train.epochs 10 -> 12"]  # max_steps: not recorded before
    assert schedule_changes({}, now) == []


def test_a_rank_ends_with_its_parent(tmp_path):
    """torchrun starts each rank in a session of its own: a kill of the job's process group does not reach the rank,
    which must not train on alone (the next run resumes in the same run directory)."""
    rank = (
        "import os, signal; from pipelines.training.run_state import end_with_parent; end_with_parent(); "
        "print(os.getpid(), flush=True); signal.pause()"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
            f"{rank!r}], start_new_session=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    rank_pid = int(read_line(parent))
    rank_ended = os.pidfd_open(rank_pid)  # readable once the rank has ended
    try:
        parent.kill()
        parent.wait(timeout=60)
        outlived = not select.select([rank_ended], [], [], 60)[0]
        if outlived:
            signal.pidfd_send_signal(rank_ended, signal.SIGKILL)
        assert not outlived, "the rank outlived its parent"
    finally:
        os.close(rank_ended)
