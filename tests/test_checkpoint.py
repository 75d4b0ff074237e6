"""Checkpoint loading: official layouts (state_dicts built here from the reference key lists, not from our model),
the released files' extras, clear errors for files that do not fit, are corrupt, or would run code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from model_export.models.checkpoint import CheckpointError, load_for_finetune, load_yolact_checkpoint
from model_export.models.yolact import Yolact, get_config

KEYS_DIR = Path(__file__).parent / "data" / "yolact_keys"
OFFICIAL = ("yolact_resnet50", "yolact_base", "yolact_darknet53")
RELEASE_EXTRAS = {
    "fpn.downsample_layers.2.weight": (256, 256, 3, 3),
    "fpn.downsample_layers.2.bias": (256,),
    "backbone.layer1.0.conv1.weight": (64, 64, 1, 1),
}


def official_state_dict(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the reference keys and shapes (keys_<name>.tsv), in the reference order."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for line in (KEYS_DIR / f"keys_{name}.tsv").read_text(encoding="utf-8").splitlines():
        key, shape = line.split("\t")
        if shape == "scalar":
            state[key] = torch.randint(0, 1000, (), generator=generator)
        else:
            state[key] = torch.randn(*map(int, shape.split("x")), generator=generator)
    return state


@pytest.fixture(scope="module")
def official_states() -> dict[str, dict[str, torch.Tensor]]:
    return {name: official_state_dict(name) for name in OFFICIAL}


@pytest.fixture(scope="module")
def models() -> dict[str, Yolact]:
    return {name: Yolact(get_config(name)).eval() for name in OFFICIAL}


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("small") / "small.pth"
    torch.save(Yolact(get_config("yolact_r18_small")).state_dict(), path)
    return path


def assert_loaded(model: Yolact, state: dict[str, torch.Tensor]) -> None:
    ours = model.state_dict()
    different = [key for key, value in state.items() if not torch.equal(ours[key], value)]
    assert not different, different[:5]


# ----------------------------------------------------------------------------------------- official layouts
@pytest.mark.parametrize("name", OFFICIAL)
def test_official_layout_loads(name, official_states, models, tmp_path):
    state = official_states[name]
    torch.save(state, tmp_path / f"{name}.pth")
    report = load_yolact_checkpoint(models[name], tmp_path / f"{name}.pth")
    assert report.loaded == len(state) and report.dropped == () and report.kept_num_batches_tracked == ()
    assert_loaded(models[name], state)


@pytest.mark.parametrize("name", OFFICIAL)
def test_released_file_extras_are_dropped(name, official_states, models, tmp_path):
    state = dict(official_states[name])
    state.update({key: torch.randn(shape) for key, shape in RELEASE_EXTRAS.items()})
    torch.save({"state_dict": state}, tmp_path / "wrapped.pth")  # also: the state_dict under a "state_dict" entry
    report = load_yolact_checkpoint(models[name], tmp_path / "wrapped.pth")
    assert sorted(report.dropped) == sorted(RELEASE_EXTRAS)
    assert report.loaded == len(official_states[name])
    assert "ignored 3 known extra key(s)" in str(report)
    assert_loaded(models[name], official_states[name])


@pytest.mark.parametrize("name", OFFICIAL)
def test_missing_num_batches_tracked_is_tolerated(name, official_states, models, tmp_path):
    state = {k: v for k, v in official_states[name].items() if not k.endswith("num_batches_tracked")}
    torch.save({"model": state}, tmp_path / "no_counters.pth")
    report = load_yolact_checkpoint(models[name], tmp_path / "no_counters.pth")
    assert len(report.kept_num_batches_tracked) == len(official_states[name]) - len(state) > 0
    assert report.loaded == len(state)
    assert_loaded(models[name], state)


# --------------------------------------------------------------------------------------------- mismatches
def test_resnet50_checkpoint_into_yolact_base_names_the_first_missing_key(official_states, models, tmp_path):
    torch.save(official_states["yolact_resnet50"], tmp_path / "r50.pth")
    with pytest.raises(CheckpointError) as err:
        load_yolact_checkpoint(models["yolact_base"], tmp_path / "r50.pth")
    message = str(err.value)
    assert str(tmp_path / "r50.pth") in message and "yolact_base" in message
    first = message.splitlines()[1].strip()
    assert first == "backbone.layers.2.6.conv1.weight: missing from checkpoint (model 256x1024x1x1)"
    assert "looks like config 'yolact_resnet50' with num_classes 81" in message


def test_class_count_mismatch_names_the_key_and_both_shapes_then_finetune_loads(official_states, tmp_path):
    torch.save(official_states["yolact_resnet50"], tmp_path / "r50.pth")
    model = Yolact(get_config("yolact_resnet50", class_names=("pothole", "crack", "patch", "puddle"))).eval()
    with pytest.raises(CheckpointError) as err:
        load_yolact_checkpoint(model, tmp_path / "r50.pth")
    lines = str(err.value).splitlines()
    assert lines[1].strip() == "prediction_layers.0.conf_layer.weight: checkpoint 243x256x3x3, model 15x256x3x3"
    assert "load_for_finetune" in lines[-1]

    reset = load_for_finetune(model, tmp_path / "r50.pth")
    assert reset == [
        "prediction_layers.0.conf_layer.weight",
        "prediction_layers.0.conf_layer.bias",
        "semantic_seg_conv.weight",
        "semantic_seg_conv.bias",
    ]
    ours, theirs = model.state_dict(), official_states["yolact_resnet50"]
    assert torch.equal(ours["backbone.layers.3.2.conv3.weight"], theirs["backbone.layers.3.2.conv3.weight"])
    assert torch.equal(ours["prediction_layers.0.mask_layer.weight"], theirs["prediction_layers.0.mask_layer.weight"])
    assert ours["prediction_layers.0.conf_layer.weight"].shape == (15, 256, 3, 3)
    assert not ours["prediction_layers.0.conf_layer.bias"].any()  # re-initialized: zero bias


def test_finetune_refuses_a_different_architecture(official_states, tmp_path):
    torch.save(official_states["yolact_darknet53"], tmp_path / "dark.pth")
    model = Yolact(get_config("yolact_r18_small"))
    with pytest.raises(CheckpointError, match="does not fit model yolact_r18_small") as err:
        load_for_finetune(model, tmp_path / "dark.pth")
    assert "proto_net.0.weight: checkpoint 256x256x3x3, model 128x128x3x3" in str(err.value)
    assert "looks like config 'yolact_darknet53' with num_classes 81" in str(err.value)


# ------------------------------------------------------------------------------------------- unreadable files
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_file_fails_clearly(damage, small_checkpoint, tmp_path):
    data = small_checkpoint.read_bytes()
    content = {"truncated": data[: len(data) // 2], "garbage": b"not a checkpoint at all", "empty": b""}[damage]
    path = tmp_path / f"{damage}.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"{path}.* is not a readable PyTorch checkpoint"):
        load_yolact_checkpoint(Yolact(get_config("yolact_r18_small")), path)


def test_missing_file_and_non_state_dict_fail_clearly(tmp_path):
    model = Yolact(get_config("yolact_r18_small"))
    with pytest.raises(CheckpointError, match="nope.pth does not exist"):
        load_yolact_checkpoint(model, tmp_path / "nope.pth")
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="list.pth holds a list, not a state_dict"):
        load_yolact_checkpoint(model, tmp_path / "list.pth")


class _RunsShellCommand:
    """A pickle payload: unpickling it would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"echo pwned > {self.marker}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused_and_never_runs(writer, tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    payload = {"backbone.conv1.weight": _RunsShellCommand(marker)}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with path.open("wb") as f:
            pickle.dump(payload, f, protocol=2)
    with pytest.raises(CheckpointError, match=f"{path} was refused as unsafe"):
        load_yolact_checkpoint(Yolact(get_config("yolact_r18_small")), path)
    assert not marker.exists()
