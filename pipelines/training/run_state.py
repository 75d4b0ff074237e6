"""What the YOLACT and the detector training loops share: the run's bookkeeping on every rank.

``RankSessionBase`` keeps the resumable state (step, epoch, best AP, early stopping), writes RUN/metrics.jsonl and
RUN/progress.json on rank 0, resumes from the newest checkpoint, keeps best.pt, and counts the images/s and the
epoch times of the summary. A subclass (``trainer.TrainingSession``, ``detector_trainer.DetectorTrainingSession``)
builds the model, optimizer and sampler and sets ``rank``, ``distributed``, ``LOSS_KEYS`` and ``AP_KEY``; it
supplies ``payload()`` (rank 0's checkpoint dict) and ``val_report(payload)`` (rank 0's raw eval report).

``rank_process`` sets up (and tears down) one TorchDistributor process: threads, device, process group; the process
ends with its torchrun (end_with_parent).

Torch only (no pyspark): the detector trains without Spark too.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pipelines.training import checkpoints as ckpt
from pipelines.training.devices import backend_for, configure_device, rank_device

if TYPE_CHECKING:
    from pipelines.training.config import TrainConfig
    from pipelines.training.detector_config import DetectorTrainConfig

METRICS_NAME = "metrics.jsonl"
PROGRESS_NAME = "progress.json"
WARMUP_STEPS_EXCLUDED = 2  # steps left out of the images/s average (first-touch allocations, thread spin-up)
SHARED_EVAL_KEYS = ("best_ap", "best_epoch", "bad_evals", "stopped_early")


def new_run_state() -> dict:
    """The resumable state of a run before its first step."""
    return {
        "step": 0,
        "epoch": 0,
        "step_in_epoch": 0,
        "best_ap": -1.0,
        "best_epoch": -1,
        "bad_evals": 0,
        "stopped_early": False,
        "skipped_steps": 0,
    }


def learning_rate(cfg, step: int, total_steps: int) -> float:
    """Linear warmup from warmup_init_lr, then lr times lr_gamma per passed milestone (fractions of the steps)."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.warmup_init_lr + (t.lr - t.warmup_init_lr) * step / max(t.warmup_steps, 1)
    passed = sum(1 for m in t.lr_milestones if step >= float(m) * total_steps)
    return t.lr * t.lr_gamma**passed


def make_optimizer(cfg, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """SGD or AdamW of train, fused (CPUs and GPUs: one pass over all tensors per step, not an operation per tensor;
    a fused optimizer can skip its update on the device, see trainer.TrainingSession.gates_on_device)."""
    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay, fused=True)
    return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay, fused=True)


