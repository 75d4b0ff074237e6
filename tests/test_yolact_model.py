"""YOLACT v1 model: official state_dict layout, static sizes, priors, forward outputs, ONNX export."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model_export.models.yolact import COCO_CLASSES, CONFIGS, Yolact, bias_class_logits, get_config

KEYS_DIR = Path(__file__).parent / "data" / "yolact_keys"
P3_TO_P7_550 = [(69, 69), (35, 35), (18, 18), (9, 9), (5, 5)]


def official_keys(name: str) -> list[tuple[str, str]]:
    """(key, shape) in state_dict order, as read off the reference implementation."""
    lines = (KEYS_DIR / f"keys_{name}.tsv").read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines if line]


def shape_text(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) if t.dim() else "scalar"


def meta_model(name: str, **overrides) -> Yolact:
    """Structure only (no memory for weights): enough for keys, shapes, sizes and priors."""
    with torch.device("meta"):
        return Yolact(get_config(name, **overrides))


@pytest.fixture(scope="module")
def r50() -> Yolact:
    torch.manual_seed(0)
    return Yolact(get_config("yolact_resnet50")).eval()


@pytest.fixture(scope="module")
def small() -> Yolact:
    torch.manual_seed(0)
    return Yolact(get_config("yolact_r18_small")).eval()


# ------------------------------------------------------------------------------------------------ state_dict
@pytest.mark.parametrize(
    "name, keys_file",
    [
        ("yolact_resnet50", "yolact_resnet50"),
        ("yolact_base", "yolact_base"),
        ("yolact_darknet53", "yolact_darknet53"),
        ("yolact_im700", "yolact_base"),
    ],
)
def test_state_dict_keys_order_and_shapes_equal_the_official_ones(name, keys_file):
    model = meta_model(name)
    ours = [(key, shape_text(t)) for key, t in model.state_dict().items()]
    assert ours == official_keys(keys_file)


def test_parameter_counts_match_the_spec():
    counts = {
        name: sum(t.numel() for t in meta_model(name).state_dict().values())
        for name in ("yolact_resnet50", "yolact_base", "yolact_darknet53")
    }
    assert counts == {"yolact_resnet50": 31_218_116, "yolact_base": 50_262_519, "yolact_darknet53": 47_818_851}


def test_proto_net_layout():
    proto = meta_model("yolact_resnet50").proto_net
    assert [i for i, m in enumerate(proto) if isinstance(m, nn.Conv2d)] == [0, 2, 4, 8, 10]
    assert isinstance(proto[6], nn.Upsample) and proto[6].scale_factor == 2 and proto[6].mode == "bilinear"
    assert isinstance(proto[7], nn.ReLU)  # the reference puts a ReLU after the upsample too


# ------------------------------------------------------------------------------------------------- configs
def test_registry_holds_the_released_configs_and_ours():
    assert {"yolact_resnet50", "yolact_base", "yolact_im700", "yolact_darknet53", "yolact_r18_small"} <= set(CONFIGS)
    base = get_config("yolact_base")
    assert base.num_classes == 81 and base.class_names == COCO_CLASSES and len(COCO_CLASSES) == 80
    assert base.mean == (123.68, 116.78, 103.94) and base.std == (58.40, 57.12, 57.38)
    assert get_config("yolact_im700").pred_scales == (30, 61, 122, 244, 488)
    dark = get_config("yolact_darknet53")
    assert dark.normalization == "div255" and dark.mean == (0.0, 0.0, 0.0) and dark.std == (255.0, 255.0, 255.0)
    small = get_config("yolact_r18_small")
    assert small.max_size == 352 and small.pred_scales == (15, 30, 61, 122, 245)
    assert small.class_names == ("pothole", "crack", "patch", "puddle") and small.num_classes == 5
    assert (base.conf_thresh, base.nms_thresh, base.top_k, base.max_num_detections) == (0.05, 0.5, 200, 100)


def test_get_config_overrides_and_errors():
    cfg = get_config("yolact_resnet50", class_names=["a", "b"], max_size=640)
    assert cfg.num_classes == 3 and cfg.class_names == ("a", "b") and cfg.max_size == 640
    assert CONFIGS["yolact_resnet50"].num_classes == 81  # the registry entry is untouched
    with pytest.raises(KeyError, match="yolact_base.*yolact_darknet53.*yolact_r18_small"):
        get_config("yolact_nope")
    with pytest.raises(ValueError, match="also pass class_names"):
        get_config("yolact_resnet50", num_classes=5)
    with pytest.raises(ValueError, match="class_names has 2 names but num_classes 5"):
        get_config("yolact_resnet50", num_classes=5, class_names=("a", "b"))
    with pytest.raises(TypeError, match="unknown override.*num_clases"):
        get_config("yolact_resnet50", num_clases=5)


# ------------------------------------------------------------------------------------------- sizes, priors
def test_feature_map_sizes_and_prior_counts():
    for name in ("yolact_resnet50", "yolact_darknet53"):
        assert meta_model(name).feature_map_sizes() == P3_TO_P7_550
    im700 = meta_model("yolact_im700")
    assert im700.feature_map_sizes() == [(88, 88), (44, 44), (22, 22), (11, 11), (6, 6)]
    assert im700.proto_size() == (176, 176)
    assert im700.priors().shape == (30963, 4)
    r50 = meta_model("yolact_resnet50")
    assert r50.feature_map_sizes(700) == im700.feature_map_sizes()
    assert r50.feature_map_sizes((480, 640))[0] == (60, 80)
    priors = r50.priors()
    assert priors.shape == (19248, 4) and priors.dtype == np.float32
    side = [24 / 550, 24 * np.sqrt(0.5) / 550, 24 * np.sqrt(2) / 550]  # square anchors, scale / max_size
    np.testing.assert_allclose(priors[:3], [[0.5 / 69, 0.5 / 69, s, s] for s in side], rtol=1e-6)


# ------------------------------------------------------------------------------------------------- forward
def test_resnet50_forward_shapes_at_550(r50):
    pyramid_sizes = []
    hook = r50.fpn.register_forward_hook(lambda m, i, out: pyramid_sizes.extend(tuple(p.shape[-2:]) for p in out))
    torch.manual_seed(1)
    with torch.no_grad():
        loc, conf, mask, proto = r50(torch.randn(1, 3, 550, 550))
    hook.remove()
    assert pyramid_sizes == P3_TO_P7_550 == r50.feature_map_sizes()
    assert loc.shape == (1, 19248, 4) and conf.shape == (1, 19248, 81) and mask.shape == (1, 19248, 32)
    assert proto.shape == (1, 138, 138, 32)
    torch.testing.assert_close(conf.sum(-1), torch.ones(1, 19248))
    assert mask.abs().max() <= 1 and proto.min() >= 0


def test_fpn_upsamples_to_the_exact_sizes_with_reversed_layer_lists(r50):
    fpn = r50.fpn
    torch.manual_seed(2)
    c3, c4, c5 = torch.randn(1, 512, 69, 69), torch.randn(1, 1024, 35, 35), torch.randn(1, 2048, 18, 18)
    with torch.no_grad():
        p3, p4, p5, p6, p7 = fpn([c3, c4, c5], [(69, 69), (35, 35), (18, 18)])
        x5 = fpn.lat_layers[0](c5)
        x4 = F.interpolate(x5, size=(35, 35), mode="bilinear", align_corners=False) + fpn.lat_layers[1](c4)
        x3 = F.interpolate(x4, size=(69, 69), mode="bilinear", align_corners=False) + fpn.lat_layers[2](c3)
        expected = [F.relu(fpn.pred_layers[2](x3)), F.relu(fpn.pred_layers[1](x4)), F.relu(fpn.pred_layers[0](x5))]
        expected_p6 = fpn.downsample_layers[0](expected[2])
    for got, want in zip((p3, p4, p5, p6), expected + [expected_p6]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert p6.shape[-2:] == (9, 9) and p7.shape[-2:] == (5, 5)
    assert p6.min() < 0 and p7.min() < 0  # no ReLU on the stride-2 levels


def test_small_config_forward_eval(small):
    torch.manual_seed(3)
    with torch.no_grad():
        loc, conf, mask, proto = small(torch.randn(2, 3, 352, 352))
    assert small.feature_map_sizes() == [(44, 44), (22, 22), (11, 11), (6, 6), (3, 3)]
    n = small.priors().shape[0]
    assert n == 3 * (44 * 44 + 22 * 22 + 11 * 11 + 6 * 6 + 3 * 3)
    assert loc.shape == (2, n, 4) and conf.shape == (2, n, 5) and mask.shape == (2, n, 32)
    assert proto.shape == (2, 88, 88, 32)


def test_train_mode_returns_raw_logits_and_semantic_segmentation():
    torch.manual_seed(3)
    model = Yolact(get_config("yolact_r18_small")).train()
    out = model(torch.randn(2, 3, 160, 160))  # any input size works; 160 keeps the backward pass cheap
    assert set(out) == {"loc", "conf", "mask", "proto", "segm"}
    assert model.feature_map_sizes(160) == [(20, 20), (10, 10), (5, 5), (3, 3), (2, 2)]
    n = model.priors(160).shape[0]
    assert out["conf"].shape == (2, n, 5) and out["conf"].min() < 0  # logits, not softmax
    assert out["proto"].shape == (2, 40, 40, 32) and out["segm"].shape == (2, 4, 20, 20)
    out["conf"].sum().backward()
    assert model.prediction_layers[0].conf_layer.weight.grad is not None


def test_forward_rejects_a_non_rgb_batch(small):
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\].*\(1, 4, 352, 352\)"):
        small(torch.zeros(1, 4, 352, 352))


def test_bias_class_logits_boosts_the_given_conf_columns():
    torch.manual_seed(4)
    model = Yolact(get_config("yolact_r18_small")).eval()
    bias_class_logits(model, [1, 3], logit=20.0)
    with torch.no_grad():
        _, conf, _, _ = model(torch.randn(1, 3, 352, 352))
    top = conf[0].argmax(-1)
    assert set(top.unique().tolist()) <= {1, 3}
    assert conf[0, :, [1, 3]].sum(-1).min() > 0.9  # every prior is a Detect candidate for a boosted class
    with pytest.raises(ValueError, match=r"\[0\] out of range.*1\.\.4"):
        bias_class_logits(model, [0])


# ---------------------------------------------------------------------------------------------------- ONNX
def test_onnx_export_of_the_small_config_is_static_and_matches_torch(small):
    torch.manual_seed(5)
    x = torch.randn(1, 3, 352, 352)
    names = ["loc", "conf", "mask", "proto"]
    buffer = io.BytesIO()
    with torch.no_grad():
        expected = small(x)
        torch.onnx.export(
            small, (x,), buffer, input_names=["image"], output_names=names, opset_version=11, dynamo=False
        )
    graph = onnx.load_from_string(buffer.getvalue())
    ops = {node.op_type for node in graph.graph.node}
    assert "Shape" not in ops and "Resize" in ops
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    got = session.run(names, {"image": x.numpy()})
    for name, ours, ref in zip(names, got, expected):
        assert ours.shape == tuple(ref.shape), name
        np.testing.assert_allclose(ours, ref.numpy(), rtol=0, atol=1e-4, err_msg=name)
