"""remove_tree (server/home.py): what a session left in its private HOME or /tmp is deleted
whatever its shape — deeper than the recursion limit, read-only or unsearchable directories —
and a symlink to a host directory is removed, never followed (its target untouched)."""

from __future__ import annotations

import os
import shutil
import tempfile

from execgate.server.home import remove_tree


def test_deep_read_only_trees_go_and_symlink_targets_stay():
    top = tempfile.mkdtemp(prefix="eg-rt-", dir="/tmp")
    victim = tempfile.mkdtemp(prefix="eg-victim-", dir="/tmp")
    try:
        with open(os.path.join(victim, "keep"), "w") as f:
            f.write("host file\n")
        os.chmod(victim, 0o555)
        deep = top
        for _ in range(1300):  # past Python's default recursion limit of 1000
            deep = os.path.join(deep, "d")
            os.mkdir(deep)
        os.symlink(victim, os.path.join(top, "link"))
        os.mkdir(os.path.join(top, "ro"))
        with open(os.path.join(top, "ro", "f"), "w") as f:
            f.write("x")
        os.chmod(os.path.join(top, "ro"), 0o500)
        os.mkdir(os.path.join(top, "none"))
        os.chmod(os.path.join(top, "none"), 0)
        remove_tree(top)
        assert not os.path.lexists(top)
        assert os.stat(victim).st_mode & 0o777 == 0o555 and os.path.exists(os.path.join(victim, "keep"))
    finally:
        os.chmod(victim, 0o755)
        shutil.rmtree(victim, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def test_many_siblings_are_all_removed():
    """5,000 siblings all go (the walk reads each directory once: a rescan per subdirectory made
    12,000 siblings take 40 s; no time is asserted here)."""
    top = tempfile.mkdtemp(prefix="eg-rt-", dir="/tmp")
    try:
        for i in range(5000):
            os.mkdir(os.path.join(top, f"d{i}"))
            if i % 500 == 0:
                with open(os.path.join(top, f"d{i}", "f"), "w") as f:
                    f.write("x")
        remove_tree(top)
        assert not os.path.lexists(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
