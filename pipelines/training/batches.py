"""Turn prepared rows into network inputs and loss targets (one micro-batch at a time).

A sample's augmentation is drawn from ``np.random.default_rng([seed, epoch, index])``: the same on whichever rank
trains it, and again after a resume.

The input workers' share of the work (``make_micro_batch``) is per image: decode, draw the geometry on the boxes
(``augment.draw_geometry``), make only the window it keeps (the image, and the masks of the objects that stay: only
theirs are decoded from their RLEs), resize. Pixels and masks are those of expanding, cropping and mirroring
full-size arrays (tests/test_training_augment_speed_equal.py checks it bit for bit).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.ops import compiled_loops
from pipelines.ops.image_decode import decode_image
from pipelines.training import photometric
from pipelines.training.augment import (
    AugmentConfig,
    Geometry,
    crop_image,
    draw_geometry,
    fill_value,
    resize_masks,
    resized_mask_bits,
    to_network_input,
)
from pipelines.training.boxes import BatchMatch
from pipelines.training.fused import FusedOnCuda
from pipelines.training.loss_targets import PackedTargets, Targets

CPU_ROWS = 4  # images per colour pass on a CPU (MicroBatch.finish_images): its temporaries stay in cache


@dataclass(frozen=True)
class InputSpec:
    """The network input: square side in pixels, RGB mean / std (0-255 scale)."""

    size: int
    mean_rgb: tuple[float, float, float]
    std_rgb: tuple[float, float, float]


@dataclass
class MicroBatch:
    images: torch.Tensor  # [b, 3, S, S] normalized RGB
    targets: list[Targets] | PackedTargets
    indices: list[int]  # global sample indices
    matches: BatchMatch | None = None  # (with its MaskSlots) set where the loss is computed
    colour: torch.Tensor | None = None  # [b, 5] photometric draws: images are resized uint8 RGB, not yet
    #                                     distorted nor normalized (finish_images does both where they run)
    num_positives: int | None = None  # positive priors of matches, counted when they were made

    def pin_memory(self) -> MicroBatch:
        """Page-locked copies (DataLoader's pin_memory thread calls this) for asynchronous copies to a GPU (a copy
        from pageable memory waits for the stream's queued work)."""
        targets = self.targets.pin_memory() if isinstance(self.targets, PackedTargets) else self.targets
        colour = self.colour.pin_memory() if self.colour is not None else None
        return dataclasses.replace(self, images=self.images.pin_memory(), targets=targets, colour=colour)

    def targets_to(self, device: torch.device) -> MicroBatch:
        """This unmatched micro-batch with its targets and colour draws on device, its images where they are (they
        go after the matching: trainer.TrainingSession.to_device). Copies from page-locked memory are asynchronous."""
        targets = (
            self.targets.to(device, non_blocking=True)
            if isinstance(self.targets, PackedTargets)
            else [Targets(t.boxes.to(device), t.labels.to(device), t.masks.to(device), t.seed) for t in self.targets]
        )
        colour = self.colour.to(device, non_blocking=True) if self.colour is not None else None
        return dataclasses.replace(self, targets=targets, colour=colour)

    def record_stream(self, stream) -> None:
        """Tell the CUDA allocator these tensors (copied on another stream) are used on `stream`."""
        tensors = [self.images, self.colour]
        if isinstance(self.targets, PackedTargets):
            t = self.targets
            tensors += [t.boxes, t.labels, t.valid, t.full_masks, *(t.small_masks or {}).values()]
        map_tensors(self.matches, tensors.append)
        for tensor in tensors:
            if tensor is not None:
                tensor.record_stream(stream)

    def finish_images(self, spec: InputSpec) -> MicroBatch:
        """Apply the deferred colour distortion and normalization (batched, on the images' device: on a GPU the whole
        micro-batch in one fused kernel (fused.FusedOnCuda), on a CPU CPU_ROWS images at a time, where a whole
        batch's temporaries would be fresh memory for every operation, which is slower)."""
        if self.colour is None:
            return self
        device = self.images.device
        colour = self.colour.to(device)
        mean, std = channel_constants(tuple(spec.mean_rgb), tuple(spec.std_rgb), device)
        if device.type != "cpu":
            return dataclasses.replace(self, images=distorted_normalized(self.images, colour, mean, std), colour=None)
        images = torch.empty(self.images.shape, dtype=torch.float32, device=device)
        for start in range(0, len(images), CPU_ROWS):
            part = slice(start, start + CPU_ROWS)
            torch.div(
                photometric.apply_torch(self.images[part].float(), colour[part]).sub_(mean), std, out=images[part]
            )
        return dataclasses.replace(self, images=images, colour=None)


@functools.lru_cache(maxsize=8)
def channel_constants(
    mean_rgb: tuple[float, ...], std_rgb: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and std [1, 3, 1, 1] float32 on device, made once per device (each time, the copy of a host list to a
    GPU would wait for the stream's queued work)."""
    return tuple(
        torch.tensor(values, dtype=torch.float32, device=device)[None, :, None, None] for values in (mean_rgb, std_rgb)
    )


def _distorted_normalized(
    images: torch.Tensor, colour: torch.Tensor, mean: torch.Tensor, std: torch.Tensor
) -> torch.Tensor:
    """images [b, 3, S, S] uint8 RGB, colour [b, 5] draws, mean and std [1, 3, 1, 1] -> [b, 3, S, S] float32:
    distorted (photometric.apply_torch), then normalized."""
    return (photometric.apply_torch(images.float(), colour) - mean) / std


distorted_normalized = FusedOnCuda(_distorted_normalized)  # one kernel on a GPU instead of ~30 passes


def map_tensors(value, fn):
    """value with fn applied to each tensor field (dataclasses such as boxes.BatchMatch and its MaskSlots, nested);
    None and other values as they are."""
    if torch.is_tensor(value):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value)}
        )
    return value


