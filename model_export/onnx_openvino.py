"""Family-agnostic export steps: PyTorch -> ONNX -> simplified ONNX -> OpenVINO IR (FP16 weights)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from pipelines.errors import RunFailed, UsageError


class ParityFailed(RunFailed):
    """The exported model does not give PyTorch's answers: no manifest.json is written."""


EXPORT_FILES = ("manifest.json", "parity.json", "model.onnx")  # one of them: a directory an export wrote


@dataclass
class ExportTarget:
    """--out of one export. `kept`: where the failed export's files went when an earlier, passing export was kept."""

    out: Path
    kept: Path | None = None

    @property
    def aside(self) -> Path:
        return self.out.with_name(f".{self.out.name}.previous")


@contextmanager
def replacing_export(out: Path) -> Iterator[ExportTarget]:
    """The export's --out: a new or empty directory, or one an earlier export wrote (UsageError, exit 2, for a
    directory of other files). An earlier export that passed (its manifest.json) is set aside while the new one is
    written and removed once it passes; when the new one fails or is interrupted, the earlier one is put back and the
    new files go to <out>.failed (target.kept) for inspection. An earlier failed export is overwritten."""
    target = ExportTarget(Path(out))
    out, aside = target.out, target.aside
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in EXPORT_FILES):
        raise UsageError(
            f"--out {out}: not empty and not an earlier export (no {', '.join(EXPORT_FILES)}): "
            "choose a new or empty directory"
        )
    if aside.exists():  # left by an export that was killed: the earlier export, unless it finished since
        if (out / "manifest.json").exists():
            shutil.rmtree(aside)
        else:
            shutil.rmtree(out, ignore_errors=True)
            aside.rename(out)
    if (out / "manifest.json").exists():
        out.rename(aside)
    try:
        yield target
    except BaseException:
        if aside.exists():
            failed = out.with_name(out.name + ".failed")
            shutil.rmtree(failed, ignore_errors=True)
            if out.exists():
                out.rename(failed)
            aside.rename(out)
            target.kept = failed
        raise
    shutil.rmtree(aside, ignore_errors=True)


def start_export(args, opset_rule: str, build_model) -> tuple[StageTimer, Path, torch.nn.Module, dict]:
    """An export's first stage: its timer, its output directory (--out, created) and `build_model(args)`'s (model,
    weights record), timed as "build_model". An --opset below 11 is refused (exit 2): `opset_rule` says why."""
    if args.opset < 11:
        raise UsageError(f"--opset {args.opset}: {opset_rule}")
    timer, out = StageTimer(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with timer.stage("build_model"):
        model, weights = build_model(args)
    return timer, out, model, weights


def require_weights_choice(weights: str | None, random_init: bool, checkpoint: str) -> None:
    """Exactly one of --weights (a `checkpoint`) and --random-init; else UsageError (exit 2)."""
    if not weights and not random_init:
        raise UsageError(
            f"pass --weights CKPT.pth ({checkpoint}) or --random-init (random weights, for tests and benchmarks only)"
        )
    if weights and random_init:
        raise UsageError("--weights and --random-init exclude each other")


def class_names_flag(text: str | None) -> tuple[str, ...] | None:
    """--class-names a,b,c -> ("a", "b", "c"); None when not given."""
    return tuple(name.strip() for name in text.split(",")) if text else None


class StageTimer:
    """Collects wall time per export stage (seconds), reported in parity.json and the manifest."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - start, 3)


def export_onnx(
    model: torch.nn.Module, example: torch.Tensor, path: Path, input_name: str, output_names: list[str], opset: int
) -> None:
    """Trace `model` (eval mode) at the static shape of `example` into an ONNX file."""
    model.eval()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=[input_name],
            output_names=output_names,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )


def simplify_onnx(src: Path, dst: Path) -> None:
    """Constant folding and graph cleanup with onnxslim (the maintained successor of onnx-simplifier)."""
    import onnx
    import onnxslim

    model = onnxslim.slim(onnx.load(str(src)))
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


def convert_to_ir(onnx_path: Path, xml_path: Path, compress_to_fp16: bool = True) -> None:
    """OpenVINO IR (xml + bin). FP16 weights halve the file; the runtime still computes in f32 or bf16."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx_path)), str(xml_path), compress_to_fp16=compress_to_fp16)


def export_all(
    network: torch.nn.Module,
    example: torch.Tensor,
    out: Path,
    files: dict,
    input_name: str,
    output_names: list[str],
    opset: int,
    timer: StageTimer,
) -> None:
    """The three conversion stages into `out` (file names from `files`: onnx, onnx_simplified, ir_xml), timed."""
    with timer.stage("onnx_export"):
        export_onnx(network, example, out / files["onnx"], input_name, output_names, opset)
    with timer.stage("onnx_simplify"):
        simplify_onnx(out / files["onnx"], out / files["onnx_simplified"])
    with timer.stage("openvino_convert"):
        convert_to_ir(out / files["onnx_simplified"], out / files["ir_xml"])


def save_parity_report(out: Path, report: dict, files: dict, timer: StageTimer, table: str) -> None:
    """Write parity.json (with stage times and file sizes) and print it; raise ParityFailed when the gate failed,
    else add parity.json to `files` for the manifest."""
    report["export_seconds"] = timer.seconds
    report["file_bytes"] = {rel: (out / rel).stat().st_size for rel in files.values()}
    (out / "parity.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(table)
    print("export seconds per stage:", json.dumps(timer.seconds))
    if not report["passed"]:
        raise ParityFailed(
            "parity gate failed (no manifest.json written, the directory is not usable):\n  "
            + "\n  ".join(report["failures"])
        )
    files["parity"] = "parity.json"


def tool_versions() -> dict[str, str]:
    versions = {}
    for dist in ("torch", "torchvision", "onnx", "onnxruntime", "onnxslim", "openvino", "nncf", "numpy", "sparkseg"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions
