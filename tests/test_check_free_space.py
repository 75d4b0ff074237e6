"""scripts/check_free_space.sh, which `make test` runs first: a run that would fill the disk stops before it starts,
naming the directories and what to free, instead of failing half-way in scattered ways."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "check_free_space.sh"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "make test", *args], capture_output=True, text=True, timeout=60)


def test_enough_space_passes_quietly(tmp_path):
    done = check(str(tmp_path / "checkout"), "0", str(tmp_path / "suite-tmp"), "0")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_too_little_space_stops_naming_the_directories_the_need_and_what_to_free(tmp_path):
    checkout, suite_tmp = tmp_path / "my checkout", tmp_path / "suite-tmp"
    done = check(str(checkout), "1000000", str(suite_tmp), "5")
    assert done.returncode == 1
    # both on tmp_path's filesystem: one line, their needs added up
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"make test needs about 1000005 GB free for {checkout} and {suite_tmp}" in done.stderr
    assert "Free some space there" in done.stderr and ".pytest-tmp/" in done.stderr
