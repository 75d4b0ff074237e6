"""The parallel input pipeline and the device plumbing, without Spark: shards written in plain Python, micro-batches
built by worker processes equal the ones built in the rank (seeded per image), targets packed at the loss's mask
sizes give the loss of full-size targets, the colour distortion applied batched in torch equals the numpy one, a
training step runs with workers and bf16 autocast, and use_gpu: true without CUDA is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
from pipelines.training import photometric
from pipelines.training.augment import AugmentConfig
from pipelines.training.batches import InputSpec, make_micro_batch
from pipelines.training.loader import LoaderSpec, micro_batch_stream
from pipelines.training.shard_rows import write_plain_shards
from pipelines.training.shards import ShardIndex
from pipelines.training.yolact_loss import LossConfig, Normalizer, YolactLoss, num_positives

REPO = Path(__file__).resolve().parents[1]
SPEC = InputSpec(64, (123.68, 116.78, 103.94), (58.40, 57.12, 57.38))
MASK_SIZES = ((16, 16), (8, 8))


@pytest.fixture(scope="module")
def plain_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain_shards")
    dataset = generate_road_dataset(root / "roads", 8, 7, RoadSceneConfig(width=96, height=72, formats=("coco",)))
    count = write_plain_shards(
        dataset, root / "roads" / "images", root / "prepared", tuple(c.name for c in dataset.categories), num_shards=2
    )
    return root / "prepared", count


def test_workers_build_the_same_micro_batches_as_the_rank(plain_shards):
    prepared, count = plain_shards
    index = ShardIndex.open(str(prepared / "train"))
    assert len(index) == count and count >= 6
    rows = index.read(range(count))
    micro = [[0, 5], [3, 1], [2, 4]]
    spec = LoaderSpec(SPEC, AugmentConfig(expand=True), seed=3, epoch=1, mask_sizes=MASK_SIZES)
    here = list(micro_batch_stream(rows, micro, spec))
    workers = list(micro_batch_stream(rows, micro, LoaderSpec(**{**spec.__dict__, "workers": 2, "prefetch": 1})))
    assert [mb.indices for mb in workers] == micro
    for a, b in zip(here, workers):
        assert torch.equal(a.images, b.images)
        assert torch.equal(a.targets.boxes, b.targets.boxes) and torch.equal(a.targets.labels, b.targets.labels)
        assert a.targets.seeds == b.targets.seeds
        for size in MASK_SIZES:
            assert torch.equal(a.targets.small_masks[size], b.targets.small_masks[size])


def test_packed_small_masks_give_the_loss_of_full_size_masks(plain_shards):
    prepared, count = plain_shards
    rows = ShardIndex.open(str(prepared / "train")).read(range(count))
    full = make_micro_batch(rows, [0, 1, 2], SPEC, AugmentConfig(), seed=1, epoch=0)
    packed = make_micro_batch(rows, [0, 1, 2], SPEC, AugmentConfig(), seed=1, epoch=0, mask_sizes=list(MASK_SIZES))
    finished = packed.finish_images(SPEC)  # colour draws applied in torch, batched
    assert packed.colour.shape == (3, 5) and finished.colour is None and packed.images.dtype == torch.uint8
    # the workers' uint8 resize is within one level of the float one (0.5 of rounding, 0.5 of its fixed-point
    # weights); the distortion scales a level by at most 1.5 (contrast) and 255 / value in HSV where the value is
    # small; the normalization divides by std (>= 57 here): 1.5 levels / 57 = 0.026, and a few dark pixels more
    difference = (finished.images - full.images).abs()
    assert float(difference.quantile(0.99)) < 0.03 and float(difference.mean()) < 0.01
    generator = torch.Generator().manual_seed(0)
    priors = torch.cat(
        [torch.rand(200, 2, generator=generator), 0.1 + 0.4 * torch.rand(200, 2, generator=generator)], dim=1
    )
    outputs = {
        "loc": torch.randn(3, 200, 4, generator=generator),
        "conf": torch.randn(3, 200, 5, generator=generator),
        "mask": torch.randn(3, 200, 4, generator=generator),
        "proto": torch.randn(3, 16, 16, 4, generator=generator),
        "segm": torch.randn(3, 4, 8, 8, generator=generator),
    }
    loss = YolactLoss(LossConfig(), priors)
    terms = []
    for targets in (full.targets, packed.targets):
        matches = loss.match(targets)
        assert num_positives(matches) > 0
        terms.append(Normalizer(num_positives(matches), 3).apply(loss.sums(outputs, targets, matches)))
    for key in terms[0]:
        assert float(terms[1][key]) == pytest.approx(float(terms[0][key]), rel=1e-6), key


def test_batched_torch_colour_distortion_equals_the_numpy_one():
    """Every draw combination (brightness, contrast before/after, saturation, hue with wrap-around) on random
    images, including saturated and black pixels: torch batched == numpy per image within float error."""
    rng = np.random.default_rng(5)
    images = rng.uniform(0, 255, (24, 9, 11, 3)).astype(np.float32)
    images[:, 0, 0] = 0.0
    images[:, 0, 1] = 255.0
    images[:, 1, :, :] = images[:, 1, :, :1]  # grey rows: zero spread
    draws = [photometric.draw(rng) for _ in range(len(images))]
    assert {d.contrast_first for d in draws} == {True, False} and any(d.hue == 0 for d in draws)
    expected = np.stack([photometric.apply_numpy(image, d) for image, d in zip(images, draws)])
    got = photometric.apply_torch(torch.from_numpy(images).permute(0, 3, 1, 2), photometric.draws_tensor(draws))
    np.testing.assert_allclose(got.permute(0, 2, 3, 1).numpy(), expected, rtol=0, atol=2e-3)


def test_finish_images_on_a_cpu_equals_the_whole_batch_at_once():
    """A CPU distorts CPU_ROWS images at a time, a GPU the whole micro-batch: the same values."""
    from pipelines.training.batches import CPU_ROWS, MicroBatch

    rng = np.random.default_rng(8)
    count = 2 * CPU_ROWS + 1
    images = torch.from_numpy(rng.integers(0, 256, (count, 3, 13, 17), dtype=np.uint8))
    draws = photometric.draws_tensor([photometric.draw(rng) for _ in range(count)])
    finished = MicroBatch(images=images, targets=[], indices=list(range(count)), colour=draws).finish_images(SPEC)
    mean, std = torch.tensor(SPEC.mean_rgb)[None, :, None, None], torch.tensor(SPEC.std_rgb)[None, :, None, None]
    whole = (photometric.apply_torch(images.float(), draws) - mean) / std
    assert finished.colour is None and finished.images.dtype == torch.float32
    assert torch.equal(finished.images, whole)


def test_training_steps_with_loader_workers_and_bf16(plain_shards, tmp_path):
    """The rank's loop (TrainingSession) over plain shards, 2 loader workers, bf16 autocast on the CPU."""
    from pipelines.training.config import TrainConfig
    from pipelines.training.topology import make_topology
    from pipelines.training.trainer import TrainingSession

    prepared, _ = plain_shards
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {"prepared": str(prepared), "loader_workers": 2},
            "model": {"max_size": 64},
            "distributed": {"threads_per_process": 1, "use_gpu": False},
            "train": {"epochs": 1, "max_steps": 2, "global_batch": 4, "micro_batch": 2, "precision": "bf16"},
            "checkpoint": {"every_steps": 0},
            "eval": {"every_epochs": 0},
        }
    )
    session = TrainingSession(cfg, make_topology("local", 1))
    assert session.mask_sizes == ((16, 16), (8, 8))
    summary = session.run()
    assert summary["state"]["step"] == 2 and summary["precision"] == "bf16" and summary["device"] == "cpu"
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "step_00000002.pt", weights_only=True)
    assert all(v.device.type == "cpu" for v in checkpoint["model"].values())


