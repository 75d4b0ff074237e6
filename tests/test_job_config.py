"""The job's typed config: conf/local.yaml's defaults typed into frozen sections, every key checked by name."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import zipfile

import pytest
import yaml

from pipelines.job_config import REPO_ROOT as REPO
from pipelines.job_config import ConfigError, JobConfig, default_config_path, load_config, set_path
from pipelines.spark.spark_session import DRIVER_ONLY_SUBPACKAGES, library_archive, staged_library_archive


def typed(**overrides) -> JobConfig:
    config = load_config()
    for key, value in overrides.items():
        set_path(config, key.replace("__", "."), value)
    return JobConfig.from_dict(config)


def test_the_packaged_defaults_are_the_typed_config_and_round_trip_through_a_dict():
    config = typed()
    assert config.inference.batch_size == 8 and config.output.score_threshold is None
    assert config.run.lock_stale_after_s == 600.0 and isinstance(config.run.lock_stale_after_s, float)
    assert config.input.video.extensions == (".mp4", ".mov", ".avi", ".mkv", ".webm")
    assert config.input.listed_extensions[:2] == [".jpg", ".jpeg"]
    # the summary writes asdict(config): reading it back gives the same config
    assert JobConfig.from_dict(yaml.safe_load(yaml.safe_dump(dataclasses.asdict(config)))) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.run.force = True


def test_every_default_lives_in_the_packaged_yaml_only():
    """The sections declare no defaults: a key missing from conf/local.yaml is an error, not a silent fallback."""
    config = typed()
    sections = [config.input.video, *(getattr(config, f.name) for f in dataclasses.fields(config))]
    for section in sections:
        for field in dataclasses.fields(section):
            assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, field
    data = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
    del data["run"]["poison_attempts"]
    with pytest.raises(ConfigError, match=r"missing key 'run\.poison_attempts'"):
        JobConfig.from_dict(data)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("inference.partitions", "4", r"inference\.partitions is '4': it must be an integer"),
        ("inference.batch_size", True, r"inference\.batch_size is True: it must be an integer"),
        ("run.force", "yes", r"run\.force is 'yes': it must be true or false"),
        ("input.extensions", ".jpg", r"input\.extensions is '\.jpg': it must be a list of strings"),
        ("output.masks", "png", r"output\.masks \(--masks\) is 'png': choose one of rle_and_png, rle, none"),
        ("inference.engine", "torch", r"inference\.engine \(--engine\) is 'torch': choose one of native, bigdl"),
        ("input.video.fps", 0, r"input\.video\.fps \(--fps\) is 0.0: give a number > 0"),
        ("run.max_error_fraction", 2, r"run\.max_error_fraction is 2.0: give a fraction between 0 and 1"),
        (
            "spark.conf",
            ["spark.executor.cores=2"],
            r"spark\.conf is \['spark\.executor\.cores=2'\]: it must be a mapping",
        ),
        ("spark.log_level", "LOUD", r"spark\.log_level is 'LOUD': give one of ALL, TRACE, DEBUG, INFO, WARN, ERROR"),
        (
            "model.dir",
            "",
            r"model\.dir \(--model\) is '': give an export directory or a models:/ URI, or null for the job's bundled",
        ),
        (
            "run.lock_heartbeat_s",
            -5,
            r"run\.lock_heartbeat_s is -5.0: give seconds > 0 and below run\.lock_stale_after_s",
        ),
        (
            "run.lock_stale_after_s",
            10,
            r"run\.lock_heartbeat_s is 30.0: give seconds > 0 and below run\.lock_stale_after_s "
            r"\(10.0\)",
        ),
        ("stream.trigger_interval", "soon", r"stream\.trigger_interval \(--trigger-interval\) is 'soon': e\.g\. 30s"),
        ("stream.source", "kafka", r"stream\.source is 'kafka': choose one of file, cloudFiles"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key_and_what_it_must_be(key, value, message):
    with pytest.raises(ConfigError, match=message):
        typed(**{key.replace(".", "__"): value})


def test_numbers_are_typed_as_the_section_declares():
    config = typed(output__score_threshold=1, input__video__fps=25, run__max_error_fraction=0)
    assert config.output.score_threshold == 1.0 and isinstance(config.output.score_threshold, float)
    assert isinstance(config.input.video.fps, float) and isinstance(config.run.max_error_fraction, float)
    assert typed(input__video__extensions=[".MP4"]).input.video.extensions == (".mp4",)
    assert [typed(stream__trigger_interval=t).stream.interval_s() for t in ("30s", "500ms", "2min", "1.5 h")] == [
        30.0,
        0.5,
        120.0,
        5400.0,
    ]


def test_an_unknown_key_is_refused_with_the_known_ones_listed(tmp_path):
    data = load_config()
    data["inference"]["partition"] = 3
    with pytest.raises(ConfigError, match=r"unknown key 'inference\.partition' \(known: batch_size, engine, "):
        JobConfig.from_dict(data)
    user = tmp_path / "job.yaml"
    user.write_text("output:\n  mask: rle\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown key 'output\.mask'"):
        load_config(user)


def test_a_section_left_empty_keeps_its_defaults_and_takes_the_command_lines_overrides(tmp_path):
    from pipelines.job_cli import build_config, parse_args

    user = tmp_path / "job.yaml"
    user.write_text("input:\nspark:\n  conf:\n", encoding="utf-8")
    assert load_config(user) == load_config()
    config = build_config(parse_args(["--config", str(user), "--input", "/data/in", "--conf", "spark.task.cpus=1"]))
    assert (config["input"]["uri"], config["spark"]["conf"]["spark.task.cpus"]) == ("/data/in", "1")


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "inference: [1, 2\n",
            r"job\.yaml: not valid YAML: line 2, column 1: expected ',' or ']', but got '<stream "
            r"end>' \(while parsing a flow sequence\)$",
        ),
        ("a:\n\t- b\n", r"job\.yaml: not valid YAML: line 2, column 1: found character '\\t' that cannot start any "),
        (
            "- inference\n",
            r"job\.yaml: holds a list, not a mapping of keys: not a config file \(see conf/ for examples\)$",
        ),
        (
            "inference:\n  batch_size: 2\n  batch_size: 4\n",
            r"job\.yaml: not valid YAML: line 3, column 3: found the key "
            r"'batch_size' twice in one mapping$",
        ),
    ],
)
def test_a_file_that_is_no_config_is_one_line_naming_it_and_where_it_went_wrong(tmp_path, text, message):
    user = tmp_path / "job.yaml"
    user.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(user)
    assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match=r": a directory, not a config file"):
        load_config(tmp_path)


def test_the_library_shipped_to_executors_leaves_the_driver_only_tools_out(tmp_path):
    names = zipfile.ZipFile(library_archive(REPO / "pipelines", tmp_path / "lib.zip")).namelist()
    assert "pipelines/inference/image_inference.py" in names and "pipelines/job_config.py" in names
    assert DRIVER_ONLY_SUBPACKAGES == ("sweeps", "tools")
    assert not [n for n in names if n.startswith(("pipelines/sweeps/", "pipelines/tools/")) or "__pycache__" in n]


def test_the_shipped_library_imports_from_its_bytecode(tmp_path):
    archive = library_archive(REPO / "pipelines", tmp_path / "lib.zip")
    names = set(zipfile.ZipFile(archive).namelist())
    assert {n + "c" for n in names if n.endswith(".py")} <= names  # x.pyc beside x.py, where zipimport reads it
    # a fresh interpreter imports the executor's modules from the zip's bytecode (__file__ names the .pyc), and a
    # traceback still shows the source lines
    code = (
        "import sys, traceback; sys.path.insert(0, sys.argv[1]); "
        "from pipelines.inference import image_inference as m; print(m.__file__); "
        "from pipelines.job_config import JobConfig\n"
        "try:\n    JobConfig.from_dict({})\nexcept Exception:\n    traceback.print_exc(file=sys.stdout)"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code, str(archive)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if "site-packages" in p)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(archive / "pipelines" / "inference" / "image_inference.pyc")
    assert "raise ConfigError(" in result.stdout, result.stdout


def test_the_shipped_zip_is_built_once_per_version_of_the_library(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the zips are staged
    (tmp_path / "tmp").mkdir()
    package = tmp_path / "tinylib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "value.py").write_text("VALUE = 1\n")
    first = staged_library_archive(package)
    assert staged_library_archive(package) == first and first.name == "sparkseg_tinylib.zip"  # reused, not rebuilt
    (package / "value.py").write_text("VALUE = 2\n")
    second = staged_library_archive(package)
    assert second != first and "tinylib/value.pyc" in zipfile.ZipFile(second).namelist()
    assert sorted(p.name for p in (tmp_path / "tmp").glob("*/*")) == ["sparkseg_tinylib.zip"] * 2  # no temp files


def test_training_configs_are_typed_as_their_fields_declare():
    from pipelines.training.config import TrainConfigError, load_train_config
    from pipelines.training.detector_config import load_detector_train_config

    for key, value, kind in (
        ("train.lr", "abc", "a number"),
        ("train.epochs", 2.5, "an integer"),
        ("train.lr_milestones", 0.5, "a list"),
        ("model.max_size", "big", "an integer"),
    ):
        with pytest.raises(TrainConfigError, match=rf"^{key} is .*: it must be {kind} \(see conf/train_yolact\.yaml\)"):
            load_train_config(overrides={key: value})
    config = load_train_config(overrides={"train.lr": 1, "distributed.use_gpu": False, "model.max_size": None})
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float) and config.distributed.use_gpu is False
    with pytest.raises(TrainConfigError, match=r"distributed\.use_gpu is 3: it must be a string or true or false"):
        load_train_config(overrides={"distributed.use_gpu": 3})
    with pytest.raises(TrainConfigError, match=r"\(see conf/train_detector\.yaml\)"):
        load_detector_train_config(overrides={"train.epochs": "many"})


def test_a_training_config_with_a_section_left_empty_keeps_its_defaults(tmp_path):
    from pipelines.training.config import TrainConfig, TrainConfigError, load_train_config

    user = tmp_path / "train.yaml"
    user.write_text("train:\naugment:\n", encoding="utf-8")
    assert load_train_config(user).train == TrainConfig().train
    assert load_train_config(user, {"train.epochs": 2}).train.epochs == 2
    user.write_text("train: 5\n", encoding="utf-8")
    with pytest.raises(TrainConfigError, match=r"^train is 5: it must be a section of keys"):
        load_train_config(user)
