"""The bwrap sandbox's namespace claims (README "Security model"), each tried for real from inside
a session, as root and as an unprivileged account: no nested user namespace (so no capabilities
regained in one), no new mount, network or pid namespace, and IPC, pid and network namespaces
of its own (the host's System V IPC objects are not the session's)."""

from __future__ import annotations

import os

from attack_support import attacker  # noqa: F401  (fixture)

SCRIPT = """
for ns in -Ur -m -n -p; do unshare $ns --fork true 2>/dev/null; echo "unshare$ns=$?"; done
for ns in ipc pid net user mnt; do echo "ns-$ns=$(readlink /proc/self/ns/$ns)"; done
"""


def test_no_nested_namespaces_and_private_ipc(attacker):
    done = attacker.execgate("run", "--sandbox", "bwrap", "--", SCRIPT, cwd=attacker.workdir())
    out = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert out.get("unshare-Ur") not in (None, "0"), done.stdout + done.stderr
    for ns in ("-m", "-n", "-p"):
        assert out.get(f"unshare{ns}") not in (None, "0"), (ns, done.stdout, done.stderr)
    for ns in ("ipc", "pid", "net", "user", "mnt"):
        mine = os.readlink(f"/proc/self/ns/{ns}")
        assert out.get(f"ns-{ns}") not in (None, "", mine), (ns, done.stdout, done.stderr)
