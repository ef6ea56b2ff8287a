"""Packaging: the sdist and the manylinux wheel built by scripts/build_dist.sh, and the image recipe."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(["bash", str(REPO / "scripts" / "build_dist.sh"), str(out)], cwd=REPO,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return out


def test_wheel_has_a_manylinux_tag_types_and_license(dist):
    wheels = list(dist.glob("execgate-*.whl"))
    assert len(wheels) == 1, wheels
    assert re.search(r"-py3-none-manylinux_2_\d+_x86_64\.whl$", wheels[0].name), wheels[0].name
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for package in ("server", "policy_service", "wrapper", "v1"):
        assert f"execgate/{package}/py.typed" in names
    assert "execgate/wrapper/libexecgate_preload.so" in names
    assert "execgate/wrapper/execgate-wrapper-native" in names
    assert "execgate/wrapper/execgate-contain" in names
    assert "execgate/wrapper/execgate-ctty" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = next(zipfile.ZipFile(wheels[0]).read(n) for n in names if n.endswith(".dist-info/METADATA"))
    assert b"License-Expression: Apache-2.0" in metadata
    assert b"Author: The execgate developers" in metadata


def test_sdist_has_no_tests_or_build_output(dist):
    sdists = list(dist.glob("execgate-*.tar.gz"))
    assert len(sdists) == 1
    members = [m.split("/", 1)[1] for m in tarfile.open(sdists[0]).getnames() if "/" in m]
    stray = [m for m in members if m.startswith(("tests/", "bench/", ".ci/")) or m.endswith((".so", ".pyc"))]
    assert stray == []
    assert "LICENSE" in members and "wrapper/native/preload.c" in members


def test_image_recipe_has_no_compiler_in_the_final_stage_and_a_small_context():
    stages = re.split(r"^FROM ", (REPO / "Dockerfile").read_text(), flags=re.M)[1:]
    assert len(stages) >= 2, "multi-stage build expected"
    assert "gcc" in stages[0] and "gcc" not in stages[-1]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "build", "tests"} <= set(ignored)
