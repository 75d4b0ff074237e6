"""Read prepared Parquet shards on a rank: a small index of every row (sorted by image_id: the global sample
order, whatever the file layout), and the rows a rank needs, read row group by row group (no other rows' bytes).

    index = ShardIndex.open("/data/prepared/train")
    rows = index.read([3, 17, 42])          # {global index: row dict}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from pipelines.errors import UsageError
from pipelines.io import uris

if TYPE_CHECKING:
    import fsspec
    import pyarrow.fs

VAL_ANNOTATIONS_NAME = "val_annotations.json"  # prepare writes it beside the shards; validation reads it
ROW_COLUMNS = ("image_id", "file_name", "width", "height", "image", "labels", "boxes", "rles")


def _filesystem(uri: str):
    if uris.is_local(uri):
        from pyarrow import fs

        return fs.LocalFileSystem(), uris.to_local_path(uri)
    import fsspec

    return fsspec.core.url_to_fs(uri)


@dataclass
class ShardIndex:
    """files: the Parquet files; for global sample i (ascending image_id): file_of[i], group_of[i] (row group),
    row_of[i] (row within that group), image_ids[i]."""

    root: str
    files: list[str]
    file_of: np.ndarray
    group_of: np.ndarray
    row_of: np.ndarray
    image_ids: np.ndarray
    filesystem: pyarrow.fs.FileSystem | fsspec.AbstractFileSystem | None = None

    @classmethod
    def open(cls, root: str) -> ShardIndex:
        fs, path = _filesystem(root)
        if hasattr(fs, "get_file_info"):  # pyarrow LocalFileSystem
            from pyarrow.fs import FileSelector

            infos = fs.get_file_info(FileSelector(path, recursive=True))
            files = sorted(
                i.path
                for i in infos
                if i.is_file
                and i.path.endswith(".parquet")
                and not any(p.startswith(("_", ".")) for p in i.path[len(path) :].split("/") if p)
            )
        else:
            files = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
        if not files:
            raise UsageError(f"{root}: no Parquet shards; run the preparation first (pipelines.training.prepare)")
        parts = {"file": [], "group": [], "row": [], "id": []}
        for number, name in enumerate(files):
            with fs.open_input_file(name) if hasattr(fs, "open_input_file") else fs.open(name, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                for group in range(parquet.num_row_groups):
                    ids = parquet.read_row_group(group, columns=["image_id"]).column(0).to_numpy()
                    parts["file"].append(np.full(len(ids), number))
                    parts["group"].append(np.full(len(ids), group))
                    parts["row"].append(np.arange(len(ids)))
                    parts["id"].append(ids)
        merged = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
        order = np.argsort(merged["id"], kind="stable")
        return cls(
            root, files, merged["file"][order], merged["group"][order], merged["row"][order], merged["id"][order], fs
        )

    def __len__(self) -> int:
        return int(self.image_ids.shape[0])

    def read(self, indices) -> dict[int, dict]:
        """Rows of the given global indices; only their row groups are read."""
        wanted: dict[tuple[int, int], list[int]] = defaultdict(list)
        for index in {int(i) for i in indices}:
            if not 0 <= index < len(self):
                raise IndexError(f"sample {index} out of range: {self.root} has {len(self)} rows")
            wanted[(int(self.file_of[index]), int(self.group_of[index]))].append(index)
        rows: dict[int, dict] = {}
        fs = self.filesystem
        for (number, group), members in sorted(wanted.items()):
            name = self.files[number]
            with fs.open_input_file(name) if hasattr(fs, "open_input_file") else fs.open(name, "rb") as handle:
                table = pq.ParquetFile(handle).read_row_group(group, columns=list(ROW_COLUMNS))
            for index in members:
                rows[index] = {k: v[0] for k, v in table.slice(int(self.row_of[index]), 1).to_pydict().items()}
        return rows
