"""The per-rank training loop that TorchDistributor runs in every process: ``train_worker(config_dict)``.

Each step: read this rank's micro-batches (``sampler``), match them to the priors where the loss is computed,
sum the positives over all ranks (the global normalizer), run the strategy's forward/backward, step the
optimizer. Rank 0 writes ``RUN/metrics.jsonl`` and ``RUN/progress.json``, checkpoints every N steps and at each
epoch end (resume continues from the last one), evaluates on the val split, keeps ``best.pt`` (val mask AP) and
stops early when the AP stops improving. Returns the run summary on rank 0 (None elsewhere).

Device: one GPU per rank when ``distributed.use_gpu`` says so (``devices``: NCCL for CUDA tensors, gloo for CPU
ones), else the CPU. Micro-batches are built in ``data.loader_workers`` processes (``loader``) and copied to the
device; the forward pass runs under ``train.precision`` (bf16 autocast or f32), the loss in float32.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from model_export.models.checkpoint import load_for_finetune
from model_export.models.yolact import Yolact
from pipelines.io import uris
from pipelines.training import checkpoints as ckpt
from pipelines.training.batches import InputSpec
from pipelines.training.config import TrainConfig
from pipelines.training.devices import parse_use_gpu
from pipelines.training.evaluate import EvalSpec, evaluate
from pipelines.training.loader import LoaderSpec, micro_batch_stream
from pipelines.training.run_state import RankSessionBase, make_optimizer, new_run_state, rank_process
from pipelines.training.sampler import GlobalBatchSampler
from pipelines.training.shards import VAL_ANNOTATIONS_NAME, ShardIndex
from pipelines.training.strategies import DataParallelRunner, TermsInFlight, make_runner
from pipelines.training.topology import Topology, all_reduce_sum, make_topology
from pipelines.training.yolact_loss import LOSS_KEYS, Normalizer, YolactLoss, num_positives

LOG = logging.getLogger(__name__)
HIGHEST_STREAM_PRIORITY = -100  # torch maps a priority beyond the device's range to its nearest end: the highest


def build_model(cfg: TrainConfig) -> Yolact:
    """The YOLACT of the config, identically initialized on every rank (seeded), optionally from a checkpoint."""
    torch.manual_seed(cfg.train.seed)
    model = Yolact(cfg.model.yolact_config())
    if cfg.model.init:
        load_for_finetune(model, cfg.model.init)
    return model


def set_train_mode(model: torch.nn.Module, batch_norm: str) -> None:
    model.train()
    if batch_norm == "frozen":
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
                for param in module.parameters():
                    param.requires_grad_(False)


def autocast_for(device: torch.device, precision: str):
    """The forward pass's autocast context: bf16 -> torch.autocast(bfloat16); f32 -> none."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