def test_micro_batches_arrive_on_the_device_matched(plain_shards, tmp_path):
    """TrainingSession.to_device matches each micro-batch to the priors as it moves it (on CUDA on the copy stream,
    while the step in flight runs) and counts its positives; the step's normalizer sums those counts."""
    from pipelines.training.batches import map_tensors
    from pipelines.training.config import TrainConfig
    from pipelines.training.topology import make_topology
    from pipelines.training.trainer import TrainingSession

    prepared, count = plain_shards
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {"prepared": str(prepared)},
            "model": {"max_size": 64},
            "distributed": {"threads_per_process": 1, "use_gpu": False},
            "train": {"global_batch": 4, "micro_batch": 2},
        }
    )
    session = TrainingSession(cfg, make_topology("local", 1))
    rows = ShardIndex.open(str(prepared / "train")).read(range(count))
    built = list(micro_batch_stream(rows, [[0, 1], [2, 3]], session.loader_spec(0)))
    moved = session.to_device(built)
    for before, after in zip(built, moved):
        assert before.matches is None and after.matches is not None
        expected = session.loss.match(before.targets)
        assert after.num_positives == num_positives(expected) and torch.equal(after.matches.conf, expected.conf)
        assert after.num_positives == int(after.matches.positive.sum())  # counted with the draw, on the host
        found = []  # what MicroBatch.record_stream hands the CUDA allocator of the matches
        map_tensors(after.matches, found.append)
        assert len(found) == 8  # conf, gt_index, loc, gt_box; the slots' three indices and scale
    assert session.normalizer(moved).num_positives == sum(mb.num_positives for mb in moved) > 0


