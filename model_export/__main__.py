import importlib.util
import sys

# The export stage needs the `export` extra; `make demo` and an inference-only install (executors) leave it out.
_missing = [name for name in ("torch", "onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
if _missing:
    print(
        f"error: python -m model_export needs {', '.join(_missing)} (the export extra), which this Python "
        f"({sys.executable}) lacks: pip install -c constraints.txt -e '.[export]' in the checkout (make test "
        "installs it into .venv)",
        file=sys.stderr,
    )
    sys.exit(2)

from model_export.cli import main  # noqa: E402

sys.exit(main())
