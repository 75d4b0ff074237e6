"""Who does what: a rank's place in the strategy (data-parallel replica, pipeline stage) and its process groups.

Ranks are laid out replica by replica: rank = dp_rank * stages + stage. local and ddp have one stage; pipeline
has one replica; hybrid has several replicas of a pipeline (data-parallel groups of pipelines).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelines.errors import UsageError


@dataclass
class Topology:
    strategy: str
    rank: int
    world: int
    stages: int
    stage_group: dist.ProcessGroup | None = None  # ranks holding the same stage (all replicas), for gradient all-reduce

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def dp_rank(self) -> int:
        return self.rank // self.stages

    @property
    def dp_size(self) -> int:
        return self.world // self.stages

    @property
    def first_stage(self) -> bool:
        return self.stage == 0

    @property
    def last_stage(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def prev_rank(self) -> int:
        return self.rank - 1

    @property
    def next_rank(self) -> int:
        return self.rank + 1

    @property
    def distributed(self) -> bool:
        return self.world > 1


def make_topology(strategy: str, stages: int) -> Topology:
    """From the process group (initialized or not); creates the per-stage groups hybrid needs (every rank must
    call this, in the same order)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    stages = stages if strategy in ("pipeline", "hybrid") else 1
    if world % stages:
        raise UsageError(f"{world} processes cannot hold {stages} pipeline stages evenly")
    topo = Topology(strategy, rank, world, stages)
    if strategy == "hybrid":
        for stage in range(stages):
            group = dist.new_group(list(range(stage, world, stages)))
            if stage == topo.stage:
                topo.stage_group = group
    return topo


def all_reduce_sum(values: torch.Tensor, topo: Topology) -> torch.Tensor:
    """Sum a tensor over every rank (identity in a single process)."""
    if topo.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values