@contextmanager
def rank_process(threads: int, use_gpu) -> Iterator[torch.device]:
    """One TorchDistributor process: torch threads, this rank's device (use_gpu "auto" / True / False) and the
    process group when torchrun's env says so; the group is destroyed on the way out."""
    end_with_parent()
    torch.set_num_threads(threads)
    device = rank_device(torch.cuda.is_available() if use_gpu == "auto" else bool(use_gpu))
    configure_device(device)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group(backend_for(device))
    try:
        yield device
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent() -> None:
    """On Linux, this process is killed (SIGKILL) when its parent ends. torchrun starts each rank in a session of its
    own, so a job killed as a whole (`kill -9` of its process group, a closed terminal) would otherwise leave its
    ranks training on alone, writing checkpoints into the run directory that the next run resumes from."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


SCHEDULE_SETTINGS = (
    ("train", "epochs"),
    ("train", "max_steps"),
    ("train", "global_batch"),
    ("train", "lr"),
    ("train", "lr_milestones"),
    ("train", "warmup_steps"),
    ("model", "max_size"),
)


def schedule_changes(before: dict, now: dict) -> list[str]:
    """'train.epochs 10 -> 12' for each setting of the steps and the learning-rate schedule that differs between
    a checkpoint's run config (`before`; {} for none recorded) and this run's."""
    changes = []
    for section, key in SCHEDULE_SETTINGS:
        old, new = (before.get(section) or {}).get(key), (now.get(section) or {}).get(key)
        if section in before and key in before[section] and old != new:
            changes.append(f"{section}.{key} {old!r} -> {new!r}")
    return changes


class RankSessionBase:
    LOSS_KEYS: tuple = ()
    AP_KEY = ""  # the eval report's AP that decides best.pt and early stopping

    cfg: TrainConfig | DetectorTrainConfig
    run_dir: Path
    rank: int
    distributed: bool
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: dict
    state: dict
    total_steps: int

    # ---------------------------------------------------------------------------------------------- metrics
    def _log(self, record: dict) -> None:
        with (self.run_dir / METRICS_NAME).open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def _progress(self, **values) -> None:
        path = self.run_dir / PROGRESS_NAME
        temp = path.with_name(".progress.tmp")
        temp.write_text(json.dumps(values))
        os.replace(temp, path)

    def _truncate_metrics(self, step: int) -> None:
        path = self.run_dir / METRICS_NAME
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if _step_of(line) <= step]
        path.write_text("".join(line + "\n" for line in kept))

    # ----------------------------------------------------------------------------------------------- resume
    def optimizer_state_to_load(self, state: dict) -> dict:
        """A checkpoint's optimizer state (by parameter name) as this session loads it."""
        return state

    def resume(self) -> None:
        path = ckpt.latest_checkpoint(self.run_dir) if self.cfg.checkpoint.resume else None
        if path is None:
            if self.rank == 0:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                (self.run_dir / METRICS_NAME).write_text("")
            return
        payload = ckpt.load_checkpoint(path)
        self.model.load_state_dict(payload["model"])
        ckpt.load_optimizer_state(self.optimizer, self.params, self.optimizer_state_to_load(payload["optimizer"]))
        self.state.update(payload["state"])
        if self.rank == 0:
            self._truncate_metrics(self.state["step"])
            # stdout, not the log: TorchDistributor passes the ranks' stdout on (tests read this line)
            print(f"resumed from {path} at step {self.state['step']} (epoch {self.state['epoch']})", flush=True)
            changed = schedule_changes(payload.get("config") or {}, self.cfg.to_dict())
            if changed:
                print(
                    f"warning: this run goes on with other settings than the checkpoint's ({', '.join(changed)}): "
                    "the learning rate's milestones are fractions of the whole run, so its schedule changes from "
                    "here; a new run_dir starts afresh",
                    flush=True,
                )
            if not self.training():
                print(
                    f"the run in {self.run_dir} is finished (step {self.state['step']} of {self.total_steps}): "
                    "nothing to train; give it more train.epochs, or a new run_dir",
                    flush=True,
                )

    # ----------------------------------------------------------------------------------------- checkpoints
    def payload(self) -> dict | None:
        """Rank 0's checkpoint dict (CPU tensors), None elsewhere; every rank calls it."""
        raise NotImplementedError

    def checkpoint(self) -> dict | None:
        payload = self.payload()
        if payload is not None:
            ckpt.save_step_checkpoint(self.run_dir, payload, self.cfg.checkpoint.keep_last)
        return payload

    # ------------------------------------------------------------------------------------------------- eval
    def val_report(self, payload: dict) -> dict | None:
        """Rank 0: the eval report of the checkpointed model (None: nothing to evaluate on)."""
        raise NotImplementedError

    def eval_record(self, report: dict, started: float) -> dict:
        report.update(
            {
                "kind": "eval",
                "epoch": self.state["epoch"],
                "step": self.state["step"],
                "eval_seconds": round(time.time() - started, 2),
            }
        )
        return report

    def evaluate(self, payload: dict | None) -> dict | None:
        """Rank 0 evaluates, keeps best.pt and counts the evals without progress; every rank learns whether to
        stop early."""
        report = self.val_report(payload) if self.rank == 0 else None
        if report is not None:
            if report[self.AP_KEY] > self.state["best_ap"] + self.cfg.eval.min_delta:
                self.state.update(best_ap=report[self.AP_KEY], best_epoch=self.state["epoch"], bad_evals=0)
                ckpt.save_checkpoint(
                    ckpt.checkpoint_dir(self.run_dir) / ckpt.BEST_NAME,
                    {**payload, "state": dict(self.state), "eval": report},
                )
            else:
                self.state["bad_evals"] += 1
            patience = self.cfg.eval.early_stopping_patience
            self.state["stopped_early"] = bool(patience and self.state["bad_evals"] >= patience)
            self._log(report)
        if self.distributed:
            shared = [{k: self.state[k] for k in SHARED_EVAL_KEYS}]
            dist.broadcast_object_list(shared, src=0)
            self.state.update(shared[0])
        return report

    # ------------------------------------------------------------------------------------------------ steps
    def set_learning_rate(self, step: int | None = None) -> None:
        """The schedule's rate for `step` (default: the step that runs next, state["step"])."""
        rate = learning_rate(self.cfg, self.state["step"] if step is None else step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def step_optimizer(self, terms: torch.Tensor, stepped_on_device: bool = False) -> torch.Tensor:
        """Step the optimizer on the global loss terms unless they are not finite (then count a skipped step).
        stepped_on_device: the update was launched already, gated on the device: only counted here."""
        if not math.isfinite(float(terms.sum())):
            self.state["skipped_steps"] += 1
        elif not stepped_on_device:
            self.optimizer.step()
        return terms

    # -------------------------------------------------------------------------------------------------- run
    def start_run(self) -> None:
        """Resume, and start the images/s and epoch-time counts of the summary."""
        self.resume()
        self.timed_images, self.timed_seconds, self.epoch_seconds = 0, 0.0, []
        self.first_step = self.state["step"]

    def training(self) -> bool:
        """Whether another epoch runs: epochs left, no early stop, steps left."""
        return (
            self.state["epoch"] < self.cfg.train.epochs
            and not self.state["stopped_early"]
            and self.state["step"] < self.total_steps
        )

    def after_step(
        self, epoch: int, step_in_epoch: int, steps_per_epoch: int, terms: torch.Tensor, seconds: float
    ) -> None:
        """Count the step, write its metrics and progress (rank 0), checkpoint every checkpoint.every_steps."""
        self.state["step"] += 1
        self.state["step_in_epoch"] = step_in_epoch + 1
        if self.state["step"] > WARMUP_STEPS_EXCLUDED:
            self.timed_images += self.cfg.train.global_batch
            self.timed_seconds += seconds
        if self.rank == 0:
            record = {
                "kind": "step",
                "step": self.state["step"],
                "epoch": epoch,
                "lr": (
                    learning_rate(self.cfg, self.state["step"] - 1, self.total_steps)
                    if self.optimizer.param_groups
                    else 0.0
                ),
                "loss": float(terms.sum()),
                **{k: float(v) for k, v in zip(self.LOSS_KEYS, terms)},
                "step_seconds": round(seconds, 4),
                "images_per_second": round(self.cfg.train.global_batch / seconds, 3),
            }
            self._log(record)
            self._progress(
                epoch=epoch,
                epochs=self.cfg.train.epochs,
                step_in_epoch=step_in_epoch + 1,
                steps_per_epoch=steps_per_epoch,
                loss=record["loss"],
                images_per_second=record["images_per_second"],
            )
        if self.checkpoint_after(self.state["step"]) and self.state["step_in_epoch"] < steps_per_epoch:
            self.checkpoint()

    def checkpoint_after(self, steps_done: int) -> bool:
        """Whether a checkpoint is written once `steps_done` steps are done (every checkpoint.every_steps; the end
        of an epoch writes one too, see after_epoch)."""
        every = self.cfg.checkpoint.every_steps
        return bool(every) and steps_done % every == 0

    def after_epoch(self, epoch: int, steps_per_epoch: int, epoch_started: float) -> None:
        """Close the epoch: its time, the epoch record, a checkpoint, and the eval when it is due."""
        epoch_done = self.state["step_in_epoch"] >= steps_per_epoch
        self.epoch_seconds.append(round(time.time() - epoch_started, 3))
        if epoch_done:
            self.state.update(epoch=epoch + 1, step_in_epoch=0)
        last = self.state["epoch"] >= self.cfg.train.epochs or self.state["step"] >= self.total_steps
        every = self.cfg.eval.every_epochs  # 0: never evaluate
        evaluate_now = every > 0 and (last or (epoch_done and self.state["epoch"] % every == 0))
        if self.rank == 0:
            self._log(
                {"kind": "epoch", "epoch": epoch, "step": self.state["step"], "epoch_seconds": self.epoch_seconds[-1]}
            )
        payload = self.checkpoint()
        if evaluate_now:
            self.evaluate(payload)
            if payload is not None:  # the best/patience counters belong in the resumable state too
                payload["state"] = dict(self.state)
                ckpt.save_step_checkpoint(self.run_dir, payload, self.cfg.checkpoint.keep_last)

    def summary(self, head: dict, steps_per_epoch: int) -> dict | None:
        """Rank 0: the run summary, head's entries first; None elsewhere."""
        if self.rank != 0:
            return None
        return {
            **head,
            "state": dict(self.state),
            "total_steps": self.total_steps,
            "steps_per_epoch": steps_per_epoch,
            "steps_this_run": self.state["step"] - self.first_step,
            "images_per_second": round(self.timed_images / self.timed_seconds, 3) if self.timed_seconds else None,
            "epoch_seconds": self.epoch_seconds,
        }


def _step_of(metrics_line: str) -> float:
    """The step a RUN/metrics.jsonl line records; inf (never kept) for a line a full disk cut short."""
    try:
        return json.loads(metrics_line).get("step", 0)
    except ValueError:
        return float("inf")
