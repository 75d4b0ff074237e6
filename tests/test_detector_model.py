"""The FactorNet Faster R-CNN definition: configs, backbone shapes, and a training step on Pascal VOC data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_export.models.factornet_detector import (
    DETECTOR_CONFIGS,
    FactorBlock,
    FactorNetBackbone,
    FactorNetDetector,
    get_detector_config,
)


def test_configs_validate_with_clear_errors():
    assert {"factornet", "factornet_fpn", "factornet_small"} <= set(DETECTOR_CONFIGS)
    small = get_detector_config("factornet_small")
    assert small.class_names == ("pothole", "crack", "patch", "puddle") and small.num_classes == 5
    assert small.input_size == (320, 320)
    assert small.mean_255 == pytest.approx((123.675, 116.28, 103.53))
    with pytest.raises(ValueError, match="multiples of 32"):
        get_detector_config("factornet_small", input_size=(300, 320))
    with pytest.raises(ValueError, match="one anchor size per level"):
        get_detector_config("factornet_small_fpn", anchor_sizes=(32, 64))
    with pytest.raises(KeyError, match="factornet_small"):
        get_detector_config("factornet_tiny")
    with pytest.raises(TypeError, match="num_anchors"):
        get_detector_config("factornet_small", num_anchors=3)


def test_factornet_shapes_and_sub_factors():
    block = FactorBlock(12, 8)
    assert [m[-1][0].kernel_size for m in (block.conv3, block.conv5, block.conv7)] == [(3, 3), (5, 5), (7, 7)]
    assert isinstance(block.pool[0], torch.nn.MaxPool2d)
    assert block(torch.zeros(1, 12, 10, 10)).shape == (1, 32, 10, 10)

    x = torch.zeros(1, 3, 320, 320)
    plain = FactorNetBackbone(get_detector_config("factornet_small")).eval()
    features = plain(x)
    assert list(features) == ["0"] and features["0"].shape == (1, 64, 20, 20)  # last stage, stride 16
    assert plain.out_channels == 64
    fpn = FactorNetBackbone(get_detector_config("factornet_small_fpn")).eval()
    features = fpn(x)
    assert {name: tuple(f.shape) for name, f in features.items()} == {
        "0": (1, 32, 40, 40),
        "1": (1, 32, 20, 20),
        "pool": (1, 32, 10, 10),
    }
    assert fpn.feature_names == ["0", "1"]


def test_state_dict_keys_are_torchvision_faster_rcnn():
    keys = set(FactorNetDetector(get_detector_config("factornet_small")).state_dict())
    assert "backbone.body.stem.0.0.weight" in keys and "backbone.body.stages.0.0.conv7.1.0.weight" in keys
    assert "rpn.head.cls_logits.weight" in keys and "roi_heads.box_predictor.cls_score.weight" in keys
    assert "roi_heads.box_head.fc6.weight" in keys


def test_one_training_step_on_voc_annotations(tmp_path):
    """The detector trains on Pascal VOC annotated images: synthetic roads -> VOC XML -> targets -> losses."""
    from pipelines.datasets import read_voc_dir
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.ops.image_decode import decode_image

    cfg = get_detector_config("factornet_small")
    generate_road_dataset(tmp_path, 2, 5, RoadSceneConfig(width=160, height=120, formats=("voc",)))
    dataset = read_voc_dir(tmp_path / "voc", cfg.class_names)
    images, targets = [], []
    for record in dataset.images:
        rgb = decode_image((tmp_path / "images" / record.file_name).read_bytes(), record.file_name)
        images.append(torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0)
        targets.append(
            {
                "boxes": torch.tensor([a.box for a in record.annotations], dtype=torch.float32),
                "labels": torch.tensor([a.category_id for a in record.annotations], dtype=torch.int64),
            }
        )
    assert all(len(t["labels"]) for t in targets)
    torch.manual_seed(0)
    model = FactorNetDetector(cfg).train()
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    total = sum(losses.values())
    assert np.isfinite(total.detach().item())
    total.backward()
    assert model.backbone.body.stem[0][0].weight.grad.abs().sum() > 0
