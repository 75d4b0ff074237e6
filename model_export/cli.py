"""`python -m model_export FAMILY ...`: one subcommand per model family, each a module with
`add_arguments(parser)` and `main(args) -> exit code`."""
from __future__ import annotations

import argparse
import importlib
import sys

FAMILIES = {
    "yolact": ("model_export.yolact_export", "YOLACT instance segmentation"),
    "detector": ("model_export.detector_export", "road-distress detector (FactorNet Faster R-CNN)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export",
                                     description="Export a model to ONNX and OpenVINO IR, with a parity report.")
    families = parser.add_subparsers(dest="family", required=True, metavar="FAMILY")
    modules = {}
    for name, (module_name, help_text) in FAMILIES.items():
        modules[name] = importlib.import_module(module_name)
        modules[name].add_arguments(families.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    return modules[args.family].main(args)


if __name__ == "__main__":
    sys.exit(main())
