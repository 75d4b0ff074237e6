"""The per-rank training loop of the detector (FactorNet Faster R-CNN): ``detector_train_worker(config_dict)``,
run by TorchDistributor in every process (or directly, in one process, without Spark: ``__main__`` below).

Each step: this rank's micro-batches of the global batch (``GlobalBatchSampler``, as YOLACT), forward in train
mode (torchvision's loss dict), backward with gradient accumulation (DDP all-reduces on the last micro-batch),
optimizer step. Rank 0 writes RUN/metrics.jsonl and RUN/progress.json, checkpoints every N steps and at each epoch
end (resume continues from the newest), evaluates box AP on the val split and keeps best.pt (val box AP).

Without Spark (one machine, e.g. a GPU box with no Java; data read straight from a COCO folder, no val split):
    python -m pipelines.training.detector_trainer --config conf/train_detector.yaml --device cuda \
        --set data.images=DIR --set data.annotations=FILE --set run_dir=RUN
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from model_export.detector_export import load_detector_checkpoint
from model_export.models.factornet_detector import FactorNetDetector, get_detector_config
from pipelines.errors import UsageError, report_error
from pipelines.io import uris
from pipelines.training import checkpoints as ckpt
from pipelines.training.detector_config import DetectorTrainConfig, load_detector_train_config
from pipelines.training.detector_evaluate import DetectorEvalSpec, evaluate_detector
from pipelines.training.detector_sources import CocoFolderIndex
from pipelines.training.detector_step import LOSS_KEYS, detector_step, make_detector_batch
from pipelines.training.devices import configure_device, rank_device, resolve_use_gpu
from pipelines.training.run_state import RankSessionBase, make_optimizer, new_run_state, rank_process
from pipelines.training.sampler import GlobalBatchSampler
from pipelines.training.shards import VAL_ANNOTATIONS_NAME, ShardIndex
from pipelines.training.train_job import set_overrides

log = logging.getLogger(__name__)


def build_detector(cfg: DetectorTrainConfig) -> FactorNetDetector:
    """The config's detector, identically initialized on every rank (seeded), optionally from a checkpoint."""
    torch.manual_seed(cfg.train.seed)
    model = FactorNetDetector(cfg.model.detector_config())
    if cfg.model.init:
        load_detector_checkpoint(model, cfg.model.init)
    return model