def test_a_step_with_a_non_finite_loss_leaves_the_weights_as_they_were(plain_shards, tmp_path):
    """The fused optimizer's update is launched with the step, gated on the device (no wait for the host's check)
    once it has state; before that the host gates it. Either way a step whose loss is not finite (a NaN image)
    changes no weight and no optimizer state and is counted as skipped (no error on the way: the mask term's BCE
    gets NaN predictions), and the next finite step updates."""
    import dataclasses

    from pipelines.training.config import TrainConfig
    from pipelines.training.topology import make_topology
    from pipelines.training.trainer import TrainingSession

    prepared, count = plain_shards
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {"prepared": str(prepared)},
            "model": {"max_size": 64},
            "distributed": {"threads_per_process": 1, "use_gpu": False},
            "train": {"global_batch": 2, "micro_batch": 2, "optimizer": "sgd", "warmup_steps": 0},
        }
    )
    session = TrainingSession(cfg, make_topology("local", 1))
    rows = ShardIndex.open(str(prepared / "train")).read(range(count))
    finite = next(iter(micro_batch_stream(rows, [[0, 1]], session.loader_spec(0))))
    poisoned = dataclasses.replace(finite, colour=torch.full_like(finite.colour, float("nan")))  # NaN images

    def weights():
        return [p.detach().clone() for p in session.model.parameters()]

    def momentum():
        return [state["momentum_buffer"].clone() for state in session.optimizer.state.values()]

    for gated in (False, True):
        assert session.gates_on_device is gated and session.optimizer.defaults["fused"]
        before, buffers = weights(), momentum()
        terms = session.train_step([poisoned])
        assert not torch.isfinite(terms.sum())
        assert all(torch.equal(a, b) for a, b in zip(before, weights()))
        assert all(torch.equal(a, b) for a, b in zip(buffers, momentum()))
        assert session.state["skipped_steps"] == 1 + gated
        assert torch.isfinite(session.train_step([finite]).sum())
        assert not all(torch.equal(a, b) for a, b in zip(before, weights()))


