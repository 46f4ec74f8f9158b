"""`[node] workers = "auto"` counts the CPUs this process may use, not the machine's: its
affinity mask, capped by the tightest cgroup CPU quota above it, minus one for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pigeon.node.cpus import auto_workers, available_cpus, cgroup_quota

AFFINITY = len(os.sched_getaffinity(0))


def files(root: Path, tree: dict[str, str]) -> Path:
    for name, text in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 1), (3, 2), (16, 15), (200, 64)])
def test_auto_is_one_worker_per_cpu_but_one_and_at_least_one(cpus: int, workers: int) -> None:
    assert auto_workers(cpus) == workers


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a machine with two CPUs or more")
def test_a_process_pinned_to_one_cpu_counts_one_whatever_the_machine_has() -> None:
    pinned = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from pigeon.config.schema import NodeConfig; from pigeon.node.cpus import available_cpus;"
            "print(os.cpu_count(), available_cpus(), NodeConfig().worker_count)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    machine, available, workers = map(int, pinned.stdout.split())
    assert machine >= 2
    assert (available, workers) == (1, 1)


def test_cgroup_v2_quota_caps_the_cpus_rounded_up(tmp_path: Path) -> None:
    tree = {"cgroup.controllers": "cpu\n", "a/cpu.max": "max 100000\n", "a/b/cpu.max": "150000 100000\n"}
    root = files(tmp_path, tree)

    assert cgroup_quota(root, "0::/a/b\n") == 1.5
    assert available_cpus(cgroup_root=root, membership="0::/a/b\n") == min(AFFINITY, 2)


def test_the_tightest_quota_of_an_ancestor_counts(tmp_path: Path) -> None:
    tree = {"cgroup.controllers": "cpu\n", "a/cpu.max": "100000 100000\n", "a/b/cpu.max": "300000 100000\n"}
    root = files(tmp_path, tree)

    assert available_cpus(cgroup_root=root, membership="0::/a/b\n") == 1


def test_cgroup_v1_quota_of_the_cpu_controller_counts(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        {
            "cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000\n",
            "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    membership = "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/\n"

    assert cgroup_quota(root, membership) == 0.5
    assert available_cpus(cgroup_root=root, membership=membership) == 1  # half a CPU still runs one worker


def test_in_a_container_that_sees_only_its_own_cgroup_the_root_quota_counts(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path; the container's mount is that cgroup itself.
    root = files(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": "100000 100000\n"})

    assert available_cpus(cgroup_root=root, membership="0::/kubepods/pod1/c1\n") == 1


def test_without_a_quota_the_affinity_counts(tmp_path: Path) -> None:
    root = files(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": "max 100000\n"})

    assert cgroup_quota(root, "0::/\n") is None
    assert available_cpus(cgroup_root=root, membership="0::/\n") == AFFINITY
    assert available_cpus(cgroup_root=tmp_path / "none", membership="0::/\n") == AFFINITY