class TrainingSession(RankSessionBase):
    LOSS_KEYS = LOSS_KEYS
    AP_KEY = "mask_ap"

    def __init__(self, cfg: TrainConfig, topo: Topology, device: torch.device | None = None):
        self.cfg, self.topo = cfg, topo
        self.rank, self.distributed = topo.rank, topo.distributed
        self.device = device if device is not None else torch.device("cpu")
        self.run_dir = Path(cfg.run_dir)
        self.model = build_model(cfg)
        ycfg = self.model.cfg
        self.input_spec = InputSpec(ycfg.max_size, ycfg.mean, ycfg.std)
        self.loss = YolactLoss(cfg.loss, torch.from_numpy(self.model.priors()))
        # the sizes the loss compares masks at: prototypes and the semantic head (P3)
        self.mask_sizes = (tuple(self.model.proto_size()), tuple(self.model.feature_map_sizes()[0]))
        self.copy_stream = None  # CUDA: the side stream micro-batches are copied on
        self.model = self.model.to(self.device)
        if cfg.train.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        set_train_mode(self.model, cfg.model.batch_norm)
        self.runner = make_runner(
            self.model, topo, self.loss, cfg.train.channels_last, ycfg.max_size, cfg.distributed.pipeline_split
        )
        if cfg.train.cuda_graphs and self.device.type == "cuda" and topo.strategy == "local":
            self.capture_cuda_graphs()
        self.params = {n: p for n, p in self.model.named_parameters() if self.runner.owns(n) and p.requires_grad}
        self.names = {id(p): n for n, p in self.params.items()}
        self.optimizer = make_optimizer(cfg, list(self.params.values()))
        self.train_index = ShardIndex.open(uris.join_uri(cfg.data.prepared, "train"))
        self.sampler = GlobalBatchSampler(
            len(self.train_index), cfg.train.global_batch, cfg.train.micro_batch, cfg.train.seed
        )
        self.sampler.check_data_parallel(topo.dp_size)
        steps = self.sampler.steps_per_epoch * cfg.train.epochs
        self.total_steps = min(steps, cfg.train.max_steps) if cfg.train.max_steps else steps
        self.state = new_run_state()

    def capture_cuda_graphs(self) -> None:
        """train.cuda_graphs: the model's forward and backward captured once for the micro-batch's shape and
        replayed every step (``cuda_graphs``); captured on a placeholder batch, the model's state unchanged."""
        t = self.cfg.train
        images = torch.zeros(t.micro_batch, 3, self.input_spec.size, self.input_spec.size, device=self.device)
        if t.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast_for(self.device, t.precision):
            self.runner.use_cuda_graphs(images)

    # ----------------------------------------------------------------------------------------- checkpoints
    def average_batch_norm_stats(self) -> None:
        """Data-parallel replicas keep their own running statistics; average them before saving/evaluating."""
        if self.topo.dp_size == 1:
            return
        group = self.topo.stage_group if self.topo.strategy == "hybrid" else None
        for name, buffer in self.model.named_buffers():
            if buffer.is_floating_point() and self.runner.owns(name):
                dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
                buffer /= self.topo.dp_size

    def payload(self) -> dict | None:
        """The full checkpoint dict on rank 0 (stages and replicas gathered), None elsewhere."""
        self.average_batch_norm_stats()
        mine = ({}, {})
        if self.topo.dp_rank == 0:
            # checkpoints hold CPU tensors whatever the device: they load and export anywhere
            mine = (
                {
                    k: v.detach().to("cpu", copy=True).contiguous()
                    for k, v in self.model.state_dict().items()
                    if self.runner.owns(k)
                },
                _to_cpu(ckpt.optimizer_state_by_name(self.optimizer, self.names)),
            )
        parts = [mine]
        if self.topo.distributed:
            parts = [None] * self.topo.world if self.topo.rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
        if self.topo.rank != 0:
            return None
        model_state, optimizer_state = {}, {}
        for model_part, optimizer_part in parts:
            model_state.update(model_part)
            optimizer_state.update(optimizer_part)
        ordered = {k: model_state[k] for k in self.model.state_dict()}
        return {
            "model": ordered,
            "optimizer": optimizer_state,
            "state": dict(self.state),
            "config": self.cfg.to_dict(),
            "yolact_config": self.model.cfg.name,
            "max_size": int(self.model.cfg.max_size),
            "class_names": list(self.model.cfg.class_names),
        }

    # ------------------------------------------------------------------------------------------------- eval
    def val_report(self, payload: dict) -> dict:
        """The gathered model's eval report on the val split (rank 0)."""
        model = Yolact(self.model.cfg)
        model.load_state_dict(payload["model"])
        ycfg = self.model.cfg
        post = {
            "conf_thresh": ycfg.conf_thresh,
            "nms_thresh": ycfg.nms_thresh,
            "top_k": ycfg.top_k,
            "max_num_detections": ycfg.max_num_detections,
        }
        spec = EvalSpec(
            uris.join_uri(self.cfg.data.prepared, VAL_ANNOTATIONS_NAME),
            ycfg.class_names,
            tuple(self.cfg.eval.blob_classes),
            self.cfg.eval.max_images,
        )
        started = time.time()
        report = evaluate(
            model.to(self.device),
            ShardIndex.open(uris.join_uri(self.cfg.data.prepared, "val")),
            spec,
            self.input_spec,
            self.loss,
            post,
        )
        return self.eval_record(report, started)

    # ------------------------------------------------------------------------------------------------- train
    def loader_spec(self, epoch: int) -> LoaderSpec:
        d = self.cfg.data
        return LoaderSpec(
            self.input_spec,
            self.cfg.augment,
            self.cfg.train.seed,
            epoch,
            self.mask_sizes,
            d.loader_workers,
            d.loader_prefetch,
            pin_memory=self.device.type == "cuda",
        )

    def epoch_micro_batches(self, epoch: int, first: int, last: int) -> list[list[list[int]]]:
        """Per step from first to last (excluded): this rank's micro-batches (global sample indices)."""
        return [
            self.sampler.micro_batches(epoch, step, self.topo.dp_rank, self.topo.dp_size) for step in range(first, last)
        ]

    def to_device(self, batches: list) -> list:
        """Micro-batches (on the CPU, pinned on a GPU rank) -> on this rank's device, matched to the priors where
        the loss is computed, colours distorted and normalized. The targets go first and are matched before the
        images are sent, so the matching's waits for its counts (positives, the masks_to_train draw) never wait for
        the images' copy. On CUDA all of it, the colour distortion too, runs on a side stream: it overlaps the step
        in flight (filling the device's gaps between that step's kernels), and those waits wait for that stream
        only, never for the step. The side stream has the device's highest priority: its kernels (the matching the
        host waits for, the colour) start as the step's running kernels free the device, not behind its queue."""
        cuda = self.device.type == "cuda"
        if cuda and self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(self.device, priority=HIGHEST_STREAM_PRIORITY)
        with torch.cuda.stream(self.copy_stream) if cuda else nullcontext():
            moved = [mb.targets_to(self.device) for mb in batches]
            self.match(moved)
            moved = [
                dataclasses.replace(mb, images=mb.images.to(self.device, non_blocking=True)).finish_images(
                    self.input_spec
                )
                for mb in moved
            ]
        if cuda:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.copy_stream)
            for mb in moved:
                mb.record_stream(compute)
        return moved

    def match(self, batches: list) -> None:
        """Set each micro-batch's matches and positives count where the loss is computed (the last stage)."""
        if self.topo.last_stage:
            for mb in batches:
                mb.matches = self.loss.match(mb.targets)
                mb.num_positives = num_positives(mb.matches)

    def normalizer(self, batches: list) -> Normalizer:
        """The step's global normalizer: positives of the matched micro-batches summed over the ranks."""
        positives = sum(mb.num_positives for mb in batches) if self.topo.last_stage else 0
        positives = int(all_reduce_sum(torch.tensor([positives], dtype=torch.int64), self.topo))
        return Normalizer(positives, self.cfg.train.global_batch)

    def launch_step(self, batches: list, normalizer: Normalizer, step: int | None = None) -> LaunchedStep:
        """Forward + backward of the step, launched (on a GPU it runs on while the host goes on), its loss terms on
        their way to the host. step: its number (default: the one after the steps done, state["step"])."""
        self.set_learning_rate(step)
        self.optimizer.zero_grad(set_to_none=not self.runner.keeps_grads)
        with autocast_for(self.device, self.cfg.train.precision):
            terms = self.runner.run(batches, normalizer)
        stepped_on_device = self.gates_on_device
        if stepped_on_device:
            self.optimizer.found_inf = self.runner.not_finite(terms)
            self.optimizer.step()
        return LaunchedStep(TermsInFlight(terms), stepped_on_device)

    @property
    def gates_on_device(self) -> bool:
        """Whether the update is launched with the step, gated on the device: a fused optimizer skips it itself when
        the terms are not finite (its found_inf, as under torch.amp.GradScaler), so on a GPU the next step is queued
        without waiting for the host's check. Data-parallel runners only (the pipeline's terms come reduced on the
        host), and not before the optimizer has state: a fused SGD whose first update is skipped keeps momentum
        buffers it never initialized."""
        return (
            bool(self.optimizer.defaults.get("fused"))
            and bool(self.optimizer.state)
            and isinstance(self.runner, DataParallelRunner)
        )

    def finish_step(self, launched: LaunchedStep) -> torch.Tensor:
        """Wait for the step, sum its loss terms over the ranks, step the optimizer unless they are not finite (or
        count it only, when launch_step launched the update already, gated on the device)."""
        return self.step_optimizer(self.runner.reduce(launched.terms), stepped_on_device=launched.stepped_on_device)

    def train_step(self, batches: list) -> torch.Tensor:
        """One step on this rank's micro-batches (batches.MicroBatch, on the CPU) -> the global loss terms."""
        batches = self.to_device(batches)
        return self.finish_step(self.launch_step(batches, self.normalizer(batches)))

    def steps(self, stream, micro_per_step: list[int], settle=lambda k: False):
        """Run len(micro_per_step) steps on micro-batches from stream; yields (loss terms, seconds) of each step, in
        order: its seconds run from its launch (step 0: the fetch of its micro-batches) to the next step's launch
        (the last: to its terms), the caller's time between yields left out, so that a deferred step is not
        charged with the next one's work (a CPU runs a launched step to its end). The
        next step's micro-batches are fetched and sent to the device while this step's forward/backward runs. When a
        step's update was launched with it (gates_on_device), the next step is launched before its terms are read:
        the host's wait for them (a GPU's whole queue) then never leaves the device without work. Not after step k
        where settle(k) is true: a checkpoint after it reads the weights, which the next step must not have changed
        by then."""
        first = self.state["step"]
        count = len(micro_per_step)
        clock = GeneratorClock()
        start = clock.now()  # where this step's time begins: step 0 with its micro-batches' fetch
        pending = self.to_device([next(stream) for _ in range(micro_per_step[0])]) if count else None
        unread = None  # the launched step whose terms are read after the next one is launched
        for k in range(count):
            if k:
                previous_start, start = start, clock.now()
            launched = self.launch_step(pending, self.normalizer(pending), first + k)
            following = self.to_device([next(stream) for _ in range(micro_per_step[k + 1])]) if k + 1 < count else None
            if unread is not None:
                yield from clock.paused((self.finish_step(unread), start - previous_start))
            unread = launched if launched.stepped_on_device and k + 1 < count and not settle(k) else None
            if unread is None:
                terms = self.finish_step(launched)
                yield from clock.paused((terms, clock.now() - start))
            pending = following

    def run(self) -> dict | None:
        self.start_run()
        steps_per_epoch = self.sampler.steps_per_epoch
        while self.training():
            epoch, first = self.state["epoch"], self.state["step_in_epoch"]
            last = min(steps_per_epoch, first + self.total_steps - self.state["step"])
            per_step = self.epoch_micro_batches(epoch, first, last)
            epoch_started = time.time()
            rows = self.train_index.read([i for step in per_step for mb in step for i in mb])
            stream = micro_batch_stream(rows, [mb for step in per_step for mb in step], self.loader_spec(epoch))
            steps = self.steps(
                stream,
                [len(m) for m in per_step],
                settle=lambda k, done=self.state["step"]: self.checkpoint_after(done + k + 1),
            )
            for step_in_epoch, (terms, seconds) in zip(range(first, last), steps):
                self.after_step(epoch, step_in_epoch, steps_per_epoch, terms, seconds)
            stream.close()  # stops the loader's workers
            self.after_epoch(epoch, steps_per_epoch, epoch_started)
        return self.summary(
            {
                "strategy": self.topo.strategy,
                "world": self.topo.world,
                "stages": self.topo.stages,
                "threads_per_process": torch.get_num_threads(),
                "device": str(self.device),
                "precision": self.cfg.train.precision,
            },
            steps_per_epoch,
        )


