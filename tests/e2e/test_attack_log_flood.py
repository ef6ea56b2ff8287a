"""A session cannot flood the terminal it shares with the user through the server's own warnings
(found by review, 2026-12-01): every broken frame on a session's fallback socket used to log one
``protocol error`` line on ``execgate run``'s stderr, as fast as a script could connect. Now at most
a few lines of a kind pass per minute (:mod:`execgate.server.logfilter`)."""

from __future__ import annotations

from attack_support import attacker  # noqa: F401  (fixture)

FLOOD = """import os, socket, struct
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["EXECGATE_SOCKET_PATH"])
    s.sendall(struct.pack("<I", 5) + b"xxxxx")  # a frame that is not JSON
    s.recv(1)
    s.close()
print("flooded")
"""


def test_broken_frames_do_not_flood_the_terminal(attacker):
    work = attacker.workdir()
    (work / "flood.py").write_text(FLOOD)
    done = attacker.execgate("run", "--", "/usr/bin/python3 flood.py; echo after", cwd=work)
    assert done.stdout == "flooded\nafter\n", done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "protocol error" in line]
    assert 1 <= len(lines) <= 5, done.stderr  # the first ones are shown, the flood is not
