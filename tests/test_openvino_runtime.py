"""CompiledIR.infer: a batch through the async queue equals the images one at a time, with one stream and with two,
for IRs whose outputs have static shapes (written straight into the batch result) and dynamic ones (joined per
image)."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings


def _save(model: ov.Model, tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.xml"
    ov.save_model(model, str(path), compress_to_fp16=False)
    return str(path)


def _static_ir(tmp_path, side: int = 8) -> str:
    image = ops.parameter([1, 3, side, side], np.float32, name="image")
    scaled = ops.multiply(image, ops.constant(np.float32(2)))
    pooled = ops.reduce_mean(image, ops.constant(np.array([2, 3], np.int64)), keep_dims=False)
    scaled.output(0).get_tensor().set_names({"scaled"})
    pooled.output(0).get_tensor().set_names({"pooled"})
    return _save(ov.Model([scaled, pooled], [image]), tmp_path, "static")


def _dynamic_ir(tmp_path) -> str:
    image = ops.parameter(ov.PartialShape([1, 3, -1, -1]), np.float32, name="image")  # any height and width
    scaled = ops.multiply(image, ops.constant(np.float32(2)))
    scaled.output(0).get_tensor().set_names({"scaled"})
    return _save(ov.Model([scaled], [image]), tmp_path, "dynamic")


@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("make_ir", [_static_ir, _dynamic_ir], ids=["static", "dynamic"])
def test_batch_equals_images_one_at_a_time(tmp_path, make_ir, streams):
    ir = CompiledIR(make_ir(tmp_path), RuntimeSettings(precision="f32", threads=1, streams=streams))
    batch = np.random.default_rng(7).random((5, 3, 8, 8), dtype=np.float32)
    outputs = ir.infer(batch)
    for index, image in enumerate(batch):
        alone = ir.infer_one(image)
        assert set(alone) == set(outputs)
        for name, value in alone.items():
            np.testing.assert_array_equal(outputs[name][index], value)
    np.testing.assert_array_equal(outputs["scaled"], batch * 2)


def test_a_result_or_a_view_of_one_is_never_written_by_a_later_call(tmp_path):
    """infer reuses the arrays of a previous result that nothing holds any more (new pages would be faulted in each
    call): a result, or a view of one, that is still held keeps its values through later calls."""
    settings = RuntimeSettings(precision="f32", threads=1, streams=1)
    ir = CompiledIR(_static_ir(tmp_path), settings)
    rng = np.random.default_rng(3)
    first, second, third = (rng.random((4, 3, 8, 8), dtype=np.float32) for _ in range(3))
    held = ir.infer(first)
    view = ir.infer(second)["scaled"][1]  # the result itself dropped, a view of it kept
    for batch in (third, first, third[:2]):  # the next calls may reuse what nobody holds
        ir.infer(batch)
    np.testing.assert_array_equal(held["scaled"], first * 2)
    np.testing.assert_array_equal(view, second[1] * 2)
    again, fresh = ir.infer(third), CompiledIR(_static_ir(tmp_path), settings).infer(third)
    for name in ("scaled", "pooled"):
        np.testing.assert_array_equal(again[name], fresh[name])


@pytest.mark.timeout(120, method="thread")  # before the fix, the call after the failed one waited forever (in C:
# the signal method cannot interrupt it)
@pytest.mark.parametrize("streams", [1, 2])
def test_a_failed_start_leaves_the_ir_usable(tmp_path, streams):
    """An image the IR cannot take (wrong shape) fails its call; the next calls, which the executors make to retry
    a failed batch image by image, run (the queue never hands out a request whose start failed again)."""
    ir = CompiledIR(_static_ir(tmp_path), RuntimeSettings(precision="f32", threads=1, streams=streams))
    good = np.random.default_rng(5).random((3, 3, 8, 8), dtype=np.float32)
    for _ in range(ir.num_requests + 1):  # more failures than the queue has requests
        with pytest.raises(Exception):
            ir.infer([good[0], np.zeros((3, 9, 8), np.float32), good[1]])
    np.testing.assert_array_equal(ir.infer(good)["scaled"], good * 2)
    np.testing.assert_array_equal(ir.infer_one(good[2])["scaled"], good[2] * 2)


@pytest.mark.parametrize("streams", [1, 2])
def test_strided_and_other_typed_images_give_the_values_of_contiguous_float32_ones(tmp_path, streams):
    """Images of any layout and type the caller passes give the values of contiguous float32 ones: strided views,
    Fortran order, float64 and read-only arrays, mixed in one batch, after the images of earlier calls were freed.
    (Images of 192 KiB: freed, their memory goes back to the system at once, so a request that read a freed image,
    as OpenVINO's requests do after sharing an image in place (tried, session 38), would fail here.)"""
    ir = CompiledIR(_static_ir(tmp_path, 128), RuntimeSettings(precision="f32", threads=1, streams=streams))
    rng = np.random.default_rng(11)
    for _ in range(20):
        images = rng.random((4, 3, 128, 128), dtype=np.float32)
        read_only = images[3].copy()
        read_only.flags.writeable = False
        wide = np.repeat(images[0], 2, axis=2)[:, :, ::2]  # a strided view of images[0]
        batch = [wide, images[1].astype(np.float64), np.asfortranarray(images[2]), read_only]
        outputs = {name: value.copy() for name, value in ir.infer(batch).items()}
        del batch, wide, read_only
        expected = ir.infer(images)
        for name in ("scaled", "pooled"):
            np.testing.assert_array_equal(outputs[name], expected[name])


def test_a_signal_after_compiled_models_are_released_reaches_its_handler(tmp_path):
    """OpenVINO's CPU plugin gives the thread that compiles on a Core an alternate signal stack of its own and unmaps
    it when that Core is released, putting back the stack it found: two Cores released in the order they were made
    left the thread's alternate stack unmapped, and the next handled signal (here Ctrl-C) ended the process with
    SIGSEGV. CompiledIRs share the process's one Core (openvino_runtime.openvino_core), so any order is safe. In a
    process of its own: the failure is a segfault."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = (
        "import gc, os, signal\n"
        "from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings\n"
        f"first = CompiledIR({_static_ir(tmp_path)!r}, RuntimeSettings(precision='f32', threads=1, streams=1))\n"
        f"second = CompiledIR({_dynamic_ir(tmp_path)!r}, RuntimeSettings(precision='f32', threads=1, streams=1))\n"
        "del first\n"
        "gc.collect()\n"
        "del second\n"
        "gc.collect()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('handled')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "handled"), done.stderr[-2000:]
