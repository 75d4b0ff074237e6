"""Deterministic train/val split of a Dataset."""

from __future__ import annotations

import numpy as np

from pipelines.datasets.schema import Dataset


def split_train_val(dataset: Dataset, val_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, val): ``round(val_fraction * N)`` images go to val, chosen by ``seed``.

    The choice depends only on the set of image ids and the seed (not on the order of ``dataset.images``); both
    parts keep the original image order and share the categories and info.
    """
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1, e.g. 0.2 for 20% validation images")
    ids = sorted(im.id for im in dataset.images)
    if len(set(ids)) != len(ids):
        raise ValueError("dataset has duplicate image ids: give every image its own id before splitting")
    n_val = int(round(val_fraction * len(ids)))
    order = np.random.default_rng(seed).permutation(len(ids))
    val_ids = {ids[i] for i in order[:n_val]}
    train = [im for im in dataset.images if im.id not in val_ids]
    val = [im for im in dataset.images if im.id in val_ids]
    return dataset.with_images(train), dataset.with_images(val)
