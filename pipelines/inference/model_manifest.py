"""The export directory's manifest.json: the public contract between the export stage and every later stage.

The driver loads and verifies it before any Spark task starts; executors verify the files they received again
before compiling them (a corrupted broadcast or a swapped file must never produce results).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import UsageError
from pipelines.io.uris import is_local, to_local_path

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
INFERENCE_ROLES = ("ir_xml", "ir_bin", "priors")  # what a job needs; the ONNX files may be left out of a bundle


class ModelManifestError(UsageError):
    """The model directory cannot be used: the message names the file and what to do."""


def file_sha256(path: str | Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelManifest:
    """A parsed manifest. `model_sha256` (the hash of manifest.json, which lists every file's hash) identifies the
    exported model everywhere: executor model caches, resume keys, detections rows."""

    root: Path
    data: dict
    model_sha256: str

    @property
    def model(self) -> str:
        return self.data["model"]

    @property
    def name(self) -> str:
        return self.data.get("config", self.data["model"])

    @property
    def class_names(self) -> list[str]:
        return list(self.data["class_names"])

    @property
    def input(self) -> dict:
        return self.data["input"]

    @property
    def input_size(self) -> tuple[int, int]:
        """(height, width) of the network input."""
        shape = self.data["input"]["shape"]
        return int(shape[2]), int(shape[3])

    @property
    def outputs(self) -> dict[str, str]:
        return dict(self.data["outputs"])

    @property
    def postprocess(self) -> dict:
        return dict(self.data.get("postprocess", {}))

    @property
    def trained(self) -> bool:
        return bool(self.data.get("weights", {}).get("trained", False))

    def path(self, role: str) -> Path:
        """Absolute path of a file by its role in `files` (onnx, onnx_simplified, ir_xml, ir_bin, priors)."""
        try:
            return self.root / self.data["files"][role]
        except KeyError:
            raise ModelManifestError(f"{self.root / MANIFEST_NAME}: no file with role '{role}' in 'files'") from None

    def verify_files(self, roles: tuple[str, ...] | None = None) -> None:
        """Check each listed file (or only `roles`) against its sha256; raise naming the first bad file."""
        hashes = self.data.get("sha256", {})
        files = self.data.get("files", {})
        for role, rel in files.items():
            if roles is not None and role not in roles:
                continue
            path = self.root / rel
            if not path.is_file():
                raise ModelManifestError(
                    f"{path}: listed in {self.root / MANIFEST_NAME} as '{role}' but missing: re-export the model "
                    "(python -m model_export ...) or copy the whole export directory"
                )
            expected = hashes.get(rel)
            if expected is None:
                raise ModelManifestError(f"{self.root / MANIFEST_NAME}: no sha256 recorded for {rel}: re-export")
            actual = file_sha256(path)
            if actual != expected:
                raise ModelManifestError(
                    f"{path}: sha256 {actual[:12]}... does not match the manifest ({expected[:12]}...): the file was "
                    "modified or corrupted in transit; re-copy the export directory or re-export the model"
                )


def load_manifest(model_dir: str | Path, verify: bool = True) -> ModelManifest:
    """Read `model_dir/manifest.json`; with `verify`, check the sha256 of the files inference uses (fails fast,
    naming the file). `manifest.verify_files()` checks every listed file."""
    if not is_local(model_dir):
        raise ModelManifestError(
            f"{model_dir}: a model directory is read on the driver, from its file system: give a "
            "local path (copy the export directory there, or ship it with spark-submit "
            "--archives model.tar.gz#model and pass --model model)"
        )
    root = Path(to_local_path(model_dir)).expanduser().resolve()
    path = root / MANIFEST_NAME
    if not path.is_file():
        hint = "pass --model an export directory made by `python -m model_export`"
        if root.is_dir():
            raise ModelManifestError(f"{path}: missing: {root} is not an export directory; {hint}")
        raise ModelManifestError(f"{root}: no such model directory; {hint}")
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ModelManifestError(f"{path}: not valid JSON ({err}): re-export the model") from None
    for key in ("model", "input", "outputs", "files", "sha256"):
        if key not in data:
            raise ModelManifestError(f"{path}: required key '{key}' is missing: re-export the model")
    if data.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise ModelManifestError(
            f"{path}: format_version {data['format_version']} is newer than this sparkseg "
            f"understands ({FORMAT_VERSION}): upgrade sparkseg"
        )
    manifest = ModelManifest(root=root, data=data, model_sha256=hashlib.sha256(raw).hexdigest())
    if manifest.model == "yolact" and "priors" not in data["files"]:
        raise ModelManifestError(f"{path}: a yolact manifest must list its priors file: re-export the model")
    if verify:
        manifest.verify_files(INFERENCE_ROLES)
    return manifest


def write_manifest(model_dir: str | Path, data: dict) -> ModelManifest:
    """Fill `sha256` for every file in `data['files']`, write manifest.json, return the loaded manifest."""
    root = Path(model_dir)
    data = {"format_version": FORMAT_VERSION, **data}
    data["sha256"] = {rel: file_sha256(root / rel) for rel in data["files"].values()}
    (root / MANIFEST_NAME).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    manifest = load_manifest(root, verify=False)
    manifest.verify_files()
    return manifest
