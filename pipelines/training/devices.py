"""Where a rank trains: CPU (gloo) or one GPU per rank (NCCL for CUDA tensors, gloo for the CPU ones).

``distributed.use_gpu``: ``auto`` (GPUs when there are: CUDA on the driver in local mode, a Spark task GPU amount
in cluster mode), ``true`` (fail clearly without CUDA) or ``false``. In local mode TorchDistributor gives the ranks
the driver's GPUs (``spark.driver.resource.gpu.*``, set by ``local_gpu_conf``) and a rank takes ``cuda:LOCAL_RANK``;
in cluster mode each Spark task sees the GPU Spark assigned it through CUDA_VISIBLE_DEVICES (``cuda:0``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipelines.errors import UsageError

LOG = logging.getLogger(__name__)
GPU_DISCOVERY_SCRIPT = Path(__file__).resolve().parents[2] / "conf" / "gpu_discovery.sh"
CPU_BACKEND = "gloo"
GPU_BACKEND = "cpu:gloo,cuda:nccl"  # NCCL for CUDA tensors (gradients), gloo for CPU ones (counters, objects)


class GpuUnavailableError(UsageError):
    """distributed.use_gpu: true where no CUDA device can be used."""


def parse_use_gpu(value) -> str | bool:
    """YAML true/false, or the strings auto/true/false (from --set) -> "auto" | True | False."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[value.lower()]
    raise UsageError(f"distributed.use_gpu {value!r}: choose auto, true or false")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_use_gpu(setting, local_mode: bool, task_gpu_amount: str | None = None) -> bool:
    """The driver's decision. auto: local mode -> CUDA visible here; cluster mode -> Spark gives tasks GPUs
    (spark.task.resource.gpu.amount > 0). true without CUDA (local mode) -> GpuUnavailableError."""
    setting = parse_use_gpu(setting)
    if setting == "auto":
        if local_mode:
            return cuda_available()
        return float(task_gpu_amount or 0) > 0
    if setting and local_mode and not cuda_available():
        raise GpuUnavailableError(
            "distributed.use_gpu is true but this machine has no usable CUDA device "
            "(torch.cuda.is_available() is False): train on CPU with use_gpu: false or auto, "
            "or install a CUDA build of torch"
        )
    return bool(setting)


def local_gpu_conf(num_processes: int) -> dict[str, str]:
    """Spark settings a local-mode session needs before TorchDistributor(use_gpu=True) can hand the driver's GPUs
    to its ranks: one GPU per rank, found by conf/gpu_discovery.sh (nvidia-smi)."""
    return {
        "spark.driver.resource.gpu.amount": str(num_processes),
        "spark.driver.resource.gpu.discoveryScript": str(GPU_DISCOVERY_SCRIPT),
    }


def rank_device(use_gpu: bool):
    """This rank's torch.device: cuda:(LOCAL_RANK mod visible GPUs) or cpu. use_gpu without CUDA (a Spark task on
    an executor without a GPU) -> GpuUnavailableError."""
    import torch

    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise GpuUnavailableError(
            f"rank {os.environ.get('RANK', 0)}: distributed.use_gpu is set but this process "
            f"sees no CUDA device (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}):"
            " give the executors GPUs (spark.executor.resource.gpu.amount, "
            "spark.task.resource.gpu.amount, a discovery script) or set use_gpu: false"
        )
    index = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    return torch.device("cuda", index)


def backend_for(device) -> str:
    return GPU_BACKEND if device.type == "cuda" else CPU_BACKEND


def configure_device(device) -> None:
    """Per-process settings for the device: the current CUDA device and cuDNN autotuning (fixed input sizes)."""
    import torch

    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        LOG.info("rank %s on %s (%s)", os.environ.get("RANK", 0), device, torch.cuda.get_device_name(device))
