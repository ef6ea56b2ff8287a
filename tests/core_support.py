"""Test support for the server core and the wrapper: an in-process policy (the real ``Policy``
interface, not a mock), a protocol client speaking from inside a session, and process helpers."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from execgate.server import protocol as p
from execgate.server.fdpass import recv_frame, send_frame
from execgate.server.policy import Decision, Execution, PreparedExec, SessionContext

REPO_ROOT = Path(__file__).resolve().parents[1]


class TablePolicy:
    """Decides by program basename; escalated commands run as asked, or as ``commands[basename]``.

    Attributes:
        calls: every ``(program, argv, workdir, session)`` seen by ``determine_action``.
    """

    def __init__(
        self,
        table: Mapping[str, Decision] | None = None,
        *,
        default: Decision | None = None,
        commands: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.table = dict(table or {})
        self.default = default or Decision.run()
        self.commands = dict(commands or {})
        self.calls: list[tuple[str, list[str], str, SessionContext]] = []

    async def determine_action(
        self, program: str, argv: Sequence[str], workdir: str, session: SessionContext
    ) -> Decision:
        self.calls.append((program, list(argv), workdir, session))
        return self.table.get(os.path.basename(program), self.default)

    async def prepare_escalated_exec(
        self,
        program: str,
        argv: Sequence[str],
        workdir: str,
        env: Mapping[str, str],
        execution: Execution,
        session: SessionContext,
    ) -> PreparedExec:
        command = self.commands.get(os.path.basename(program)) or [program, *argv[1:]]
        return PreparedExec(command=list(command), cwd=workdir, env=dict(env), arg0=argv[0] if argv else None)

    @property
    def programs(self) -> list[str]:
        return [c[0] for c in self.calls]


ESCALATE = Decision.escalate()


def wrapper_script(directory: Path) -> str:
    """An executable wrapper launcher for EXEC_WRAPPER using this interpreter."""
    path = directory / "execgate-wrapper"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom execgate.wrapper.client import main\nsys.exit(main())\n")
    path.chmod(0o755)
    return str(path)


async def handshake(client_fd: int, fds: Sequence[int] | None = None) -> socket.socket | None:
    """Send one handshake datagram on the session's client fd; return our (non-blocking) stream end.

    With ``fds`` given, send exactly those instead and return None.
    """
    dgram = socket.socket(fileno=os.dup(client_fd))
    try:
        if fds is not None:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(_ints(fds))))] if fds else []
            dgram.sendmsg([b"\x00"], anc)
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            dgram.sendmsg([b"\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints([theirs.fileno()])))])
        finally:
            theirs.close()
        ours.setblocking(False)
        return ours
    finally:
        dgram.close()


def _ints(fds: Sequence[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()


async def ask(
    sock: socket.socket, file: str, argv: Sequence[str], workdir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> p.EscalateResponse:
    """Send a request on ``sock`` and return the decoded response. ``workdir`` None: this
    process's working directory, as a wrapper sends it (the server starts an escalated command
    only in the caller's own directory)."""
    request = p.EscalateRequest(file=file, argv=list(argv), workdir=os.getcwd() if workdir is None else workdir,
                                env=dict(env or {}))
    await send_frame(sock, request.to_json())
    payload, _ = await recv_frame(sock, max_fds=0)
    return p.EscalateResponse.from_obj(p.decode_json(payload))


async def request(client_fd: int, file: str, argv: Sequence[str], **kw: object) -> p.EscalateResponse:
    """A full handshake + request + response; the stream is closed afterwards."""
    sock = await handshake(client_fd)
    assert sock is not None
    with sock:
        async with asyncio.timeout(10):
            return await ask(sock, file, argv, **kw)  # type: ignore[arg-type]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_commands(pgid: int) -> list[str]:
    """Command names (``comm``) of the live processes in process group ``pgid``, from /proc."""
    names = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            names.append(head.split("(", 1)[1])
    return names


async def wait_until(pred, deadline_s: float = 5.0) -> bool:
    """Poll ``pred()`` until true or ``deadline_s`` seconds pass; return its last value."""
    end = time.monotonic() + deadline_s
    while not pred():
        if time.monotonic() > end:
            return bool(pred())
        await asyncio.sleep(0.05)
    return True


async def read_pid_file(path: Path, deadline_s: float = 10.0) -> int:
    """Wait for ``path`` to hold a pid and return it."""
    assert await wait_until(lambda: path.exists() and path.read_text().strip().isdigit(), deadline_s), path
    return int(path.read_text())