def sample_seed(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


def make_micro_batch(
    rows: dict[int, dict],
    indices: list[int],
    spec: InputSpec,
    augment_cfg: AugmentConfig | None,
    seed: int,
    epoch: int,
    mask_sizes: list[tuple[int, int]] | None = None,
) -> MicroBatch:
    """augment_cfg None: no augmentation (validation). mask_sizes (the loss's proto and semantic sizes): the input
    workers' form: targets come packed with their masks already downsampled to those sizes (PackedTargets, uint8)
    instead of a list of full-size float masks (the same loss, a fraction of the bytes to move between processes
    and to a GPU), and the colour distortion and normalization are left to ``MicroBatch.finish_images`` (the same
    draws, applied batched where the model runs)."""
    mean = np.asarray(spec.mean_rgb, dtype=np.float32)
    std = np.asarray(spec.std_rgb, dtype=np.float32)
    deferred = [] if mask_sizes is not None else None
    images = torch.empty(
        (len(indices), 3, spec.size, spec.size), dtype=torch.float32 if deferred is None else torch.uint8
    )
    targets = []
    for b, index in enumerate(indices):
        images[b], target = network_sample(
            rows[index], sample_seed(seed, epoch, index), spec, augment_cfg, mean, std, deferred, mask_sizes
        )
        targets.append(target)
    if mask_sizes is None:
        return MicroBatch(images=images, targets=targets, indices=list(indices))
    return MicroBatch(
        images=images,
        targets=PackedTargets.pack(targets, mask_sizes),
        indices=list(indices),
        colour=photometric.draws_tensor(deferred),
    )


def network_sample(
    row: dict,
    rng: np.random.Generator,
    spec: InputSpec,
    augment_cfg: AugmentConfig | None,
    mean: np.ndarray,
    std: np.ndarray,
    deferred: list | None,
    mask_sizes: list[tuple[int, int]] | None = None,
) -> tuple[torch.Tensor, Targets]:
    """One prepared row -> its network input [3, S, S] (possibly a strided view) and targets (masks [G', S, S]
    float32; with mask_sizes, {size: [G', h, w] bool} at those sizes instead, as ``augment.resized_mask_bits``),
    augmented with draws from rng (augment_cfg None: as it is); deferred: see ``augment.to_network_input``. The
    image is decoded into memory the decoder reuses, as RGBX where it can (no copy of Pillow's 4-byte pixels); only
    the window ``crop_image`` copies out of it is kept."""
    source = decode_image(bytes(row["image"]), row["file_name"], shared_memory=True)  # [H, W, 3 or 4]
    height, width, channels = source.shape
    boxes = np.asarray(row["boxes"], dtype=np.float32).reshape(-1, 4)
    labels = np.asarray(row["labels"], dtype=np.int64)
    geometry = (
        draw_geometry(height, width, boxes, labels, rng, augment_cfg)
        if augment_cfg is not None
        else Geometry.whole(height, width, boxes, labels)
    )
    pixels = crop_image(source, geometry, fill_value(source.dtype, mean, channels))
    min_box = augment_cfg.min_box_px if augment_cfg is not None else 0.0
    distort = augment_cfg is not None and augment_cfg.photometric
    image, boxes, labels, keep = to_network_input(
        pixels, geometry.boxes, geometry.labels, spec.size, mean, std, min_box, rng, distort, deferred
    )
    masks = window_masks(row["rles"], geometry.objects[keep], height, width, geometry)
    masks = resize_masks(masks, spec.size) if mask_sizes is None else resized_mask_bits(masks, spec.size, mask_sizes)
    return image, Targets(boxes=boxes, labels=labels, masks=masks, seed=int(rng.integers(2**31)))


# --------------------------------------------------------------------------------------------------------- masks
def window_masks(rles: list[str], objects: np.ndarray, height: int, width: int, geometry: Geometry) -> np.ndarray:
    """The masks of the given objects (indices into rles: COCO compressed RLE counts of a height x width image) in
    the geometry's window, mirrored as it is (``augment.crop_masks``): uint8 [len(objects), geometry.height,
    geometry.width] 0/1, 0 where the window leaves the image. Only the objects kept are decoded, each straight into
    the window in one compiled call for them all (compiled_loops.rle_window: no full-size mask is made)."""
    counts = [rles[obj] for obj in objects]
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum([len(c) for c in counts], out=starts[1:])
    chars = np.frombuffer("".join(counts).encode("ascii"), np.uint8)
    g = geometry
    return compiled_loops.rle_window(chars, starts, height, width, g.top, g.left, g.height, g.width, g.mirror)


def load_kernels() -> None:
    """Compile, or load from numba's disk cache, window_masks' kernel in this process (slow the first time): the
    DataLoader workers forked from it start with it instead of each loading it on its first image, every epoch."""
    window_masks(
        [], np.zeros(0, np.int64), 1, 1, Geometry.whole(1, 1, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    )
