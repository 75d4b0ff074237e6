"""YOLACT as a chain of blocks, grouped into pipeline stages (model parallelism).

Blocks: the backbone stem with its first stage, each later backbone stage, then the head (FPN, proto net,
prediction head, semantic conv). Between blocks flows a tuple of tensors: the outputs of the backbone stages the
FPN will use, then the latest stage output. Blocks call the model's own submodules, so a stage's parameters are
the model's parameters (same state_dict names); ``head_forward`` mirrors the tail of ``Yolact.forward``
(the gradient test checks the chain equals the unsplit model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_export.models.yolact import Yolact
from pipelines.errors import UsageError


def head_forward(model: Yolact, feats: list[torch.Tensor], input_hw: tuple[int, int]) -> dict[str, torch.Tensor]:
    """feats: the selected backbone outputs (C3, C4, C5) -> Yolact's train-mode output dict."""
    level_sizes = model.feature_map_sizes(input_hw)
    pyramid = model.fpn(feats, level_sizes[: len(feats)])
    proto = F.relu(model.proto_net(pyramid[0])).permute(0, 2, 3, 1).contiguous()
    head = model.prediction_layers[0]
    per_level = [head(p) for p in pyramid]
    loc, conf, mask = (torch.cat([level[i] for level in per_level], dim=1) for i in range(3))
    return {"loc": loc, "conf": conf, "mask": mask, "proto": proto, "segm": model.semantic_seg_conv(pyramid[0])}


class BackboneBlock(nn.Module):
    """Backbone stage `index` (with the stem when index == 0). carry in: (kept..., latest) -> out: the same with
    the latest output kept when its stage is selected for the FPN, and this stage's output appended."""

    def __init__(self, model: Yolact, index: int):
        super().__init__()
        self.model = [model]  # a list: not registered as a submodule (no duplicate parameters)
        self.index = index
        self.layer = model.backbone.layers[index]
        self.prefixes = [f"backbone.layers.{index}."]
        if index == 0:
            self.prefixes += ["backbone.conv1.", "backbone.bn1.", "backbone._preconv."]
            backbone = model.backbone
            self.stem = nn.ModuleList(
                [backbone._preconv] if hasattr(backbone, "_preconv") else [backbone.conv1, backbone.bn1]
            )

    def forward(self, carry: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        model = self.model[0]
        if self.index == 0:
            (x,) = carry
            backbone = model.backbone
            x = (
                backbone._preconv(x)
                if hasattr(backbone, "_preconv")
                else backbone.maxpool(backbone.relu(backbone.bn1(backbone.conv1(x))))
            )
            return (self.layer(x),)
        kept = carry[:-1] + ((carry[-1],) if self.index - 1 in model.cfg.selected_layers else ())
        return kept + (self.layer(carry[-1]),)


class HeadBlock(nn.Module):
    """FPN + proto + prediction head + semantic conv: carry (C3, C4, C5) -> output dict."""

    prefixes = ["fpn.", "proto_net.", "prediction_layers.", "semantic_seg_conv."]

    def __init__(self, model: Yolact, input_hw: tuple[int, int]):
        super().__init__()
        self.model = [model]
        self.input_hw = input_hw
        self.parts = nn.ModuleList([model.fpn, model.proto_net, model.prediction_layers, model.semantic_seg_conv])

    def forward(self, carry: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        return head_forward(self.model[0], list(carry), self.input_hw)


def yolact_blocks(model: Yolact, input_size: int) -> list[nn.Module]:
    layers = len(model.backbone.layers)
    selected = model.cfg.selected_layers
    if selected[-1] != layers - 1:
        raise ValueError(f"{model.cfg.name}: pipeline stages need the last backbone stage selected for the FPN")
    return [BackboneBlock(model, i) for i in range(layers)] + [HeadBlock(model, (input_size, input_size))]


class Stage(nn.Module):
    """Consecutive blocks run as one pipeline stage."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, carry):
        for block in self.blocks:
            carry = block(carry)
        return carry

    @property
    def prefixes(self) -> list[str]:
        return [p for block in self.blocks for p in block.prefixes]

    def owns(self, key: str) -> bool:
        return key.startswith(tuple(self.prefixes))


def block_flops(model: Yolact, input_size: int) -> list[float]:
    """Forward FLOPs of each block for one input image (torch's FLOP counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    blocks = yolact_blocks(model, input_size)
    carry = (torch.zeros(1, 3, input_size, input_size, device=next(model.parameters()).device),)
    flops = []
    with torch.no_grad():
        for block in blocks:
            with FlopCounterMode(display=False) as counter:
                carry = block(carry)
            flops.append(float(counter.get_total_flops()))
    return flops


def balanced_split(costs: list[float], stages: int) -> list[int]:
    """First block index of stages 1..stages-1 so the largest stage cost is smallest (contiguous partition)."""
    n = len(costs)
    if stages > n:
        raise UsageError(f"{stages} pipeline stages but the model has only {n} blocks")
    best: tuple[float, list[int]] | None = None

    def search(start: int, left: int, cuts: list[int], worst: float):
        nonlocal best
        if left == 1:
            worst = max(worst, sum(costs[start:]))
            if best is None or worst < best[0]:
                best = (worst, list(cuts))
            return
        for end in range(start + 1, n - left + 2):
            search(end, left - 1, cuts + [end], max(worst, sum(costs[start:end])))

    search(0, stages, [], 0.0)
    return best[1]


def make_stages(model: Yolact, input_size: int, stages: int, split: list[int] | None = None) -> list[Stage]:
    """The model cut into `stages` Stage modules at `split` (block indices), FLOP-balanced when None."""
    blocks = yolact_blocks(model, input_size)
    if split is None:
        split = balanced_split(block_flops(model, input_size), stages)
    split = [int(s) for s in split]
    if len(split) != stages - 1 or split != sorted(set(split)) or split[0] < 1 or split[-1] >= len(blocks):
        raise UsageError(
            f"distributed.pipeline_split {split}: give {stages - 1} increasing block indices in "
            f"1..{len(blocks) - 1} ({len(blocks)} blocks: backbone stages then the head)"
        )
    bounds = [0] + split + [len(blocks)]
    return [Stage(blocks[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
