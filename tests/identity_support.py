"""Program-identity facts for tests of the policy side (docs/DESIGN.md §5).

The rules engine judges trust only from the :class:`~execgate.server.policy.FileIdentity` an
escalation server sends (``ExecFacts.identity``). Tests of rules name paths that need not exist on this machine
(``/usr/bin/npm``), so :func:`system_facts` builds the facts (:func:`system_identity` the identity) a server would send for such a file
as if it lay where its path says: a root-owned, read-only file in a system directory, or a file
an unprivileged caller owns under ``/tmp`` or ``/home``.
"""

from __future__ import annotations

import os
import stat

from execgate.server.policy import ExecFacts, FileIdentity

#: Directories whose files tests treat as the caller's own (never trusted).
CALLER_DIRS = ("/tmp/", "/home/", "/var/tmp/")


def system_facts(program: str, **overrides: object) -> ExecFacts:
    """:class:`ExecFacts` holding :func:`system_identity` (no file info: file facts unknown)."""
    return ExecFacts(identity=system_identity(program, **overrides))


def system_identity(program: str, **overrides: object) -> FileIdentity:
    """Identity for ``program`` (absolute): trusted unless it lies under :data:`CALLER_DIRS`, ``/proc``
    or ``/dev``; ``overrides`` replace single fields (e.g. ``real_path``)."""
    program = os.path.normpath(program)
    own = program.startswith(CALLER_DIRS)
    pseudo = program.startswith(("/proc/", "/dev/"))
    facts = dict(
        source="fd", device=1, inode=abs(hash(program)) % (1 << 32), uid=1000 if own else 0,
        mode=stat.S_IFREG | 0o755, real_path=program, root_dir_chain=not own,
        caller_can_modify=own, pseudo_fs=pseudo, same_for_server=True,
    )
    facts.update(overrides)
    return FileIdentity(**facts)  # type: ignore[arg-type]