class GeneratorClock:
    """Seconds a generator spent running: the time its caller holds a yielded value is left out."""

    def __init__(self):
        self.spent, self.resumed = 0.0, time.perf_counter()

    def now(self) -> float:
        return self.spent + time.perf_counter() - self.resumed

    def paused(self, value):
        """`yield from clock.paused(value)`: yield value with the clock stopped until the generator resumes."""
        self.spent = self.now()
        yield value
        self.resumed = time.perf_counter()


def _to_cpu(state: dict) -> dict:
    return {
        name: {k: v.to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in values.items()}
        for name, values in state.items()
    }


@dataclass(frozen=True)
class LaunchedStep:
    """A step that launch_step queued: its loss terms on their way to the host, and whether its update was launched
    with it, gated on the device (gates_on_device)."""

    terms: TermsInFlight
    stepped_on_device: bool


def train_worker(config: dict) -> dict | None:
    """Entry point of every TorchDistributor process (env RANK, WORLD_SIZE, MASTER_ADDR/PORT set by torchrun)."""
    cfg = TrainConfig.from_dict(config)
    with rank_process(cfg.distributed.threads_per_process, parse_use_gpu(cfg.distributed.use_gpu)) as device:
        topo = make_topology(cfg.distributed.strategy, cfg.distributed.pipeline_stages)
        return TrainingSession(cfg, topo, device).run()
