"""The bigdl engine. Two envs run this file:
- main venv (`-m "not bigdl"`): the driver-side checks and the pure-pyspark stage, with tests/conftest.py's `spark`;
- .venv-bigdl (`.venv-bigdl/bin/python -m pytest tests/test_bigdl_engine.py -m bigdl`): BigDL preprocess + Orca
  predict against OpenVINO run directly and against our numpy preprocessing, local[2], with `bigdl_spark`.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.engines.bigdl_engine import (
    BigDLNotInstalled,
    bigdl_python_env,
    missing_bigdl_requirements,
    require_bigdl,
)
from pipelines.engines.bigdl_stages import (
    CV_8UC3,
    bigdl_predict,
    bigdl_preprocess,
    ir_outputs,
    nnimage_reader_images,
    to_image_schema,
)
from tests.bigdl.fixtures import bigdl_log, bigdl_spark, tiny_ir, yolact_ir  # noqa: F401  (pytest fixtures)
from tests.bigdl.tiny_ir import INPUT_SHAPE, LEGACY_NAMES, OUTPUTS

MEAN_RGB = (123.68, 116.78, 103.94)  # YOLACT
STD_RGB = (58.40, 57.12, 57.38)
SIZE = INPUT_SHAPE[-1]
SESSION_START = time.time()


def write_png(path: Path, rgb: np.ndarray, mode: str = "RGB") -> Path:
    image = Image.fromarray(rgb)
    image.convert(mode).save(path)
    return path


def decode_with_pillow(path: Path) -> np.ndarray:
    with Image.open(io.BytesIO(path.read_bytes())) as image:
        return np.asarray(image.convert("RGB"))


def decoded_images_df(spark, images: dict[str, np.ndarray]):
    """The columns pipelines.ops.image_decode gives: path, height, width, rgb (H*W*3 RGB bytes)."""
    rows = [(name, rgb.shape[0], rgb.shape[1], bytearray(rgb.tobytes())) for name, rgb in images.items()]
    return spark.createDataFrame(rows, "path string, height int, width int, rgb binary")


def random_images(shapes, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        f"img{i}_{h}x{w}.png": rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for i, (h, w) in enumerate(shapes)
    }


def reference_chw(rgb: np.ndarray) -> np.ndarray:
    """Our numpy preprocessing (torch-style bilinear on float32), [3, SIZE, SIZE] RGB."""
    from pipelines.ops.preprocess import preprocess_rgb

    return preprocess_rgb(rgb, {"shape": [1, 3, SIZE, SIZE], "mean": MEAN_RGB, "std": STD_RGB})


# --------------------------------------------------------------------------------------- main venv (no BigDL)


def test_require_bigdl_names_what_is_missing_and_the_install_command():
    with pytest.raises(BigDLNotInstalled) as raised:
        require_bigdl()
    message = str(raised.value)
    assert "make bigdl-env" in message and ".venv-bigdl/bin/python" in message and "PYSPARK_PYTHON" in message
    assert "bigdl-dllib-spark3" in message and "openvino.inference_engine" in message
    assert isinstance(raised.value, RuntimeError)


def test_every_stage_refuses_on_the_driver_without_bigdl(spark, tmp_path):
    images = decoded_images_df(spark, random_images([(8, 8)]))
    started = spark.sparkContext.statusTracker().getActiveJobsIds()
    with pytest.raises(BigDLNotInstalled):
        bigdl_python_env()
    with pytest.raises(BigDLNotInstalled):
        bigdl_preprocess(to_image_schema(images), SIZE, MEAN_RGB, STD_RGB)
    with pytest.raises(BigDLNotInstalled):
        bigdl_predict(images, tmp_path / "model.xml")
    with pytest.raises(BigDLNotInstalled):
        nnimage_reader_images(spark, str(tmp_path), 2)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == started


def test_to_image_schema_builds_spark_image_structs_in_bgr(spark):
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    df = to_image_schema(decoded_images_df(spark, {"a.png": rgb}))
    assert df.columns == ["path", "height", "width", "image"]
    assert [f.name for f in df.schema["image"].dataType.fields] == [
        "origin",
        "height",
        "width",
        "nChannels",
        "mode",
        "data",
    ]
    image = df.first()["image"]
    assert (image.origin, image.height, image.width, image.nChannels, image.mode) == ("a.png", 2, 3, 3, CV_8UC3)
    assert bytes(image.data) == rgb[..., ::-1].tobytes()


def test_to_image_schema_names_the_image_with_a_wrong_byte_count(spark):
    df = spark.createDataFrame([("bad.png", 4, 4, bytearray(10))], "path string, height int, width int, rgb binary")
    with pytest.raises(Exception, match=r"bad\.png.*10 bytes.*4\*4\*3"):
        to_image_schema(df).collect()


def test_to_image_schema_asks_for_decoded_images(spark):
    df = spark.createDataFrame([("a.png", bytearray(b"\x89PNG"))], "path string, content binary")
    with pytest.raises(ValueError, match=r"no column\(s\) \['height', 'width', 'rgb'\].*image_decode"):
        to_image_schema(df)


def test_ir_outputs_give_tensor_names_in_ir_order_with_their_legacy_names(tiny_ir):
    assert ir_outputs(tiny_ir) == [(name, LEGACY_NAMES[name], list(shape)) for name, shape in OUTPUTS.items()]


# ------------------------------------------------------------------------------------------- .venv-bigdl only


@pytest.mark.bigdl
def test_bigdl_env_is_complete():
    assert missing_bigdl_requirements() == []
    require_bigdl()


@pytest.mark.bigdl
def test_the_jvm_loads_mkl_and_opencv_from_the_env_not_from_copies_under_tmp(bigdl_spark):
    """make bigdl-env unpacked BigDL's native libraries into the env (pipelines.engines.bigdl_natives): the session's
    JVM,
    which ran BigDL's Engine.init and OpenCV loader, has those files mapped and no copy of them from elsewhere."""
    from pipelines.engines.bigdl_natives import NATIVE_LIBRARIES, installed_native_library_dir

    natives = installed_native_library_dir()
    assert natives is not None
    bigdl_spark.sparkContext._jvm.com.intel.analytics.bigdl.opencv.OpenCV.isOpenCVLoaded()
    pid = bigdl_spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    mapped = {
        Path(line.split()[-1]) for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if len(line.split()) >= 6
    }
    ours = {path for path in mapped if path.name in NATIVE_LIBRARIES}
    assert {path.name for path in ours} == set(NATIVE_LIBRARIES)
    assert {str(path.parent) for path in ours} == {natives}


