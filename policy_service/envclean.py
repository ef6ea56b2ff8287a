"""The environment of escalated commands, built from an allowlist (docs/DESIGN.md §5, §8).

An escalated command runs outside the shell's sandbox (or in a wider one), often as another
user, so nothing the sandboxed caller put in its environment may choose what that command loads,
reads or runs: not the dynamic loader (``LD_*``, ld.so(8)), not shell start-up files
(``BASH_ENV``, ``ENV``, bash(1) INVOCATION), not interpreter hooks (``PYTHONPATH``,
``PERL5OPT``, ``NODE_OPTIONS``), not a tool's own configuration (``APT_CONFIG``,
``XDG_CONFIG_HOME``, ``GIT_DIR``, ``HOME`` with its dot-files) and not ``PATH``. A denylist can
never name them all, so the environment is built from what is known to be harmless instead:

- :data:`BASE_ENV` — terminal, locale and user-name variables — pass when their values are plain
  (no path: a locale name, ``TERM`` or ``TZ`` holding a path would make the command read a file
  the caller chose; locale(7), terminfo(5), tzset(3));
- variables a rule's ``allow_env`` names (names or fnmatch globs) pass as they are: the rule's
  author chose them;
- ``PATH`` is :data:`SAFE_PATH` unless ``allow_env`` lets the caller's through.

Everything else, ``HOME`` and ``TMPDIR`` included, is dropped. The result is what approvers are
shown (:mod:`execgate.policy_service.approvals`) and exactly what the command gets.
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from typing import Iterable, Mapping

log = logging.getLogger(__name__)

#: The PATH of an escalated command unless a rule's ``allow_env`` passes the caller's.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: fnmatch patterns of variables that reach an escalated command by default (plain values only).
BASE_ENV: tuple[str, ...] = (
    "TERM", "COLORTERM", "NO_COLOR", "COLUMNS", "LINES",
    "LANG", "LANGUAGE", "LC_*", "TZ",
    "USER", "LOGNAME",
)

#: Longest value a :data:`BASE_ENV` variable may have, in characters.
_MAX_PLAIN = 256


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _plain(name: str, value: str) -> bool:
    """True if ``value`` names no file: no ``/`` (``TZ`` may hold a relative zone name such as
    ``Europe/Paris``, never an absolute path, a ``:`` file form or ``..``), no control characters."""
    if len(value) > _MAX_PLAIN or not value.isprintable() or ".." in value:
        return False
    if name == "TZ":
        return not value.startswith(("/", ":"))
    return "/" not in value


def clean_env(env: Mapping[str, str], allow: Iterable[str] = ()) -> dict[str, str]:
    """Build an escalated command's environment from the caller's ``env`` (see the module doc).

    Args:
        env: the caller's environment.
        allow: variable names or fnmatch globs (case-sensitive) that pass as they are,
            typically a rule's ``allow_env``; ``PATH`` among them lets the caller's PATH through.

    Returns:
        A new dict: the allowed variables, plus ``PATH`` (:data:`SAFE_PATH` unless allowed and
        given). Entries that cannot be put in an environment at all (a name that is empty or
        holds ``=`` or NUL, a value holding NUL) are dropped whatever ``allow`` says.
    """
    allow = tuple(allow)
    built: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            dropped.append(repr(name))
        elif _matches(name, allow) or (_matches(name, BASE_ENV) and _plain(name, value)):
            built[name] = value
        else:
            dropped.append(name)
    built.setdefault("PATH", SAFE_PATH)
    if dropped and log.isEnabledFor(logging.DEBUG):
        log.debug("escalated env: dropped %s", ", ".join(sorted(dropped)))
    return built
