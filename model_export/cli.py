"""`python -m model_export FAMILY ...`: one subcommand per model family, each a module with
`add_arguments(parser)` and `export(args) -> parity report`.

Exit codes: 0 exported and parity passed; 2 bad arguments, a checkpoint that does not fit or calibration images
that cannot be used, an --out that holds other files, a --register-as whose registry does not answer (checked before
the export) or that failed (the export is kept); 3 parity (or the INT8 accuracy gate) failed (the files are
left for inspection, but no manifest.json, so no job will load them; where --out held an export that passed, it is
kept and the new files go to <out>.failed)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from model_export.onnx_openvino import replacing_export
from pipelines.errors import SparkSegError, report_error
from pipelines.io.model_registry import check_registry, register_model_dir

FAMILIES = {
    "yolact": ("model_export.yolact_export", "YOLACT instance segmentation"),
    "detector": ("model_export.detector_export", "road-distress detector (FactorNet Faster R-CNN)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model_export", description="Export a model to ONNX and OpenVINO IR, with a parity report."
    )
    families = parser.add_subparsers(dest="family", required=True, metavar="FAMILY")
    modules = {}
    for name, (module_name, help_text) in FAMILIES.items():
        modules[name] = importlib.import_module(module_name)
        family = families.add_parser(name, help=help_text)
        modules[name].add_arguments(family)
        family.add_argument(
            "--register-as",
            metavar="NAME",
            help="once exported, log the export directory as an MLflow run's artifacts and register it as a new "
            "version of the model NAME in the registry MLFLOW_REGISTRY_URI / MLFLOW_TRACKING_URI names (needs mlflow); "
            "prints its models:/NAME/VERSION",
        )
    args = parser.parse_args(argv)
    target = None
    try:
        if args.register_as:
            check_registry(args.register_as)  # before minutes of export
        with replacing_export(Path(args.out)) as target:
            modules[args.family].export(args)
        if args.register_as:
            print(f"registered {args.out} as {register_model_dir(args.out, args.register_as)}")
    except SparkSegError as err:  # ParityFailed: exit 3; bad checkpoint or calibration images: exit 2
        code = report_error(err)
        if target is not None and target.kept:
            print(
                f"{target.out}: the earlier export is kept; this export's files are in {target.kept}", file=sys.stderr
            )
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
