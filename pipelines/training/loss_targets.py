"""The YOLACT loss's ground truth: one image's targets, a batch of them padded to one object count (on the host or
the device, masks at the input size or already at the sizes the loss needs), and the downsampling of masks to
those sizes (bilinear, then > 0.5), shared by the input workers and the loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipelines.training.resize import resize_bilinear


@dataclass
class Targets:
    """Ground truth of one augmented image: boxes [G, 4] relative point form, labels [G] 0-based foreground
    classes, masks [G, S, S] float32 in [0, 1] at the network input size (or only the loss's sizes of them: {(h, w):
    [G, h, w] bool}, what the input workers make); seed drives masks_to_train sampling."""

    boxes: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor | dict
    seed: int = 0


@dataclass
class PackedTargets:
    """Ground truth of B images padded to G objects (real objects first): boxes [B, G, 4] relative point form,
    labels [B, G] (-1 padding), valid [B, G] bool, seeds (B ints). Masks either at the network input size
    (``full_masks`` [B, G, S, S] float) or already downsampled and binarized to the sizes the loss needs
    (``small_masks``: {(h, w): [B, G, h, w] uint8}, built in the input workers, far less to copy)."""

    boxes: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    seeds: list[int]
    full_masks: torch.Tensor | None = None
    small_masks: dict | None = None

    @classmethod
    def pack(cls, targets: list[Targets], mask_sizes: list[tuple[int, int]] | None = None) -> PackedTargets:
        """mask_sizes None: keep full masks; else downsample each image's masks to each size now (CPU side), or take
        them as they are where targets come with masks at those sizes already."""
        batch, slots = len(targets), max((int(t.labels.shape[0]) for t in targets), default=0)
        first = targets[0].masks
        device = targets[0].boxes.device
        boxes = torch.zeros(batch, slots, 4, dtype=torch.float32, device=device)
        labels = torch.full((batch, slots), -1, dtype=torch.long, device=device)
        for b, t in enumerate(targets):
            count = int(t.labels.shape[0])
            boxes[b, :count] = t.boxes
            labels[b, :count] = t.labels
        packed = cls(boxes, labels, labels >= 0, [int(t.seed) for t in targets])
        if mask_sizes is None:
            full = first.new_zeros((batch, slots, *first.shape[-2:]))
            for b, t in enumerate(targets):
                full[b, : t.masks.shape[0]] = t.masks
            packed.full_masks = full
        else:
            packed.small_masks = {}
            for size in mask_sizes:
                small = torch.zeros(batch, slots, *size, dtype=torch.uint8, device=device)
                for b, t in enumerate(targets):
                    bits = t.masks[tuple(size)] if isinstance(t.masks, dict) else downsample_bits(t.masks, size)
                    small[b, : bits.shape[0]] = bits
                packed.small_masks[tuple(size)] = small
        return packed

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device, non_blocking: bool = False) -> PackedTargets:
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        small = {k: move(v) for k, v in self.small_masks.items()} if self.small_masks is not None else None
        return PackedTargets(
            move(self.boxes), move(self.labels), move(self.valid), list(self.seeds), move(self.full_masks), small
        )

    def pin_memory(self) -> PackedTargets:
        def pin(t):
            return None if t is None else t.pin_memory()

        small = {k: pin(v) for k, v in self.small_masks.items()} if self.small_masks is not None else None
        return PackedTargets(
            pin(self.boxes), pin(self.labels), pin(self.valid), list(self.seeds), pin(self.full_masks), small
        )

    def masks_at(self, size: tuple[int, int]) -> torch.Tensor:
        """[B, G, h, w] 0/1: the ground-truth masks downsampled to size (bilinear, > 0.5); uint8 where they were
        packed at that size (the loss converts them, in its graph on a GPU), else float, downsampled now."""
        size = (int(size[0]), int(size[1]))
        if self.small_masks is not None and size in self.small_masks:
            return self.small_masks[size]
        if self.full_masks is None:
            raise ValueError(f"targets packed without masks at {size}: pack them with that size")
        return downsample_masks_batch(self.full_masks, size)


def downsample_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[G, H, W] float masks -> [G, h, w] 0/1 float: bilinear (align_corners=False), then > 0.5."""
    return downsample_bits(masks, size).float()


def downsample_bits(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[G, H, W] float masks -> [G, h, w] bool: bilinear (align_corners=False) > 0.5 (``downsample_masks``
    without the float copy, for the packed uint8 masks)."""
    return resize_bilinear(masks[None].float(), size)[0] > 0.5


def downsample_masks_batch(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[B, G, H, W] -> [B, G, h, w] 0/1 float, as ``downsample_masks`` per image."""
    return resize_bilinear(masks.float(), size).gt(0.5).float()
