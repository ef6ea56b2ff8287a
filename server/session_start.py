"""The session's own start is not a decision (issue #12 item 7).

The server spawns the session's shell itself, often through a chain it chose: bwrap execs the
seccomp launcher (or the shell), the launcher execs the shell. With the preload shim in the
environment, those execs reach the gate like any other, so a rules file with ``default = "deny"``
(or one denying ``bash``) used to deny the session its own shell before the script existed.

:class:`StartPolicy` wraps the session's :class:`~execgate.server.policy.Policy`: while the session
is starting, an exec whose argv is *exactly* one the server itself is about to run (given with
:meth:`StartPolicy.expect`), and whose program is that argv's ``argv[0]``, is answered Run without
asking the policy, each at most once and in the order of the chain (a step taken removes every
step before it). The first exec that is not one of them, or the last step, ends the start: from
then on every exec is decided, including a later exec of the same argv. No script code runs before
the shell does, so nothing of the session's choosing can be exempted; what is exempted is only
what the user asked execgate to run. Everything else is delegated unchanged.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Sequence

from execgate.server.policy import Decision, Policy

log = logging.getLogger(__name__)

#: ``rule_id`` of the Run answers given for the session's own start.
START_RULE_ID = "execgate:session-start"


class StartPolicy:
    """A :class:`Policy` that lets the session's own start through, then delegates everything.

    Attributes not defined here (``accepts_facts``, ``prepare_escalated_exec``, …) are the wrapped
    policy's.
    """

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._expected: list[tuple[str, ...]] = []
        self._started = False
        self._lock = threading.Lock()  # the backstop may ask from another task; keep it simple and safe

    def expect(self, argvs: Sequence[Sequence[str]]) -> None:
        """Declare the argvs the server is about to exec to start the session's shell (before
        spawning it). Has no effect once the start has ended."""
        with self._lock:
            if not self._started:
                self._expected = list(dict.fromkeys(tuple(a) for a in argvs if a))  # in chain order, once each

    def _take(self, program: str, argv: Sequence[str]) -> bool:
        """True (and consumed) when ``(program, argv)`` is one of the expected starts."""
        key = tuple(argv)
        with self._lock:
            if self._started or key not in self._expected or not _names(program, key[0]):
                self._started = True  # the first exec of the script's own ends the start
                self._expected = []
                return False
            # The chain runs in order: what came before this step cannot come any more.
            del self._expected[:self._expected.index(key) + 1]
            if not self._expected:
                self._started = True
            return True

    async def determine_action(self, program: str, argv: Sequence[str], workdir: str, *args: Any,
                               **kwargs: Any) -> Decision:
        """Run for an expected start exec, else the wrapped policy's answer."""
        if self._take(program, argv):
            log.info("session start: %s runs undecided (execgate's own exec of the session's shell)", program)
            return Decision.run(rule_id=START_RULE_ID, reason="the session's own start")
        return await self._policy.determine_action(program, argv, workdir, *args, **kwargs)

    def query_run(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped policy's answer to the shim's query (``query_run``, plain or async; see
        :func:`execgate.server.escalation.query_run`), never while the session is starting:
        every exec of the start is taken or ended by :meth:`determine_action`."""
        lookup = getattr(self._policy, "query_run", None)
        with self._lock:
            started = self._started
        return lookup(*args, **kwargs) if started and lookup is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def _names(program: str, arg0: str) -> bool:
    """Whether ``program`` (absolute, as resolved for the exec) is what ``arg0`` names: the same
    path, or for a bare name (``bash``, found through the user's PATH) the same basename."""
    if os.path.isabs(arg0):
        return os.path.normpath(arg0) == os.path.normpath(program)
    return "/" not in arg0 and os.path.basename(program) == arg0


def start_argvs(spawned: Sequence[str], shell_argv: Sequence[str] | None) -> list[list[str]]:
    """The argvs of the session's start that may reach the gate, in the order they run: the argv
    spawned itself, what follows each ``--`` in it (the command a launcher such as bwrap execs),
    and ``shell_argv`` (None when the seccomp backstop starts the shell: it lets its launcher's
    exec of the shell through itself)."""
    starts = [list(spawned)]
    starts += [list(spawned[i + 1:]) for i, arg in enumerate(spawned[:-1]) if arg == "--"]
    if shell_argv is not None:
        starts.append(list(shell_argv))
    return starts
