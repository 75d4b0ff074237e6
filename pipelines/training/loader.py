"""A rank's input pipeline: its micro-batches decoded and augmented in worker processes (torch DataLoader,
``data.loader_workers`` processes, ``data.loader_prefetch`` micro-batches ahead each), in order.

Every micro-batch is built by ``batches.make_micro_batch`` from the rows this rank read from its Parquet shards;
each image's augmentation is seeded by (seed, epoch, image), so which worker builds it changes nothing: strategies
and resumes reproduce whatever the worker count. With 0 workers the micro-batches are built in the rank itself.

    for mb in micro_batch_stream(rows, micro_batches, LoaderSpec(...)):
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from pipelines.training.augment import AugmentConfig
from pipelines.training.batches import InputSpec, MicroBatch, load_kernels, make_micro_batch


@dataclass(frozen=True)
class LoaderSpec:
    """How micro-batches are made: input, augmentation (None: none), seed and epoch of the draws, the loss's mask
    sizes (targets packed at those sizes; None: full-size target list), worker processes, prefetch per worker,
    page-locked memory (for asynchronous copies to a GPU)."""

    input_spec: InputSpec
    augment: AugmentConfig | None
    seed: int
    epoch: int
    mask_sizes: tuple[tuple[int, int], ...] | None = None
    workers: int = 0
    prefetch: int = 2
    pin_memory: bool = False


class MicroBatchDataset(Dataset):
    """Item i: micro-batch i of the list (global sample indices), built from the rows."""

    def __init__(self, rows: dict[int, dict], micro_batches: list[list[int]], spec: LoaderSpec):
        self.rows, self.micro_batches, self.spec = rows, micro_batches, spec

    def __len__(self) -> int:
        return len(self.micro_batches)

    def __getitem__(self, i: int) -> MicroBatch:
        s = self.spec
        sizes = list(s.mask_sizes) if s.mask_sizes is not None else None
        return make_micro_batch(self.rows, self.micro_batches[i], s.input_spec, s.augment, s.seed, s.epoch, sizes)


def micro_batch_stream(rows: dict[int, dict], micro_batches: list[list[int]], spec: LoaderSpec) -> Iterator[MicroBatch]:
    """The micro-batches in the given order; built by spec.workers processes (0: here, one at a time)."""
    dataset = MicroBatchDataset(rows, micro_batches, spec)
    if spec.workers == 0:
        for i in range(len(dataset)):
            mb = dataset[i]
            yield mb.pin_memory() if spec.pin_memory else mb
        return
    load_kernels()  # here, once: the forked workers inherit it
    loader = DataLoader(
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=spec.workers,
        prefetch_factor=spec.prefetch,
        pin_memory=spec.pin_memory,
        persistent_workers=False,
        worker_init_fn=_one_thread,
    )
    yield from loader


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)  # workers are the parallelism; intra-op threads would oversubscribe the cores
