"""What git tracks stays the project's own: no environment, and no link that points outside
the repository (a worktree's link to a shared environment once replaced that environment
when its branch was merged)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> list[tuple[str, str, str]]:
    """(mode, object, path) of every tracked file."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an unpacked sdist or wheel): nothing is tracked")
    rows = []
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        mode, obj, _ = meta.split()
        rows.append((mode, obj, path))
    return rows


def test_no_environment_is_tracked() -> None:
    envs = [p for _, _, p in _tracked() if p.split("/")[0].startswith((".venv", "site-packages"))]
    assert envs == []


def test_no_tracked_link_points_outside_the_repository() -> None:
    outside = []
    for mode, obj, path in _tracked():
        if mode != "120000":
            continue
        target = subprocess.run(
            ["git", "cat-file", "-p", obj], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        resolved = (ROOT / path).parent.joinpath(target).resolve()
        if target.startswith("/") or not resolved.is_relative_to(ROOT):
            outside.append(f"{path} -> {target}")
    assert outside == []
