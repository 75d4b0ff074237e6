"""jobs/train_detector.py on tiny synthetic roads (real local Spark, TorchDistributor, CPU): a local run trains,
checkpoints and evaluates box AP with pycocotools; a ddp run killed after its first checkpoint resumes and
reproduces the local run's losses (same global batch = the same training); other strategies are refused."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.errors import UsageError
from pipelines.training.detector_config import load_detector_train_config
from pipelines.training.detector_step import LOSS_KEYS
from tests.fixtures_training import REPO, tiny_prepared, tiny_roads  # noqa: F401
from tests.test_training_resume import run_job

STEPS, EVERY = 6, 2


def settings(data: Path, prepared: Path, run_dir: Path) -> dict:
    """128x128 input, global batch 4 in micro-batches of 2 (11 train images: 2 steps an epoch), 1 thread a rank,
    STEPS steps, box AP at the end."""
    return {
        "run_dir": str(run_dir),
        "distributed.use_gpu": False,
        "data.images": str(data / "images"),
        "data.annotations": str(data / "annotations.json"),
        "data.prepared": str(prepared),
        "data.num_shards": 2,
        "data.val_fraction": 0.25,
        "model.input_size": [128, 128],
        "distributed.threads_per_process": 1,
        "train.epochs": 5,
        "train.max_steps": STEPS,
        "train.global_batch": 4,
        "train.micro_batch": 2,
        "train.warmup_steps": 2,
        "train.lr_milestones": [0.5],
        "checkpoint.every_steps": EVERY,
        "eval.every_epochs": 3,
        "tracking.mlflow_uri": str(run_dir / "mlruns"),
        "tracking.progress_bar": False,
        "tracking.plots": False,
    }


def step_losses(run_dir: Path) -> dict[int, list[float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: [m["loss"], *(m[k] for k in LOSS_KEYS)] for m in rows if m["kind"] == "step"}


@pytest.fixture(scope="module")
def local_run(spark, tiny_roads, tiny_prepared, tmp_path_factory):  # noqa: F811
    """The shards are YOLACT's training tests' (same classes, shards and split: prepared once per session)."""
    from pipelines.training.detector_launcher import run_detector_training

    root = tmp_path_factory.mktemp("detector_training")
    cfg = load_detector_train_config(None, settings(tiny_roads, tiny_prepared, root / "local"))
    inherited = {name: os.environ.get(name) for name in ("PYTHONPATH", "OMP_WAIT_POLICY")}
    summary = run_detector_training(spark, cfg)
    assert {name: os.environ.get(name) for name in inherited} == inherited, (
        "the launch must give the driver's environment back as it found it (later subprocesses inherit it)"
    )
    return root, tiny_prepared, summary


def test_local_run_trains_checkpoints_and_evaluates_box_ap(local_run):
    root, _, summary = local_run
    run_dir = root / "local"
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert np.isfinite(list(losses.values())).all()
    assert summary["state"]["step"] == STEPS and summary["world"] == 1 and summary["device"] == "cpu"
    evaluation = summary["last_eval"]
    assert evaluation["val_images"] == summary["prepare"]["counts"]["val"]["ok"] > 0
    for key in ("box_ap", "box_ap50", "box_ap_blobs", "box_ap_crack"):
        assert 0.0 <= evaluation[key] <= 1.0
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "best.pt" in checkpoints and f"step_{STEPS:08d}.pt" in checkpoints
    assert summary["mlflow_run_id"] and (run_dir / "summary.json").is_file()


def job_command(data: Path, prepared: Path, run_dir: Path, *extra: str) -> list[str]:
    command = [sys.executable, str(REPO / "jobs" / "train_detector.py"), *extra]
    quiet = {"tracking.mlflow_uri": "", "tracking.plots": False}
    for key, value in {**settings(data, prepared, run_dir), **quiet}.items():
        command += ["--set", f"{key}={json.dumps(value) if isinstance(value, list) else value}"]
    return command


def test_killed_ddp_run_resumes_and_reproduces_the_local_losses(
    spark,
    local_run,
    tiny_roads,
    tmp_path,  # noqa: F811
    capfd,
):
    from pipelines.training.detector_launcher import run_detector_training

    root, prepared, _ = local_run
    killed = tmp_path / "ddp"
    command = job_command(tiny_roads, prepared, killed, "--strategy", "ddp", "--num-processes", "2")
    assert run_job(command, tmp_path / "killed.log", killed) == -signal.SIGKILL  # at its first checkpoint
    # the same run again (in this test session's Spark, no second JVM): it continues from the newest checkpoint
    again = {
        **settings(tiny_roads, prepared, killed),
        "tracking.mlflow_uri": "",
        "tracking.plots": False,
        "distributed.strategy": "ddp",
        "distributed.num_processes": 2,
    }
    summary = run_detector_training(spark, load_detector_train_config(None, again))
    assert summary["world"] == 2 and summary["state"]["step"] == STEPS
    assert "resumed from" in capfd.readouterr().out
    expected, got = step_losses(root / "local"), step_losses(killed)
    assert sorted(got) == sorted(expected)
    np.testing.assert_allclose(
        [got[s] for s in sorted(got)], [expected[s] for s in sorted(expected)], rtol=1e-4, atol=1e-5
    )


def test_pipeline_and_hybrid_strategies_are_refused_with_a_usage_error(capsys):
    for strategy in ("pipeline", "hybrid"):
        with pytest.raises(UsageError, match="local or ddp"):
            load_detector_train_config(None, {"distributed.strategy": strategy})
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        from train_detector import main
    finally:
        sys.path.remove(str(REPO / "jobs"))
    assert main(["--strategy", "hybrid"]) == 2
    assert "pass --strategy local or --strategy ddp" in capsys.readouterr().err


def test_detector_inputs_are_seeded_scaled_and_bad_files_named(tiny_roads):  # noqa: F811
    from model_export.models.factornet_detector import ROAD_DISTRESS_CLASSES
    from pipelines.training.detector_config import DetectorAugmentSection
    from pipelines.training.detector_sources import CocoFolderIndex
    from pipelines.training.detector_step import make_detector_batch

    index = CocoFolderIndex.open(tiny_roads / "images", tiny_roads / "annotations.json", ROAD_DISTRESS_CLASSES)
    rows = index.read([0, 1])
    plain = make_detector_batch(rows, [0, 1], (64, 128), None, 0, 0)
    for target, row in zip(plain.targets, (rows[0], rows[1])):
        boxes = np.float32(row["boxes"]).reshape(-1, 4) * np.float32([128 / 96, 64 / 72, 128 / 96, 64 / 72])
        np.testing.assert_allclose(target["boxes"].numpy(), boxes, rtol=1e-6)
        assert target["labels"].tolist() == [label + 1 for label in row["labels"]]  # 0 is the background
    assert tuple(plain.images[0].shape) == (3, 64, 128) and 0.0 <= float(plain.images[0].min()) <= 1.0
    augment = DetectorAugmentSection(expand=True, sample_crop=True).as_augment_config()
    first, again = (make_detector_batch(rows, [0, 1], (64, 64), augment, 3, 1) for _ in range(2))
    for a, b in zip(
        first.images + [t["boxes"] for t in first.targets], again.images + [t["boxes"] for t in again.targets]
    ):
        assert np.array_equal(a.numpy(), b.numpy())
    missing = [i for i, row in enumerate(index.rows) if row["file_name"] == "missing_road.jpg"]
    with pytest.raises(UsageError, match="missing_road.jpg: listed in the annotations but cannot be read"):
        index.read(missing)
