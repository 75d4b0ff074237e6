"""The sweep's configuration (conf/sweep.yaml, documented in place) and its grid of points.

A grid point fixes one value of every swept setting. Points are ordered so that those sharing a cluster shape
(engine env, executors, executor cores) run one after another on one standalone cluster.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from pipelines.job_config import REPO_ROOT, ConfigError, load_config, merge, read_yaml

MODES = ("local", "standalone")
ENGINES = ("native", "bigdl")
PRECISIONS = ("f32", "bf16", "auto")
# every grid key takes a list of values; the sweep runs their cartesian product
GRID_KEYS = (
    "partitions",
    "executors",
    "executor_cores",
    "task_cpus",
    "batch_size",
    "openvino_streams",
    "openvino_threads",
    "precision",
    "engine",
)


@dataclass(frozen=True)
class GridPoint:
    """One combination of the swept settings. partitions/openvino_*: 0 means the job's default."""

    partitions: int
    executors: int
    executor_cores: int
    task_cpus: int
    batch_size: int
    openvino_streams: int
    openvino_threads: int
    precision: str
    engine: str

    @property
    def point_id(self) -> str:
        """A readable, file-name-safe name: p4-e2x1-t1-b8-s0-th0-auto-native."""
        return (
            f"p{self.partitions}-e{self.executors}x{self.executor_cores}-t{self.task_cpus}-b{self.batch_size}"
            f"-s{self.openvino_streams}-th{self.openvino_threads}-{self.precision}-{self.engine}"
        )

    @property
    def total_cores(self) -> int:
        return self.executors * self.executor_cores

    def unschedulable_reason(self) -> str | None:
        """Why Spark could never run a task of this point (it would wait forever), or None."""
        if self.task_cpus > self.executor_cores:
            return (
                f"spark.task.cpus {self.task_cpus} > executor cores {self.executor_cores}: no executor could "
                "ever run a task"
            )
        return None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class SweepConfig:
    """See conf/sweep.yaml for every key's meaning."""

    mode: str = "local"
    out_dir: str = "reports/sweep"
    repeats: int = 1
    keep_outputs: bool = False
    point_timeout_s: float = 1800.0
    python: str = ""
    bigdl_python: str = ".venv-bigdl/bin/python"
    worker_memory: str = "2g"
    cluster_start_timeout_s: float = 180.0
    memory_interval_s: float = 0.5
    grid: dict = field(default_factory=dict)
    job: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"sweep mode '{self.mode}': choose one of {', '.join(MODES)}")
        if int(self.repeats) < 1:
            raise ConfigError(f"sweep repeats must be >= 1, got {self.repeats}")
        unknown = sorted(set(self.grid) - set(GRID_KEYS))
        if unknown:
            raise ConfigError(f"sweep grid: unknown key(s) {unknown} (known: {', '.join(GRID_KEYS)})")
        self.job = merge(load_config(), self.job or {}, "sweep job")  # unknown job keys fail here, not per point
        self.grid = {key: self.grid[key] if key in self.grid else [self.unswept_value(key)] for key in GRID_KEYS}
        for key in GRID_KEYS:
            values = self.grid[key]
            if not isinstance(values, list) or not values:
                raise ConfigError(f"sweep grid.{key}: give a non-empty list, got {values!r}")
            if key == "precision":
                bad = [v for v in values if v not in PRECISIONS]
            elif key == "engine":
                bad = [v for v in values if v not in ENGINES]
            else:
                floor = 0 if key in ("partitions", "openvino_streams", "openvino_threads") else 1
                bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < floor]
            if bad:
                raise ConfigError(f"sweep grid.{key}: bad value(s) {bad}")
        if self.mode == "local" and self.grid["executors"] != [1]:
            raise ConfigError(
                "sweep grid.executors: local mode has exactly one executor (the driver's JVM); set "
                "executors: [1] or use mode: standalone to vary the number of executors"
            )

    def unswept_value(self, key: str):
        """The one value of a grid key the grid leaves out: the job config's inference.<key>, or 1 (executors,
        executor_cores, task_cpus)."""
        return self.job["inference"][key] if key in self.job["inference"] else 1

    def points(self) -> list[GridPoint]:
        """Every combination, grouped by cluster shape (engine, executors, executor cores), then in grid order."""
        combos = [
            GridPoint(**dict(zip(GRID_KEYS, values)))
            for values in itertools.product(*(self.grid[key] for key in GRID_KEYS))
        ]
        return sorted(combos, key=lambda p: (p.engine, p.executors, p.executor_cores))

    def resolve(self, path: str) -> Path:
        """Relative paths are relative to the repository root."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else (REPO_ROOT / candidate)


CONFIG_KEYS = {f.name for f in fields(SweepConfig)}


def load_sweep_config(path: str | Path, overrides: dict | None = None) -> SweepConfig:
    """Read a sweep YAML; `overrides` ({"out_dir": ..., "mode": ...}) win over the file."""
    data = read_yaml(path, "sweep config (see conf/sweep.yaml)")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown} (known: {', '.join(sorted(CONFIG_KEYS))})")
    return SweepConfig(**data)