@pytest.mark.bigdl
def test_python_workers_run_this_env_with_the_base_pythonhome(bigdl_spark, bigdl_log):
    def worker_facts(_):
        import numpy

        yield sys.prefix, numpy.__version__, os.environ.get("PYTHONHOME")

    facts = set(bigdl_spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_facts).collect())
    assert facts == {(sys.prefix, np.__version__, sys.base_prefix)}
    assert os.environ["PYTHONHOME"] == sys.base_prefix
    # BigDL's log went to the path we chose, not to bigdl.log in the working directory.
    assert bigdl_log.exists()
    in_cwd = Path.cwd() / "bigdl.log"
    assert not in_cwd.exists() or in_cwd.stat().st_mtime < SESSION_START


@pytest.mark.bigdl
def test_preprocess_normalizes_with_rgb_constants_and_gives_rgb_chw(bigdl_spark):
    rgb = np.empty((8, 6, 3), dtype=np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 100, 10
    out = bigdl_preprocess(
        to_image_schema(decoded_images_df(bigdl_spark, {"flat.png": rgb})), (8, 6), MEAN_RGB, STD_RGB
    ).first()
    assert (out["path"], out["height"], out["width"]) == ("flat.png", 8, 6)
    chw = np.asarray(out["chw"], dtype=np.float32).reshape(3, 8, 6)
    expected = (np.array([200, 100, 10], np.float32) - np.float32(MEAN_RGB)) / np.float32(STD_RGB)
    np.testing.assert_allclose(chw, np.broadcast_to(expected[:, None, None], chw.shape), atol=1e-5)


@pytest.mark.bigdl
def test_preprocess_stays_within_one_uint8_level_of_our_numpy_preprocessing(bigdl_spark):
    images = random_images([(37, 53), (150, 120), (SIZE, SIZE)])
    rows = bigdl_preprocess(to_image_schema(decoded_images_df(bigdl_spark, images)), SIZE, MEAN_RGB, STD_RGB).collect()
    assert sorted(row["path"] for row in rows) == sorted(images)
    std = np.float32(STD_RGB)[:, None, None]
    for row in rows:
        chw = np.asarray(row["chw"], dtype=np.float32).reshape(3, SIZE, SIZE)
        levels = np.abs(chw - reference_chw(images[row["path"]])) * std  # in uint8 levels
        if images[row["path"]].shape[:2] == (SIZE, SIZE):
            assert levels.max() < 1e-3, row["path"]  # no resize: identical
        else:  # OpenCV INTER_LINEAR on uint8 (fixed point, rounded) vs bilinear on float32: measured 0.75 / 0.27
            assert levels.max() <= 1.0 and levels.mean() <= 0.35, (row["path"], levels.max(), levels.mean())


def predicted_rows(preprocessed, ir_xml, batch_size: int = 1) -> tuple[list[str], list]:
    """bigdl_predict's columns and collected rows (f32), its persisted input released."""
    result, nested_input = bigdl_predict(preprocessed, ir_xml, batch_size=batch_size, precision="f32")
    rows = result.collect()
    nested_input.unpersist()
    return result.columns, rows


def assert_equal_up_to_thread_order(got: np.ndarray, expected: np.ndarray) -> None:
    """Orca's OpenVINO and this process's may use different thread counts; OpenVINO's CPU plugin splits f32
    reductions over its threads, so the sums are added in another order: a few float32 ulps of the outputs'
    magnitude (measured <= 3.6e-6 on values <= 1). Same thread count: bit-identical."""
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.bigdl
def test_predict_equals_openvino_on_the_same_tensor_and_is_close_to_numpy_preprocessing(bigdl_spark, tiny_ir):
    import openvino as ov

    images = random_images([(40, 30), (SIZE, SIZE), (90, 120)], seed=1)
    preprocessed = bigdl_preprocess(
        to_image_schema(decoded_images_df(bigdl_spark, images)), SIZE, MEAN_RGB, STD_RGB
    ).cache()
    chw = {row["path"]: np.asarray(row["chw"], np.float32).reshape(INPUT_SHAPE) for row in preprocessed.collect()}
    # 3 images in batches of 2: Orca pads the last batch by repeating its last image.
    columns, rows = predicted_rows(preprocessed, tiny_ir, batch_size=2)
    assert columns == ["path", "height", "width", "proto", "conf"]  # IR order, not the legacy API's
    assert sorted(row["path"] for row in rows) == sorted(images)

    compiled = ov.Core().compile_model(str(tiny_ir), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for row in rows:
        direct = compiled(chw[row["path"]])
        from_numpy = compiled(reference_chw(images[row["path"]])[None])
        for name, shape in OUTPUTS.items():
            got = np.asarray(row[name], dtype=np.float32)
            assert got.shape == (int(np.prod(shape)),)
            assert_equal_up_to_thread_order(got, direct[compiled.output(name)].ravel())
            # resize differences (<= 1 uint8 level) through the tiny net: measured <= 0.005 for outputs ~1.
            np.testing.assert_allclose(got, from_numpy[compiled.output(name)].ravel(), atol=0.02)
    preprocessed.unpersist()


@pytest.mark.bigdl
def test_predict_rejects_a_tensor_of_the_wrong_size(bigdl_spark, tiny_ir):
    df = bigdl_spark.createDataFrame([("small.png", [0.0] * 12)], "path string, chw array<float>")
    with pytest.raises(Exception, match=r"has 12 values.*needs 12288.*size=\(64, 64\)"):
        bigdl_predict(df, tiny_ir).frame.collect()


@pytest.mark.bigdl
def test_predict_on_many_rows_per_partition_equals_openvino_row_by_row(bigdl_spark):
    """Orca evaluates its input twice in each task, on two threads; without bigdl_predict persisting it, rows
    came out predicted from shifted inputs or corrupted (90 images in 2 partitions through the bundled model: 1-4
    wrong per run, raw outputs off by up to 3.8, or a run stopped by a garbage size). Here the input comes
    straight from NNModel (nothing cached before bigdl_predict), many rows per partition, and every row must equal
    OpenVINO on the tensor NNModel gives for it (collected by a job of its own)."""
    import openvino as ov

    from pipelines.inference.model_manifest import load_manifest
    from tests.job_helpers import DEFAULT_MODEL_DIR

    manifest = load_manifest(DEFAULT_MODEL_DIR)
    height, width = manifest.input_size
    xml = manifest.path("ir_xml")
    images = random_images([(height, width)] * 90, seed=3)
    source = decoded_images_df(bigdl_spark, images).repartition(2)
    preprocessed = bigdl_preprocess(
        to_image_schema(source), (height, width), tuple(manifest.input["mean"]), tuple(manifest.input["std"])
    )
    chw = {
        row["path"]: np.asarray(row["chw"], np.float32).reshape(1, 3, height, width) for row in preprocessed.collect()
    }
    _, rows = predicted_rows(preprocessed, xml)
    assert sorted(row["path"] for row in rows) == sorted(images)
    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for path, outputs in ((row["path"], row) for row in rows):
        expected = compiled(chw[path])
        for name in manifest.outputs.values():
            assert_equal_up_to_thread_order(
                np.asarray(outputs[name], np.float32), expected[compiled.output(name)].ravel()
            )


@pytest.mark.bigdl
def test_nnimage_reader_images_are_repartitioned_and_match_pillow_decoding(bigdl_spark, tmp_path):
    images = random_images([(20, 30), (33, 17), (64, 64)], seed=2)
    files = [write_png(tmp_path / name, rgb, mode) for (name, rgb), mode in zip(images.items(), ["RGB", "RGBA", "RGB"])]
    read = nnimage_reader_images(bigdl_spark, str(tmp_path), partitions=2)
    assert read.rdd.getNumPartitions() == 2
    assert read.columns == ["path", "height", "width", "image"]
    by_name = {Path(row["path"]).name: row for row in read.collect()}
    assert sorted(by_name) == sorted(images)
    for path in files:
        row = by_name[path.name]
        rgb = decode_with_pillow(path)
        assert (row["height"], row["width"], row["image"].nChannels, row["image"].mode) == (*rgb.shape[:2], 3, CV_8UC3)
        assert bytes(row["image"].data) == rgb[..., ::-1].tobytes()  # BGR, alpha dropped

    # Both ways into BigDL give the same network input (PNG is lossless).
    from_reader = {Path(r["path"]).name: r["chw"] for r in bigdl_preprocess(read, SIZE, MEAN_RGB, STD_RGB).collect()}
    decoded = decoded_images_df(bigdl_spark, {p.name: decode_with_pillow(p) for p in files})
    from_pillow = {
        r["path"]: r["chw"] for r in bigdl_preprocess(to_image_schema(decoded), SIZE, MEAN_RGB, STD_RGB).collect()
    }
    assert from_reader == from_pillow


@pytest.mark.bigdl
def test_yolact_ir_through_bigdl_equals_openvino_and_refuses_batches_on_the_driver(bigdl_spark, yolact_ir, repo_root):
    import json

    import openvino as ov

    manifest = json.loads((yolact_ir / "manifest.json").read_text())
    spec, xml = manifest["input"], yolact_ir / "model.xml"
    size = spec["shape"][-1]
    files = [repo_root / "samples" / "images" / name for name in ("astronaut.jpg", "coffee.jpg")]
    images = {path.name: decode_with_pillow(path) for path in files}
    preprocessed = bigdl_preprocess(
        to_image_schema(decoded_images_df(bigdl_spark, images)), size, spec["mean"], spec["std"]
    ).cache()
    chw = {row["path"]: np.asarray(row["chw"], np.float32).reshape(spec["shape"]) for row in preprocessed.collect()}
    result, nested_input = bigdl_predict(preprocessed, xml, batch_size=1, precision="f32")
    assert result.columns == ["path", "height", "width", *manifest["outputs"]]  # loc, conf, mask, proto

    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for row in result.collect():
        direct = compiled(chw[row["path"]])
        for name in manifest["outputs"]:
            assert_equal_up_to_thread_order(np.asarray(row[name], np.float32), direct[compiled.output(name)].ravel())
    nested_input.unpersist()
    preprocessed.unpersist()
    with pytest.raises(ValueError, match="cannot run batches of 2.*use batch_size=1"):
        bigdl_predict(preprocessed, xml, batch_size=2)


@pytest.mark.bigdl
def test_inherited_pyspark_submit_args_survive_bigdls_classpath_insert(monkeypatch):
    """BigDL 2.4 writes "--driver-class-path JARS" into an existing PYSPARK_SUBMIT_ARGS with no space before
    "pyspark-shell"; a process started by one that ran BigDL inherits the variable (spark-submit then fails)."""
    import shlex

    from bigdl.dllib.utils.engine import get_bigdl_classpath

    from pipelines.engines.bigdl_engine import bigdl_init_spark_conf

    jars = get_bigdl_classpath()
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS", f" --driver-memory 2g --driver-class-path /opt/mine.jar:{jars} pyspark-shell "
    )
    monkeypatch.setenv("BIGDL_JARS", f"{jars}:{jars}")
    bigdl_init_spark_conf({"spark.app.name": "t"})
    tokens = shlex.split(os.environ["PYSPARK_SUBMIT_ARGS"])
    assert tokens[-1] == "pyspark-shell" and tokens.count("--driver-class-path") == 1
    assert tokens[:2] == ["--driver-memory", "2g"]
    class_path = tokens[tokens.index("--driver-class-path") + 1].split(":")
    assert "/opt/mine.jar" in class_path and set(jars.split(":")) <= set(class_path)
    assert len(class_path) == len(set(class_path))
