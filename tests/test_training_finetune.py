"""Starting from a checkpoint trained with other classes (as the official 81-class COCO files): the backbone, FPN,
proto net and box/mask heads are loaded, the class-dependent layers re-initialized for the new classes."""

from __future__ import annotations

import torch

from model_export.models.yolact import COCO_CLASSES, Yolact, get_config
from pipelines.training.config import load_train_config
from pipelines.training.trainer import build_model


def test_init_from_a_coco_checkpoint_keeps_the_backbone_and_resets_the_class_layers(tmp_path):
    torch.manual_seed(123)
    coco = Yolact(get_config("yolact_r18_small", class_names=COCO_CLASSES, max_size=64))
    path = tmp_path / "coco_r18_small.pth"
    torch.save(coco.state_dict(), path)

    cfg = load_train_config(None, {"model.config": "yolact_r18_small", "model.max_size": 64, "model.init": str(path)})
    model = build_model(cfg)
    assert model.cfg.num_classes == 5
    state, source = model.state_dict(), coco.state_dict()
    for key in (
        "backbone.layers.0.0.conv1.weight",
        "fpn.lat_layers.0.weight",
        "proto_net.10.weight",
        "prediction_layers.0.bbox_layer.weight",
        "prediction_layers.0.mask_layer.weight",
    ):
        torch.testing.assert_close(state[key], source[key])
    assert state["prediction_layers.0.conf_layer.weight"].shape[0] == 3 * 5
    assert state["semantic_seg_conv.weight"].shape[0] == 4
    assert torch.count_nonzero(state["prediction_layers.0.conf_layer.bias"]) == 0  # re-initialized


def test_model_class_names_choose_the_classes_to_train(tmp_path):
    """model.class_names: the classes of a fine-tuning run (the config's by default); a checkpoint of the run
    records them, and its export takes them from it (tests/test_export_yolact.py)."""
    torch.manual_seed(5)
    coco = Yolact(get_config("yolact_r18_small", class_names=COCO_CLASSES, max_size=64))
    path = tmp_path / "coco_r18_small.pth"
    torch.save(coco.state_dict(), path)
    cfg = load_train_config(
        None,
        {
            "model.config": "yolact_r18_small",
            "model.max_size": 64,
            "model.init": str(path),
            "model.class_names": ["manhole", "rut"],
        },
    )
    model = build_model(cfg)
    assert (model.cfg.class_names, model.cfg.num_classes) == (("manhole", "rut"), 3)
    assert model.state_dict()["prediction_layers.0.conf_layer.weight"].shape[0] == 3 * 3
    assert load_train_config(None, {}).model.yolact_config().class_names == ("pothole", "crack", "patch", "puddle")