class DetectorTrainingSession(RankSessionBase):
    LOSS_KEYS = LOSS_KEYS
    AP_KEY = "box_ap"

    def __init__(self, cfg: DetectorTrainConfig, device: torch.device, train_index, val_index=None):
        self.cfg, self.device = cfg, device
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.distributed = self.world > 1
        self.run_dir = Path(cfg.run_dir)
        self.model = build_detector(cfg).to(device)
        self.input_size = tuple(self.model.cfg.input_size)
        self.model.train()
        self.ddp = None
        if self.world > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.names = {id(p): n for n, p in self.params.items()}
        self.optimizer = make_optimizer(cfg, list(self.params.values()))
        self.train_index, self.val_index = train_index, val_index
        self.sampler = GlobalBatchSampler(
            len(train_index), cfg.train.global_batch, cfg.train.micro_batch, cfg.train.seed
        )
        self.sampler.check_data_parallel(self.world)
        steps = self.sampler.steps_per_epoch * cfg.train.epochs
        self.total_steps = min(steps, cfg.train.max_steps) if cfg.train.max_steps else steps
        self.state = new_run_state()

    def optimizer_state_to_load(self, state: dict) -> dict:
        return {
            n: {k: v.to(self.device) if torch.is_tensor(v) and v.dim() else v for k, v in s.items()}
            for n, s in state.items()
        }

    def payload(self) -> dict | None:
        """Rank 0's checkpoint dict (CPU tensors: loads anywhere); replicas' batch-norm statistics averaged."""
        if self.world > 1:
            for buffer in self.model.buffers():
                if buffer.is_floating_point():
                    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
                    buffer /= self.world
        if self.rank != 0:
            return None
        model_state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        optimizer_state = {
            n: {k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()}
            for n, s in ckpt.optimizer_state_by_name(self.optimizer, self.names).items()
        }
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "state": dict(self.state),
            "config": self.cfg.to_dict(),
            "detector_config": self.model.cfg.name,
        }

    def val_report(self, payload: dict) -> dict | None:
        if self.val_index is None:
            return None
        spec = DetectorEvalSpec(
            uris.join_uri(self.cfg.data.prepared, VAL_ANNOTATIONS_NAME),
            tuple(self.model.cfg.class_names),
            tuple(self.cfg.eval.blob_classes),
            self.cfg.eval.max_images,
        )
        started = time.time()
        report = evaluate_detector(self.model, self.val_index, spec, self.input_size, self.device)
        self.model.train()
        return self.eval_record(report, started)

    def train_step(self, rows: dict, epoch: int, step_in_epoch: int) -> torch.Tensor:
        micro = self.sampler.micro_batches(epoch, step_in_epoch, self.rank, self.world)
        augment_cfg = self.cfg.augment.as_augment_config()
        batches = [
            make_detector_batch(rows, idx, self.input_size, augment_cfg, self.cfg.train.seed, epoch) for idx in micro
        ]
        self.set_learning_rate()
        self.optimizer.zero_grad(set_to_none=True)
        terms = detector_step(
            self.ddp or self.model,
            batches,
            self.rank * len(micro),
            self.sampler.micro_batches_per_step,
            self.cfg.train.seed,
            self.state["step"],
            self.device,
        )
        if self.world > 1:
            dist.all_reduce(terms, op=dist.ReduceOp.SUM)
        return self.step_optimizer(terms)

    def run(self) -> dict | None:
        self.start_run()
        steps_per_epoch = self.sampler.steps_per_epoch
        while self.training():
            epoch, first = self.state["epoch"], self.state["step_in_epoch"]
            epoch_started = time.time()
            rows = self.train_index.read(self.sampler.epoch_indices(epoch, self.rank, self.world, first))
            for step_in_epoch in range(first, steps_per_epoch):
                if self.state["step"] >= self.total_steps:
                    break
                started = time.time()
                terms = self.train_step(rows, epoch, step_in_epoch)
                self.after_step(epoch, step_in_epoch, steps_per_epoch, terms, time.time() - started)
            self.after_epoch(epoch, steps_per_epoch, epoch_started)
        return self.summary(
            {
                "strategy": self.cfg.distributed.strategy,
                "world": self.world,
                "stages": 1,
                "device": str(self.device),
                "threads_per_process": torch.get_num_threads(),
            },
            steps_per_epoch,
        )


def detector_train_worker(config: dict) -> dict | None:
    """Entry point of every TorchDistributor process: ranks read the prepared shards (train and val)."""
    cfg = DetectorTrainConfig.from_dict(config)
    # distributed.use_gpu: resolved to True / False by the launcher
    with rank_process(cfg.distributed.threads_per_process, cfg.distributed.use_gpu) as device:
        train = ShardIndex.open(uris.join_uri(cfg.data.prepared, "train"))
        val = ShardIndex.open(uris.join_uri(cfg.data.prepared, "val"))
        summary = DetectorTrainingSession(cfg, device, train, val).run()
        if dist.is_initialized():
            # TorchDistributor's local mode keeps the return value of whichever rank writes it last: give every
            # rank rank 0's summary.
            shared = [summary]
            dist.broadcast_object_list(shared, src=0)
            summary = shared[0]
        return summary


def train_from_folder(cfg: DetectorTrainConfig) -> dict:
    """One process, no Spark: every annotated image of data.images / data.annotations trains; no val split
    (evaluate the export with jobs/infer_detector.py and pipelines.report.evaluate)."""
    torch.set_num_threads(cfg.distributed.threads_per_process)
    if cfg.distributed.strategy != "local":
        raise SystemExit(
            "error: training from a folder runs strategy local (one process); use jobs/train_detector.py for ddp"
        )
    class_names = get_detector_config(cfg.model.config).class_names
    index = CocoFolderIndex.open(cfg.data.images, cfg.data.annotations, tuple(class_names))
    device = rank_device(resolve_use_gpu(cfg.distributed.use_gpu, local_mode=True))
    configure_device(device)
    return DetectorTrainingSession(cfg, device, index, None).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML (default conf/train_detector.yaml)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="sets distributed.use_gpu (auto/false/true)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    overrides = set_overrides(args.set)
    if args.device:
        overrides["distributed.use_gpu"] = {"auto": "auto", "cpu": False, "cuda": True}[args.device]
    overrides["eval.every_epochs"] = 0

    started = time.time()
    try:
        cfg = load_detector_train_config(args.config, overrides)
        summary = train_from_folder(cfg)
    except UsageError as err:
        return report_error(err)
    summary["wall_seconds"] = round(time.time() - started, 1)
    (Path(cfg.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