def test_the_next_step_is_launched_before_a_steps_terms_are_read(plain_shards, tmp_path):
    """TrainingSession.steps launches step k + 1 before it reads step k's terms once the update is gated on the
    device (a GPU's queue never runs dry while the host waits for them), except after a step where settle(k) is
    true (a checkpoint reads the weights). The terms, the weights and the learning rates are those of one step at a
    time: on the CPU, where a launch runs to its end, the weights seen at a deferred step's terms are those after
    the next step."""
    from pipelines.training.config import TrainConfig
    from pipelines.training.topology import make_topology
    from pipelines.training.trainer import TrainingSession

    prepared, count = plain_shards
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {"prepared": str(prepared)},
            "model": {"max_size": 64},
            "distributed": {"threads_per_process": 1, "use_gpu": False},
            "train": {"global_batch": 2, "micro_batch": 2, "optimizer": "sgd", "warmup_steps": 3},
        }
    )
    rows = ShardIndex.open(str(prepared / "train")).read(range(count))
    plan = [[0, 1], [2, 3], [4, 5], [1, 2], [3, 0], [5, 4]]

    def run(settle):
        session = TrainingSession(cfg, make_topology("local", 1))
        stream = micro_batch_stream(rows, plan, session.loader_spec(0))
        launch, launch_seconds, seen = session.launch_step, [], []

        def timed_launch(*args):
            started = time.perf_counter()
            launched = launch(*args)
            launch_seconds.append(time.perf_counter() - started)
            return launched

        session.launch_step = timed_launch
        for terms, seconds in session.steps(stream, [1] * len(plan), settle=settle):
            seen.append(
                (
                    terms,
                    [p.detach().clone() for p in session.model.parameters()],
                    session.optimizer.param_groups[0]["lr"],
                )
            )
            time.sleep(0.3)  # the caller's own work (metrics, progress, a checkpoint): no step's time
            assert len(launch_seconds) >= len(seen)
            # a step's time holds its whole launch (on the CPU, the step itself), deferred or not, and not the
            # caller's time: before, a deferred step was charged with the next one and that one with ~0 s
            k = len(seen) - 1
            assert launch_seconds[k] <= seconds, (k, seconds)
            assert k == 0 or seconds < launch_seconds[k] + 0.3, (k, seconds)  # step 0: the loader's start too
        return seen

    one_at_a_time = run(lambda k: True)
    ahead = run(lambda k: k == 3)
    for k, ((terms, weights, lr), (terms_ahead, weights_ahead, lr_ahead)) in enumerate(zip(one_at_a_time, ahead)):
        assert torch.equal(terms, terms_ahead), k
        deferred = k in (1, 2, 4)  # step 0: no optimizer state yet; 3: settled; 5: the last
        expected_weights, expected_lr = one_at_a_time[k + 1][1:] if deferred else (weights, lr)
        assert all(torch.equal(a, b) for a, b in zip(weights_ahead, expected_weights)), k
        assert lr_ahead == expected_lr, k
    assert all(torch.equal(a, b) for a, b in zip(one_at_a_time[-1][1], ahead[-1][1]))
    assert len({lr for _, _, lr in one_at_a_time}) > 2  # the warmup moves the rate: its order is checked


def test_use_gpu_true_without_cuda_is_a_usage_error():
    """A process that sees no CUDA device (CUDA_VISIBLE_DEVICES empty): resolve_use_gpu(True) and rank_device(True)
    raise GpuUnavailableError, a UsageError (exit 2 in the job)."""
    code = (
        "from pipelines.errors import UsageError\n"
        "from pipelines.training.devices import GpuUnavailableError, rank_device, resolve_use_gpu\n"
        "assert issubclass(GpuUnavailableError, UsageError)\n"
        "assert resolve_use_gpu('auto', True) is False and resolve_use_gpu(False, True) is False\n"
        "assert resolve_use_gpu('auto', False, '1') is True and resolve_use_gpu('auto', False, None) is False\n"
        "for call in (lambda: resolve_use_gpu(True, True), lambda: rank_device(True)):\n"
        "    try:\n        call()\n    except GpuUnavailableError as err:\n        print('refused:', err)\n"
        "    else:\n        raise SystemExit('no error')\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("refused:") == 2 and "use_gpu" in result.stdout
