"""Which samples each rank trains on at each step: one definition of the global batch for every strategy.

Per epoch a seeded permutation of all samples; step k's global batch is permutation[k*B : (k+1)*B] (an
incomplete last batch is dropped); it is cut into B / m micro-batches of m consecutive samples; data-parallel
rank r of R takes the r-th contiguous block of (B / m) / R micro-batches. Batch-norm statistics are per
micro-batch and the loss is normalized over the whole global batch, so 1 process or R processes (or a
pipeline) compute the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.errors import UsageError


@dataclass(frozen=True)
class GlobalBatchSampler:
    num_samples: int
    global_batch: int
    micro_batch: int
    seed: int = 0
    shuffle: bool = True

    def __post_init__(self):
        if self.micro_batch < 1 or self.global_batch % self.micro_batch:
            raise UsageError(
                f"train.global_batch {self.global_batch} must be a multiple of train.micro_batch {self.micro_batch}"
            )
        if self.num_samples < self.global_batch:
            raise UsageError(
                f"only {self.num_samples} usable training images, fewer than one global batch "
                f"({self.global_batch}): add data or lower train.global_batch"
            )

    @property
    def micro_batches_per_step(self) -> int:
        return self.global_batch // self.micro_batch

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def check_data_parallel(self, dp_size: int) -> None:
        if self.micro_batches_per_step % dp_size:
            raise UsageError(
                f"global_batch / micro_batch = {self.micro_batches_per_step} micro-batches per step "
                f"cannot be shared by {dp_size} data-parallel replicas: make it a multiple"
            )

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def micro_batches(self, epoch: int, step: int, dp_rank: int = 0, dp_size: int = 1) -> list[list[int]]:
        """The micro-batches (lists of global sample indices) data-parallel rank dp_rank runs at this step."""
        self.check_data_parallel(dp_size)
        batch = self.order(epoch)[step * self.global_batch : (step + 1) * self.global_batch]
        chunks = [batch[i : i + self.micro_batch].tolist() for i in range(0, self.global_batch, self.micro_batch)]
        per_rank = len(chunks) // dp_size
        return chunks[dp_rank * per_rank : (dp_rank + 1) * per_rank]

    def epoch_indices(self, epoch: int, dp_rank: int = 0, dp_size: int = 1, first_step: int = 0) -> list[int]:
        """Every sample index this rank needs from first_step to the end of the epoch (to read them at once)."""
        needed = []
        for step in range(first_step, self.steps_per_epoch):
            for chunk in self.micro_batches(epoch, step, dp_rank, dp_size):
                needed.extend(chunk)
        return needed
