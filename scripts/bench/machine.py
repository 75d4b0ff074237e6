"""The machine a benchmark ran on, as every report's header gives it: the CPU model and its vector instruction sets
(figures from machines with different sets never compare; see docs/performance.md)."""

from __future__ import annotations

import platform
from pathlib import Path

INSTRUCTION_SETS = (
    ("AMX", "amx_tile"),
    ("AVX-512", "avx512f"),
    ("AVX-512 BF16", "avx512_bf16"),
    ("AVX-512 VNNI", "avx512_vnni"),
    ("AVX2", "avx2"),
)


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and its /proc/cpuinfo flags (empty where there is no /proc/cpuinfo)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
        platform.machine(),
    )
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return model, flags


def cpu_isa() -> tuple[str, list[str]]:
    """The CPU's model name and which of AMX, AVX-512 (BF16, VNNI) and AVX2 it has, the widest first."""
    model, flags = cpu_model_and_flags()
    return model, [name for name, flag in INSTRUCTION_SETS if flag in flags]


def isa_text(isa: list[str]) -> str:
    """'**AMX** (AMX, AVX-512, ...)' for a report header."""
    return f"**{isa[0] if isa else 'none'}** ({', '.join(isa) or 'none of AMX/AVX-512/AVX2'})"


SCHEDULER_COUNTS = (
    ("migrations", "se.nr_migrations"),
    ("voluntary switches", "nr_voluntary_switches"),
    ("involuntary switches", "nr_involuntary_switches"),
)


def scheduler_counts() -> dict[str, int]:
    """This process's moves between cores and context switches so far, summed over its threads (the kernel's
    /proc/self/task/*/sched; zeros where there is none): a thread that waits for another (an inference thread)
    switches voluntarily, and each wake-up may land it on another core."""
    totals = dict.fromkeys((name for name, _ in SCHEDULER_COUNTS), 0)
    keys = {key: name for name, key in SCHEDULER_COUNTS}
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            lines = (task / "sched").read_text().splitlines()
        except OSError:  # the thread ended meanwhile, or no sched file (a kernel without CONFIG_SCHED_DEBUG)
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() in keys:
                totals[keys[key.strip()]] += int(float(value))
    return totals
