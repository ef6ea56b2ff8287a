"""The ``execgate`` entry point: sub-command dispatch, --help and --version, as a real process."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version


def _execgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "execgate.server.cli", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_version_on_stdout():
    done = _execgate("--version")
    assert done.returncode == 0
    assert done.stdout == f"execgate {version('execgate')}\n"


def test_top_level_help_lists_every_command():
    done = _execgate("--help")
    assert done.returncode == 0
    for command in ("run", "policy", "approve"):
        assert f"    {command} " in done.stdout


def test_unknown_command_names_the_choices():
    done = _execgate("bogus")
    assert done.returncode == 2
    assert "invalid choice: 'bogus'" in done.stderr and "'run'" in done.stderr


def test_run_does_not_load_the_policy_cli():
    probe = ("import sys; from execgate.server import cli; cli.build_parser(['run', 'true']); "
             "print('execgate.policy_service.cli' in sys.modules, 'importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_an_unknown_option_prints_the_subcommands_usage():
    """Issue #12 item 7: an argument error names the sub-command's own usage, not the top level's."""
    for argv, usage in ((["run", "--bogus", "true"], "usage: execgate run "),
                        (["policy", "serve", "--listen", "unix:///nowhere.sock", "--bogus"],
                         "usage: execgate policy serve "),
                        (["approve", "--policy", "unix:///nowhere.sock", "--bogus"], "usage: execgate approve ")):
        done = _execgate(*argv)
        assert done.returncode == 2 and done.stderr.startswith(usage), (argv, done.stderr)
        assert "unrecognized arguments: --bogus" in done.stderr, done.stderr
