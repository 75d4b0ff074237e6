"""After a run: speed figures (images/s, epoch time, speedup T1/Tp and efficiency against a `local` baseline),
loss and AP curves as PNG (matplotlib), everything logged to MLflow (a local file store by default).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pipelines.io import uris

CURVES_PNG = "loss_curves.png"
AP_PNG = "val_ap.png"


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def speed_report(summary: dict, baseline: dict | None) -> dict:
    """images/s and mean epoch seconds; with a baseline (a local run's summary): speedup = T1 / Tp (time per image,
    i.e. throughput ratio) and efficiency = speedup / processes."""
    epochs = summary.get("epoch_seconds") or []
    report = {
        "images_per_second": summary.get("images_per_second"),
        "epoch_seconds_mean": round(sum(epochs) / len(epochs), 3) if epochs else None,
        "processes": summary.get("world", 1),
    }
    base = None
    if baseline:
        base = baseline.get("speed", {}).get("images_per_second") or baseline.get("images_per_second")
    if base and report["images_per_second"]:
        report["speedup"] = round(report["images_per_second"] / base, 3)
        report["efficiency"] = round(report["speedup"] / max(report["processes"], 1), 3)
    return report


YOLACT_LOSS_KEYS = ("box", "conf", "mask", "semantic")


def plot_curves(metrics: list[dict], out_dir: str | Path, loss_keys: tuple[str, ...] = YOLACT_LOSS_KEYS) -> list[Path]:
    """Train loss per step (and per term `loss_keys`), val loss and val AP per evaluation -> PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    steps = [m for m in metrics if m.get("kind") == "step"]
    evals = [m for m in metrics if m.get("kind") == "eval"]
    written = []
    if steps:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = [m["step"] for m in steps]
        ax.plot(xs, [m["loss"] for m in steps], label="train loss", linewidth=1.2)
        for key in loss_keys:
            ax.plot(xs, [m[key] for m in steps], label=f"train {key}", linewidth=0.6, alpha=0.7)
        if evals and "val_loss" in evals[0]:
            ax.plot([m["step"] for m in evals], [m["val_loss"] for m in evals], "o-", label="val loss")
        ax.set_yscale("log")
        written.append(_save_plot(fig, ax, "step", "loss", out_dir / CURVES_PNG))
    if evals:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = [m["epoch"] + 1 for m in evals]
        for key in ("mask_ap", "box_ap", "mask_ap_blobs", "mask_ap_crack", "box_ap_blobs", "box_ap_crack"):
            if key in evals[0]:
                ax.plot(xs, [m[key] for m in evals], "o-", label=key)
        written.append(_save_plot(fig, ax, "epoch", "COCO AP@[.5:.95] (val)", out_dir / AP_PNG))
    return written


def _save_plot(fig, ax, xlabel: str, ylabel: str, path: Path) -> Path:
    """Label, legend and grid the axes, write the figure to `path` and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _mlflow_uri(uri: str) -> str:
    """Plain paths become file: stores (MLflow 3 needs MLFLOW_ALLOW_FILE_STORE for them: set for this process)."""
    if uris.scheme_of(uri) in ("", "file"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return Path(uris.to_local_path(uri)).resolve().as_uri()
    return uri


def _step_metrics(metrics: list[dict], loss_keys: tuple[str, ...]) -> list[tuple[str, float, int]]:
    """(key, value, step) for each logged figure of the training log's step, eval and epoch records."""
    out: list[tuple[str, float, int]] = []
    for m in metrics:
        if m.get("kind") == "step":
            out += [(f"train_{k}", m[k], m["step"]) for k in ("loss", *loss_keys, "lr", "images_per_second")]
        elif m.get("kind") == "eval":
            out += [
                (k, v, m["step"])
                for k, v in m.items()
                if isinstance(v, (int, float)) and k not in ("step", "epoch", "kind")
            ]
        elif m.get("kind") == "epoch":
            out.append(("epoch_seconds", m["epoch_seconds"], m["step"]))
    return out


def log_to_mlflow(
    tracking: dict,
    params: dict,
    metrics: list[dict],
    summary: dict,
    artifacts: list[Path],
    loss_keys: tuple[str, ...] = YOLACT_LOSS_KEYS,
) -> str:
    """One MLflow run: params, step metrics, eval metrics, speed, artifacts. Returns the run id.

    Through a client bound to the configured store: MLflow's fluent API would set the tracking URI and the experiment
    (MLFLOW_EXPERIMENT_ID) for the whole process, and a later registration in the same process (a notebook that
    trains, then exports) would log to this store instead of the one its environment names."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunStatus

    client = MlflowClient(tracking_uri=_mlflow_uri(tracking["mlflow_uri"]))
    experiment = client.get_experiment_by_name(tracking["experiment"])
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(tracking["experiment"])
    run_id = client.create_run(experiment_id, run_name=tracking.get("run_name")).info.run_id
    status = RunStatus.to_string(RunStatus.FAILED)
    try:
        now = int(time.time() * 1000)
        client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
        speed = [(k, v, 0) for k, v in summary.get("speed", {}).items() if isinstance(v, (int, float))]
        figures = [Metric(k, float(v), now, step) for k, v, step in _step_metrics(metrics, loss_keys) + speed]
        for i in range(0, len(figures), 1000):  # MLflow's limit on metrics per batch
            client.log_batch(run_id, metrics=figures[i : i + 1000])
        for path in artifacts:
            if Path(path).exists():
                client.log_artifact(run_id, str(path))
        status = RunStatus.to_string(RunStatus.FINISHED)
    finally:
        client.set_terminated(run_id, status)
    return run_id
