"""Bench images: deterministic crops of the bundled samples (samples/images), resized to a few camera-like sizes
and saved as JPEG, so every row of the bench reads the same bytes. Cached: a directory that holds a matching
`.complete` stamp is reused as it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples" / "images"
BENCH_SIZES = ((640, 480), (800, 600), (512, 512), (480, 640))  # (width, height), cycled
LOAD_SIZES = ((160, 120),)
VERSION = 1


def make_images(out_dir: str | Path, count: int, sizes=BENCH_SIZES, seed: int = 0, quality: int = 90) -> Path:
    """`count` JPEGs `img_NNNNN.jpg` in `out_dir`: image i is a random crop (50-100% of each side) of sample
    i mod 7, maybe mirrored, resized to sizes[i mod len(sizes)]. Same arguments, same bytes."""
    out_dir = Path(out_dir)
    stamp = out_dir / ".complete"
    want = {"count": count, "sizes": [list(s) for s in sizes], "seed": seed, "quality": quality, "version": VERSION}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out_dir
    if count < 1:
        raise ValueError(f"make_images: count must be >= 1, got {count}")
    sources = sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not sources:
        raise FileNotFoundError(f"{SAMPLES}: no sample images to make bench images from")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    decoded = []
    for path in sources:
        with Image.open(path) as image:
            decoded.append(image.convert("RGB"))
    rng = np.random.default_rng(seed)
    for index in range(count):
        source = decoded[index % len(decoded)]
        width, height = source.size
        crop_w, crop_h = (int(side * rng.uniform(0.5, 1.0)) for side in (width, height))
        left, top = int(rng.integers(0, width - crop_w + 1)), int(rng.integers(0, height - crop_h + 1))
        image = source.crop((left, top, left + crop_w, top + crop_h)).resize(sizes[index % len(sizes)], Image.BILINEAR)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        image.save(out_dir / f"img_{index:05d}.jpg", quality=quality)
    stamp.write_text(json.dumps(want))
    return out_dir


def image_paths(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob("img_*.jpg"))


if __name__ == "__main__":  # python scripts/bench/images.py OUT_DIR COUNT
    import sys

    print(make_images(sys.argv[1], int(sys.argv[2])))
