"""The YOLACT inference job on a real local SparkSession with the bundled default model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import functions as F

from pipelines.inference.inference_job import run
from pipelines.inference.model_manifest import ModelManifestError, load_manifest
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.single_process import infer_files
from pipelines.job_config import ConfigError, load_config
from pipelines.ops.mask_outputs import decode_rle, read_label_map_png
from tests.bad_inputs import build_bad_input_corpus
from tests.conftest import SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR, JOB_RUNTIME, job_config, read_rows

MODEL_DIR = DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def sample_images(tmp_path_factory) -> Path:
    images = tmp_path_factory.mktemp("samples")
    for path in sorted((SAMPLES / "images").iterdir()):
        if path.suffix.lower() in (".jpg", ".jpeg", ".png"):
            shutil.copy(path, images / path.name)
    return images


@pytest.fixture(scope="module")
def sample_run(spark, sample_images, tmp_path_factory) -> tuple[Path, dict]:
    output = tmp_path_factory.mktemp("out")
    return output, run(spark, job_config(sample_images, output))


def test_spark_job_equals_single_process_run(spark, sample_images, sample_run):
    output, summary = sample_run
    paths = sorted(sample_images.iterdir())
    assert summary["counts"]["inputs"] == len(paths) and summary["counts"]["done"] == len(paths)
    # The reference runs with the job's own runtime settings (1 OpenVINO thread per task, f32): OpenVINO's f32
    # results change in the last bits with the thread count, so only identical settings make exact equality fair.
    reference = {
        row["path"]: row
        for row in infer_files(MODEL_DIR, [str(p) for p in paths], str(output), str(sample_images), JOB_RUNTIME)
    }
    rows = read_rows(spark, output, "detections")
    assert {row.path for row in rows} == set(reference)
    total = 0
    for row in rows:
        ref = reference[row.path]
        assert (row.width, row.height) == (ref["width"], ref["height"])
        assert [i.class_id for i in row.instances] == [i["class_id"] for i in ref["instances"]]
        np.testing.assert_array_equal(
            [i.score for i in row.instances], np.float32([i["score"] for i in ref["instances"]])
        )
        for inst, ref_inst in zip(row.instances, ref["instances"]):
            assert list(inst.box) == ref_inst["box"]
            assert inst.mask.counts == ref_inst["mask"]["counts"]  # RLE equal <=> masks pixel-identical
        total += len(row.instances)
    assert total > 0, "the bundled model must produce detections on the samples"


def test_outputs_are_consistent(spark, sample_run):
    output, summary = sample_run
    summary_file = json.loads((output / "summary.json").read_text())
    assert summary_file["counts"] == summary["counts"]
    assert set(summary_file["stage_seconds"]) == {"read", "preprocess", "infer", "postprocess", "write"}
    manifest = load_manifest(MODEL_DIR)
    for row in read_rows(spark, output, "detections"):
        assert row.model_sha256 == manifest.model_sha256
        label_map = read_label_map_png(Path(row.mask_path).read_bytes())
        assert label_map.shape == (row.height, row.width)
        assert label_map.max() <= len(row.instances)
        for number, inst in enumerate(row.instances, start=1):
            mask = decode_rle({"size": list(inst.mask.size), "counts": inst.mask.counts})
            assert mask.shape == (row.height, row.width)
            # the label map shows instance i wherever it is the highest-scored mask
            assert np.all(mask[label_map == number])
        assert Path(row.mask_path).resolve().is_relative_to(output.resolve())


def test_second_run_skips_everything_and_deleted_outputs_are_recomputed(spark, sample_images, tmp_path):
    output = tmp_path / "out"
    first = run(spark, job_config(sample_images, output))
    assert first["counts"]["done"] == first["counts"]["inputs"]
    # no image failed: errors/ is written once, empty and readable with its columns, and never appended to after
    error_parts = sorted((output / "errors").glob("part-*.parquet"))
    errors = spark.read.parquet(str(output / "errors"))
    assert len(error_parts) == 1 and errors.count() == 0 and {"path", "stage", "message"} <= set(errors.columns)
    second = run(spark, job_config(sample_images, output))
    assert second["counts"]["skipped"] == first["counts"]["inputs"]
    assert second["counts"]["done"] == second["counts"]["failed"] == 0
    parts = sorted((output / "detections").glob("part-*.parquet"))
    deleted = spark.read.parquet(str(parts[0])).select("path").collect()
    assert deleted
    parts[0].unlink()
    third = run(spark, job_config(sample_images, output))
    assert third["counts"]["done"] == len(deleted)
    assert third["counts"]["skipped"] == first["counts"]["inputs"] - len(deleted)
    rows = read_rows(spark, output, "detections")
    assert len(rows) == len({r.path for r in rows}) == first["counts"]["inputs"]
    forced_config = job_config(sample_images, output)  # the same output, where every image is done already
    forced_config["run"]["force"] = True
    forced = run(spark, forced_config)
    assert forced["counts"]["done"] == first["counts"]["inputs"] and forced["counts"]["skipped"] == 0
    assert sorted((output / "errors").glob("part-*.parquet")) == error_parts


def test_a_new_output_of_an_input_with_no_image_gets_its_tables_empty(spark, tmp_path):
    """A scheduled run over a landing folder that is empty today: whatever reads the output next finds both tables,
    with their columns, and a second such run adds no file."""
    (tmp_path / "in").mkdir()
    output = tmp_path / "out"
    summary = run(spark, job_config(tmp_path / "in", output))
    assert summary["counts"]["inputs"] == summary["counts"]["done"] == 0
    for table, column in (("detections", "instances"), ("errors", "message")):
        frame = spark.read.parquet(str(output / table))
        assert frame.count() == 0 and column in frame.columns
    files = sorted(output.rglob("*.parquet"))
    run(spark, job_config(tmp_path / "in", output))
    assert sorted(output.rglob("*.parquet")) == files


def test_bad_input_corpus_every_file_accounted_for(spark, tmp_path):
    corpus = tmp_path / "bad"
    corpus.mkdir()
    expected = build_bad_input_corpus(corpus)
    output = tmp_path / "out"
    summary = run(spark, job_config(corpus, output, partitions=3))
    detections = {Path(r.path).name: r for r in read_rows(spark, output, "detections")}
    errors = {Path(r.path).name: r for r in read_rows(spark, output, "errors")}
    assert not set(detections) & set(errors), "an image is in both detections/ and errors/"
    extensions = tuple(load_config()["input"]["extensions"])
    listed = {name for name in expected if Path(name).suffix.lower() in extensions}
    assert "empty.jpg" in listed
    assert set(detections) | set(errors) == listed
    for name in listed:
        if expected[name] == "ok":
            assert name in detections, f"{name} should have been processed: {errors.get(name)}"
        else:
            assert name in errors, f"{name} should be an error"
            assert errors[name].stage == "decode" and errors[name].message
    assert summary["counts"]["failed"] == len(errors)


def test_partitions_are_balanced_whatever_the_layout(spark, tmp_path):
    from pipelines.inference.image_sources import assign_partitions, balanced, list_images

    rng = np.random.default_rng(0)
    for i in range(1000):  # uneven nesting and sizes: most files in one deep directory
        depth = "deep/a/b/c" if i < 700 else f"d{i % 7}"
        path = tmp_path / depth / f"img{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * int(rng.integers(1, 5000)))
    listing = list_images(spark, str(tmp_path), [".jpg"])
    for partitions in (2, 7, 16):
        sizes = [
            n
            for n in balanced(assign_partitions(listing, partitions), partitions)
            .groupBy(F.spark_partition_id())
            .count()
            .select("count")
            .toPandas()["count"]
        ]
        assert len(sizes) == partitions and sum(sizes) == 1000
        assert max(sizes) / min(sizes) <= 1.1, sizes


def test_bad_model_directory_fails_before_any_task(spark, sample_images, tmp_path):
    tampered = tmp_path / "model"
    shutil.copytree(MODEL_DIR, tampered)
    with open(tampered / "model.bin", "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02\x03")
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))
    config = job_config(sample_images, tmp_path / "out")
    config["model"]["dir"] = str(tampered)
    with pytest.raises(ModelManifestError, match="model.bin.*sha256"):
        run(spark, config)
    (tampered / "manifest.json").unlink()
    with pytest.raises(ModelManifestError, match="manifest.json: missing"):
        run(spark, config)
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before
    assert not (tmp_path / "out").exists()


def test_executors_without_the_driver_filesystem_get_the_model_from_spark_files(spark, tmp_path):
    from pipelines.inference.image_inference import load_executor_model
    from pipelines.inference.waves import ship_model

    manifest = load_manifest(MODEL_DIR)
    staged = Path(ship_model(spark, manifest))
    elsewhere = str(tmp_path / "not-on-this-host" / staged.name)  # what a remote executor sees: no such dir
    sha = manifest.model_sha256

    def load(_):
        model = load_executor_model(elsewhere, sha, RuntimeSettings(precision="f32"))
        yield str(model.manifest.root), model.manifest.model_sha256

    roots = spark.sparkContext.parallelize([0], 1).mapPartitions(load).collect()
    assert roots[0][1] == sha and roots[0][0] != str(staged)


def test_executors_refuse_a_model_whose_files_changed(tmp_path):
    from pipelines.inference.image_inference import load_executor_model

    copy = tmp_path / "model"
    shutil.copytree(MODEL_DIR, copy)
    sha = load_manifest(copy).model_sha256
    (copy / "priors.npy").write_bytes(b"swapped")
    with pytest.raises(ModelManifestError, match="priors.npy"):
        load_executor_model(str(copy), sha, RuntimeSettings(precision="f32"))


def test_command_line_overrides_and_spark_settings_reach_the_config():
    from pipelines.job_cli import build_config, parse_args

    config = build_config(
        parse_args(
            [
                "--input",
                "/data/in",
                "--partitions",
                "6",
                "--conf",
                "spark.executor.cores=2",
                "--conf",
                "spark.cores.max=4",
                "--force",
            ]
        ),
        family="detector",
    )
    assert config["input"]["uri"] == "/data/in" and config["inference"]["partitions"] == 6
    assert config["spark"]["conf"]["spark.executor.cores"] == "2" and config["spark"]["conf"]["spark.cores.max"] == "4"
    assert config["spark"]["app_name"] == "sparkseg-infer-detector" and config["run"]["force"] is True
    with pytest.raises(ConfigError, match="--conf 'spark.executor.cores'.*KEY=VALUE"):
        build_config(parse_args(["--conf", "spark.executor.cores"]))
    assert build_config(parse_args(["--masks", "none"]))["output"]["masks"] == "none"
    assert build_config(parse_args(["--max-error-fraction", "1"]))["run"]["max_error_fraction"] == 1.0


def test_the_detector_job_has_no_masks_flag(capsys):
    """The detector writes boxes: jobs/infer_detector.py --masks is a usage error, not a setting it ignores."""
    from pipelines.job_cli import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--masks", "rle"], family="detector")
    assert exit_info.value.code == 2 and "unrecognized arguments: --masks" in capsys.readouterr().err
