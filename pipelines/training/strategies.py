"""One training step (forward + backward over this rank's micro-batches) for each strategy.

- ``local``: one process, micro-batches in sequence, gradients accumulated (threads inside torch).
- ``ddp``: ``DistributedDataParallel``; each replica runs its block of micro-batches (gradient sync only on the
  last, ``no_sync`` before); its loss is scaled by the replica count because DDP averages gradients.
- ``pipeline``: the model cut into stages (``stages.make_stages``) on consecutive ranks, GPipe schedule
  (``pipeline.gpipe_step``).
- ``hybrid``: data-parallel replicas of that pipeline; after the GPipe step each stage's gradients are summed over
  the replicas holding the same stage.

Every rank returns the global loss terms of the step (summed over ranks), the same numbers for every strategy.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from pipelines.training.cuda_graphs import GraphedModel
from pipelines.training.pipeline import gpipe_step
from pipelines.training.stages import Stage, make_stages
from pipelines.training.topology import Topology, all_reduce_sum
from pipelines.training.yolact_loss import LOSS_KEYS, Normalizer, YolactLoss


def terms_tensor(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([terms[k].detach().float() for k in LOSS_KEYS])


class TermsInFlight:
    """A launched step's loss terms on their way to the host. On a GPU they are copied (to pinned memory, an event
    behind the copy) as soon as the step is queued, so that reading them waits for that step only: a plain
    ``.cpu()`` later would queue behind the steps launched since and wait for all of them, leaving the GPU
    without work until the host launches the next. Elsewhere they are the terms as they are."""

    def __init__(self, terms: torch.Tensor):
        self.done = None
        if terms.is_cuda:
            self.host = torch.empty(terms.shape, dtype=terms.dtype, pin_memory=True)
            self.host.copy_(terms, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()
        else:
            self.host = terms

    def read(self) -> torch.Tensor:
        """The terms on the CPU (waits for the step's work queued before them)."""
        if self.done is not None:
            self.done.synchronize()
        return self.host


class DataParallelRunner:
    """local (world 1) and ddp; on one GPU (local) the model can run as CUDA graphs (``use_cuda_graphs``)."""

    def __init__(self, model: nn.Module, topo: Topology, loss: YolactLoss, channels_last: bool):
        self.model, self.topo, self.loss, self.channels_last = model, topo, loss, channels_last
        self.graphed: GraphedModel | None = None
        if topo.distributed:
            from torch.nn.parallel import DistributedDataParallel

            device = next(model.parameters()).device
            self.module = DistributedDataParallel(
                model, broadcast_buffers=False, device_ids=[device] if device.type == "cuda" else None
            )
        else:
            self.module = model

    def owns(self, key: str) -> bool:
        return True

    @property
    def keeps_grads(self) -> bool:
        """Whether gradients are zeroed in place between steps instead of set to None (CUDA graphs)."""
        return self.graphed is not None

    def use_cuda_graphs(self, images: torch.Tensor) -> None:
        """Capture the model's forward and backward for inputs like images [b, 3, S, S] on a GPU (in the step's
        autocast, before the loader's threads start: nothing else may use the GPU during a capture)."""
        if self.topo.distributed:
            raise ValueError("CUDA graphs: one-process (local) runs only; DDP's gradient hooks run eagerly")
        self.graphed = GraphedModel(self.model, images)

    def forward(self, images: torch.Tensor):
        """The model's outputs for images (in the step's autocast): replayed where a graph fits them."""
        if self.graphed is not None and self.graphed.fits(images):
            self.graphed.ensure_grads()
            return self.graphed(images)
        return self.module(images)

    def run(self, micro_batches, normalizer: Normalizer) -> torch.Tensor:
        """Forward + backward of this rank's micro-batches, launched; returns this rank's loss terms on the device
        (no wait for the device: ``reduce`` them)."""
        on_device = []
        for i, mb in enumerate(micro_batches):
            sync = i == len(micro_batches) - 1
            context = self.module.no_sync() if (self.topo.distributed and not sync) else nullcontext()
            with context:
                outputs = self.forward(_images(mb, self.channels_last))
                terms = normalizer.apply(self.loss.sums(outputs, mb.targets, mb.matches))
                (sum(terms.values()) * self.topo.dp_size).backward()
            on_device.append(terms_tensor(terms))
        return torch.stack(on_device).sum(dim=0)

    def not_finite(self, terms: torch.Tensor) -> torch.Tensor:
        """[] float32 on the terms' device: 1.0 when any rank's terms are not finite, else 0.0 (no wait)."""
        flag = (~torch.isfinite(terms.sum())).float()
        return all_reduce_sum(flag, self.topo).clamp(max=1.0)

    def reduce(self, terms: TermsInFlight) -> torch.Tensor:
        """The step's global loss terms on the CPU (summed over ranks); waits for the device."""
        return all_reduce_sum(terms.read(), self.topo)


class PipelineRunner:
    """pipeline and hybrid: this rank runs one Stage of the model."""

    keeps_grads = False

    def __init__(
        self,
        model: nn.Module,
        topo: Topology,
        loss: YolactLoss,
        channels_last: bool,
        input_size: int,
        split: list[int] | None,
    ):
        self.model, self.topo, self.loss, self.channels_last = model, topo, loss, channels_last
        self.stage: Stage = make_stages(model, input_size, topo.stages, split)[topo.stage]

    def owns(self, key: str) -> bool:
        return self.stage.owns(key)

    def run(self, micro_batches, normalizer: Normalizer) -> torch.Tensor:
        total = torch.zeros(len(LOSS_KEYS))
        inputs = [(_images(mb, self.channels_last),) if self.topo.first_stage else None for mb in micro_batches]

        def loss_of(i, outputs):
            mb = micro_batches[i]
            terms = normalizer.apply(self.loss.sums(outputs, mb.targets, mb.matches))
            return sum(terms.values()), terms_tensor(terms)

        for terms in gpipe_step(self.stage, inputs, loss_of, self.topo):
            total += terms.cpu()
        if self.topo.strategy == "hybrid":
            for _, param in self.named_parameters():
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=self.topo.stage_group)
        return all_reduce_sum(total, self.topo)

    def named_parameters(self):
        return [(n, p) for n, p in self.model.named_parameters() if self.stage.owns(n)]

    def reduce(self, terms: TermsInFlight) -> torch.Tensor:
        return terms.read()  # run already summed them over the ranks


def _images(mb, channels_last: bool) -> torch.Tensor:
    return mb.images.contiguous(memory_format=torch.channels_last) if channels_last else mb.images


def make_runner(
    model: nn.Module, topo: Topology, loss: YolactLoss, channels_last: bool, input_size: int, split: list[int] | None
):
    if topo.strategy in ("local", "ddp"):
        return DataParallelRunner(model, topo, loss, channels_last)
    return PipelineRunner(model, topo, loss, channels_last, input_size, split)
