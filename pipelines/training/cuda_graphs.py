"""The model's forward and backward replayed as CUDA graphs (``train.cuda_graphs``, one-GPU ``local`` runs).

A YOLACT step launches ~1,400 kernels; with bf16 on a fast GPU the GPU runs them faster than one host thread
can launch them, so the step waits on the host. ``torch.cuda.make_graphed_callables`` captures the model's
forward and backward once, for one input shape, and every later step replays each with one launch; the loss,
matching and optimizer stay eager (their shapes follow the objects of each batch).

Same results as the eager model: the same kernels on the same tensors (cuDNN may choose other algorithms than an
eager run, as cudnn.benchmark may between two eager runs). The session captures at its start, on a placeholder
batch, before the loader's threads run (nothing else may use the GPU during a capture); capturing runs the model
4 times (warm-up and capture): the batch-norm running statistics are put back afterwards. Gradients are
accumulated into kept ``.grad`` tensors (``ensure_grads``), never taken over from the graph's own output buffer,
which the next replay overwrites (gradient accumulation over micro-batches stays right).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

LOG = logging.getLogger(__name__)


def input_signature(images: torch.Tensor) -> tuple:
    """What a replay needs to match: shape, dtype, device, memory format and the autocast the graph ran under."""
    return (
        tuple(images.shape),
        images.dtype,
        images.device,
        images.is_contiguous(memory_format=torch.channels_last),
        torch.is_autocast_enabled(images.device.type),
        torch.get_autocast_dtype(images.device.type),
    )


class GraphedModel:
    """graphed = GraphedModel(model, images) (CUDA, training mode, inside the step's autocast); then for inputs
    with images' signature, graphed(x) returns model(x)'s outputs (replayed; backward replays too)."""

    def __init__(self, model: nn.Module, images: torch.Tensor):
        self.model = model
        self.signature = input_signature(images)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        kept = {name: buffer.clone() for name, buffer in model.named_buffers()}
        device_type = images.device.type
        with torch.autocast(
            device_type,
            dtype=torch.get_autocast_dtype(device_type),
            enabled=torch.is_autocast_enabled(device_type),
            cache_enabled=False,
        ):
            torch.cuda.make_graphed_callables(model, (images,))
        self.replay = model.__dict__.pop("forward")  # make_graphed_callables patched the instance's forward
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(kept[name])
        LOG.info("CUDA graphs: model forward and backward captured for input %s", tuple(images.shape))

    def fits(self, images: torch.Tensor) -> bool:
        return self.model.training and input_signature(images) == self.signature

    def __call__(self, images: torch.Tensor):
        return self.replay(images)

    def ensure_grads(self) -> None:
        """Give every trainable parameter a .grad to accumulate into (zeros where it has none)."""
        for param in self.trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
