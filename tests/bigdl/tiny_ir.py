"""A tiny two-output conv net saved as an OpenVINO IR, built with OpenVINO's own Python API (the BigDL env has no
torch): works with openvino 2023.3 (.venv-bigdl) and 2026 (main venv).

input `image` [1, 3, 64, 64] -> conv 3x3/2 (4 ch) -> relu ->
  `proto` [1, 32, 32, 2]: conv 1x1 (2 ch) -> transpose to NHWC (layer `to_nhwc`)
  `conf`  [1, 2, 32, 32]: the second half of a channel split (layer `split_heads`, port 1)
The layer names are chosen so that the legacy API's names ("split_heads.1", "to_nhwc", sorted) come in another
order than the IR's (proto, conf), and one of them has a dot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

INPUT_SHAPE = (1, 3, 64, 64)
OUTPUTS = {"proto": (1, 32, 32, 2), "conf": (1, 2, 32, 32)}  # IR order
LEGACY_NAMES = {"proto": "to_nhwc", "conf": "split_heads.1"}


def _opset():
    try:
        import openvino.opset11 as ops  # openvino >= 2024
    except ImportError:
        from openvino.runtime import opset11 as ops  # openvino 2023.x
    return ops


def build_tiny_ir(out_dir: str | Path, seed: int = 0) -> Path:
    """Write tiny.xml/tiny.bin (FP32 weights) into out_dir; return the .xml path."""
    import openvino as ov

    ops = _opset()
    rng = np.random.default_rng(seed)
    image = ops.parameter(list(INPUT_SHAPE), np.float32, name="image")
    conv_a = ops.convolution(
        image,
        ops.constant(rng.normal(0, 0.05, (4, 3, 3, 3)).astype(np.float32)),
        [2, 2],
        [1, 1],
        [1, 1],
        [1, 1],
        name="conv_a",
    )
    relu_a = ops.relu(conv_a, name="relu_a")
    conv_b = ops.convolution(
        relu_a,
        ops.constant(rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32)),
        [1, 1],
        [0, 0],
        [0, 0],
        [1, 1],
        name="conv_b",
    )
    to_nhwc = ops.transpose(conv_b, ops.constant(np.array([0, 2, 3, 1], dtype=np.int64)), name="to_nhwc")
    split = ops.split(relu_a, ops.constant(np.int64(1)), 2, name="split_heads")
    model = ov.Model([to_nhwc.output(0), split.output(1)], [image], "tiny_two_output")
    model.outputs[0].get_tensor().set_names({"proto"})
    model.outputs[1].get_tensor().set_names({"conf"})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    xml = out_dir / "tiny.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml
