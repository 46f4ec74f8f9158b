"""How many CPUs this process may use, for `[node] workers = "auto"`.

`os.cpu_count()` counts the machine's CPUs. A process pinned to some of them (`taskset`,
systemd's `CPUAffinity=`, a cpuset) or limited by a cgroup CPU quota (a container's
`--cpus`, systemd's `CPUQuota=`) can use fewer: one worker per counted CPU there would run
dozens of workers on two CPUs' worth of time, each with its own memory and connections.
So the count is the affinity mask, capped by the tightest quota of the process's cgroup and
its ancestors (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded
up: a quota of 1.5 CPUs can keep two busy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Final

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
MAX_WORKERS: Final = 64


def auto_workers(cpus: int) -> int:
    """Workers for `"auto"`: one per available CPU but one, which the kernel's network stack,
    the spools' commit threads and whatever else runs there need (README, "Workers")."""
    return min(MAX_WORKERS, max(1, cpus - 1))


def available_cpus(*, cgroup_root: Path = CGROUP_ROOT, membership: str | None = None) -> int:
    """CPUs this process may keep busy. `membership`: the text of /proc/self/cgroup (read if None)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            return cpus
    quota = cgroup_quota(cgroup_root, membership)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def cgroup_quota(root: Path, membership: str) -> float | None:
    """The tightest CPU quota, in CPUs, of the cgroup in `membership` and its ancestors;
    None if there is none (or no cgroup file system to read it from)."""
    quotas: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path:
            continue
        if hierarchy == "0" and not controllers:  # cgroup v2 (or the hybrid's unified tree)
            mount = root if (root / "cgroup.controllers").exists() else root / "unified"
            quotas += _walk(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            mount = root / controllers
            if not mount.is_dir():
                mount = root / "cpu"
            quotas += _walk(mount, path, _v1_quota)
    return min(quotas) if quotas else None


def _walk(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """Quotas from the cgroup's directory up to the mount's root. In a container the path
    names the host's tree, which the container may not see: then only the root counts."""
    found = []
    directory = PurePosixPath(path)
    while True:
        quota = read(mount / str(directory).lstrip("/"))
        if quota is not None:
            found.append(quota)
        if directory == directory.parent:
            return found
        directory = directory.parent


def _v2_quota(directory: Path) -> float | None:
    try:
        limit, _, period = (directory / "cpu.max").read_text().partition(" ")
    except OSError:
        return None
    if limit.strip() == "max":
        return None
    try:
        return int(limit) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:  # -1: no quota
        return None
    return quota / period
