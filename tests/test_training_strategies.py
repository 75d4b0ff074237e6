"""Distributed strategies on a real TorchDistributor (local mode, gloo, CPU): DDP with 2 processes trains exactly
like 1 process with the same global batch; the GPipe pipeline's gradients equal the unsplit model's on the same
micro-batches; pipeline and hybrid (data-parallel pipelines) run end to end with the same losses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pipelines.training.launcher import REPO_ROOT, run_training
from tests.fixtures_training import tiny_config, tiny_prepared, tiny_roads  # noqa: F401


def step_losses(run_dir: Path) -> np.ndarray:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return np.array(
        [
            [m["loss"], m["box"], m["conf"], m["mask"], m["semantic"]]
            for m in map(json.loads, lines)
            if m["kind"] == "step"
        ]
    )


@pytest.fixture(scope="module")
def local_run(spark, tiny_roads, tiny_prepared, tmp_path_factory) -> Path:
    import mlflow

    run_dir = tmp_path_factory.mktemp("local")
    before = (mlflow.get_tracking_uri(), os.environ.get("MLFLOW_EXPERIMENT_ID"))
    summary = run_training(spark, tiny_config(tiny_roads, tiny_prepared, run_dir, **{"tracking.plots": True}))
    assert summary["strategy"] == "local" and summary["world"] == 1
    assert summary["speed"]["images_per_second"] > 0
    # the run's store is the config's, not the process's: a later registration reads its own environment
    assert (mlflow.get_tracking_uri(), os.environ.get("MLFLOW_EXPERIMENT_ID")) == before
    return run_dir


def test_run_is_plotted_and_logged_to_mlflow(local_run):
    import mlflow

    assert (local_run / "loss_curves.png").stat().st_size > 0
    summary = json.loads((local_run / "summary.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=(local_run / "mlruns").as_uri())
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["strategy"] == "local"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == [1, 2, 3]
    assert "images_per_second" in run.data.metrics


def test_ddp_two_processes_equals_one_process(spark, tiny_roads, tiny_prepared, local_run, tmp_path):
    summary = run_training(
        spark,
        tiny_config(
            tiny_roads,
            tiny_prepared,
            tmp_path,
            **{
                "distributed.strategy": "ddp",
                "distributed.num_processes": 2,
                "tracking.baseline": str(local_run / "summary.json"),
            },
        ),
    )
    assert summary["world"] == 2 and summary["state"]["step"] == 3
    assert summary["speed"]["efficiency"] == pytest.approx(summary["speed"]["speedup"] / 2, abs=1e-3)
    expected, got = step_losses(local_run), step_losses(tmp_path)
    assert got.shape == expected.shape == (3, 5)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-5)
    assert len(set(np.round(expected[:, 0], 4))) == 3, "the loss must change from step to step"


def test_hybrid_two_pipelines_of_two_stages_runs_end_to_end(spark, tiny_roads, tiny_prepared, local_run, tmp_path):
    summary = run_training(
        spark,
        tiny_config(
            tiny_roads,
            tiny_prepared,
            tmp_path,
            **{
                "distributed.strategy": "hybrid",
                "distributed.num_processes": 4,
                "distributed.pipeline_stages": 2,
                "checkpoint.every_steps": 2,
            },
        ),
    )
    assert (summary["world"], summary["stages"], summary["state"]["step"]) == (4, 2, 3)
    np.testing.assert_allclose(step_losses(tmp_path), step_losses(local_run), rtol=2e-4, atol=1e-5)
    assert (tmp_path / "checkpoints" / "step_00000002.pt").is_file()  # stages gathered into one checkpoint


def pipeline_gradient_check(split):
    """Runs on every rank: one GPipe step with 4 micro-batches on 2 stages; rank 0 compares every parameter's
    gradient with the unsplit model run on the same micro-batches."""
    import torch
    import torch.distributed as dist

    from model_export.models.yolact import Yolact, get_config
    from pipelines.training.loss_targets import Targets
    from pipelines.training.strategies import PipelineRunner
    from pipelines.training.topology import make_topology
    from pipelines.training.yolact_loss import LossConfig, Normalizer, YolactLoss, num_positives

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    topo = make_topology("pipeline", 2)

    def fresh_model():
        torch.manual_seed(0)
        return Yolact(get_config("yolact_r18_small", max_size=64)).train()

    generator = torch.Generator().manual_seed(1)

    class MicroBatch:
        def __init__(self):
            self.images = torch.randn(2, 3, 64, 64, generator=generator)
            self.targets = []
            for _ in range(2):
                masks = torch.zeros(2, 64, 64)
                masks[0, 8:30, 10:40] = 1
                masks[1, 35:60, 20:50] = 1
                boxes = torch.tensor([[10 / 64, 8 / 64, 40 / 64, 30 / 64], [20 / 64, 35 / 64, 50 / 64, 60 / 64]])
                self.targets.append(Targets(boxes, torch.tensor([0, 2]), masks, seed=3))
            self.matches = None

    model = fresh_model()
    loss = YolactLoss(LossConfig(), torch.from_numpy(model.priors()))
    batches = [MicroBatch() for _ in range(4)]
    for mb in batches:
        mb.matches = loss.match(mb.targets)
    normalizer = Normalizer(sum(num_positives(mb.matches) for mb in batches), 8)
    runner = PipelineRunner(model, topo, loss, channels_last=False, input_size=64, split=split)
    terms = runner.run(batches, normalizer)
    mine = {name: p.grad.clone() for name, p in runner.named_parameters()}
    gathered = [None, None] if topo.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    result = None
    if topo.rank == 0:
        reference = fresh_model()
        total = torch.zeros(4)
        for mb in batches:
            sums = loss.sums(reference(mb.images), mb.targets, mb.matches)
            values = normalizer.apply(sums)
            sum(values.values()).backward()
            total += torch.stack([v.detach() for v in values.values()])
        pipeline_grads = {**gathered[0], **gathered[1]}
        expected = {n: p.grad for n, p in reference.named_parameters()}
        worst = max(float((pipeline_grads[n] - g).abs().max() / (g.abs().max() + 1e-12)) for n, g in expected.items())
        result = {
            "params": len(pipeline_grads),
            "expected": len(expected),
            "worst_relative": worst,
            "terms": terms.tolist(),
            "reference_terms": total.tolist(),
            "stage_sizes": [len(gathered[0]), len(gathered[1])],
        }
    dist.destroy_process_group()
    return result


@pytest.mark.parametrize("split", [None, [2]])
def test_pipeline_gradients_equal_the_unsplit_model(spark, split, monkeypatch):
    from pyspark.ml.torch.distributor import TorchDistributor

    # for this test's ranks only: a PYTHONPATH left behind would reach every process later tests start (a cluster's
    # executors importing the checkout instead of their own env)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    result = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(pipeline_gradient_check, split)
    assert result["params"] == result["expected"]
    assert min(result["stage_sizes"]) > 0
    assert result["worst_relative"] < 1e-4, result
    np.testing.assert_allclose(result["terms"], result["reference_terms"], rtol=1e-5)


def test_evaluation_best_checkpoint_and_early_stopping(spark, tiny_roads, tiny_prepared, tmp_path):
    # min_delta 10 makes every evaluation "no better": patience 1 stops after the first epoch of three
    summary = run_training(
        spark,
        tiny_config(
            tiny_roads,
            tiny_prepared,
            tmp_path,
            **{
                "train.max_steps": 0,
                "train.epochs": 3,
                "eval.every_epochs": 1,
                "eval.early_stopping_patience": 1,
                "eval.min_delta": 10.0,
            },
        ),
    )
    assert summary["state"]["stopped_early"] and summary["state"]["epoch"] == 1
    evaluation = summary["last_eval"]
    for key in ("box_ap", "mask_ap", "mask_ap_blobs", "mask_ap_crack", "val_loss"):
        assert key in evaluation and np.isfinite(evaluation[key])
    assert not (tmp_path / "checkpoints" / "best.pt").exists()

    better = tmp_path / "better"
    summary = run_training(
        spark,
        tiny_config(
            tiny_roads, tiny_prepared, better, **{"train.max_steps": 0, "train.epochs": 1, "eval.every_epochs": 1}
        ),
    )
    from pipelines.training.checkpoints import load_checkpoint

    best = load_checkpoint(better / "checkpoints" / "best.pt")
    assert best["eval"]["mask_ap"] == summary["state"]["best_ap"]
    assert set(best) >= {"model", "optimizer", "state", "config"}
