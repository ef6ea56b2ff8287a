"""Environment cleaning for escalated commands (docs/DESIGN.md §5).

An escalated command runs outside the shell's sandbox, so nothing the sandboxed caller put in its
environment may change what that command loads or runs before its own code: dynamic-loader
variables (ld.so(8)), shell start-up files and options (bash(1) INVOCATION, dash(1), zsh(1)
STARTUP/SHUTDOWN FILES), interpreter start-up hooks (python(1), perlrun(1), node(1), java), and
execgate's / Codex's own session variables. A rule's ``allow_env`` lets named variables through.
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from typing import Iterable, Mapping

log = logging.getLogger(__name__)

#: fnmatch patterns of variable names that never reach an escalated command unless allowed.
BLOCKED_ENV: tuple[str, ...] = (
    # Dynamic loaders (glibc ld.so, musl, macOS dyld) and glibc's own hooks.
    "LD_*", "DYLD_*", "GLIBC_TUNABLES", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES",
    "MALLOC_*",
    # Shell start-up and behaviour injection.
    "BASH_ENV", "ENV", "ZDOTDIR", "SHELLOPTS", "BASHOPTS", "BASH_FUNC_*", "PS4", "PROMPT_COMMAND",
    "IFS", "CDPATH", "GLOBIGNORE", "BASH_XTRACEFD", "HISTFILE", "INPUTRC",
    # Interpreter start-up hooks.
    "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE",
    "PERL5LIB", "PERL5OPT", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS",
    "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "LUA_INIT*",
    # Tools that run commands named in their environment (git config injection, ssh helpers,
    # editors and pagers): an escalated git must not run what the sandboxed caller chose.
    "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_*", "GIT_CONFIG_VALUE_*",
    "GIT_CONFIG", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM", "GIT_SSH",
    "GIT_SSH_COMMAND", "GIT_PROXY_COMMAND", "GIT_EXEC_PATH", "GIT_ASKPASS", "SSH_ASKPASS",
    "GIT_EXTERNAL_DIFF", "GIT_TEMPLATE_DIR", "GIT_EDITOR", "GIT_PAGER", "GIT_SEQUENCE_EDITOR",
    "GIT_ALLOW_PROTOCOL", "EDITOR", "VISUAL", "PAGER", "BROWSER", "SSH_ORIGINAL_COMMAND",
    # The escalation session itself (Codex protocol variables and execgate's own).
    "CODEX_ESCALATE_SOCKET", "EXEC_WRAPPER", "EXECGATE_*",
)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def clean_env(env: Mapping[str, str], allow: Iterable[str] = ()) -> dict[str, str]:
    """Return ``env`` without injection variables, keeping those ``allow`` names.

    Args:
        env: the caller's environment.
        allow: variable names or fnmatch globs (case-sensitive) that pass even if blocked,
            typically a rule's ``allow_env``.

    Returns:
        A new dict. Entries that cannot be put in an environment at all (a name that is empty or
        holds ``=`` or NUL, a value holding NUL) are dropped too.
    """
    allow = tuple(allow)
    cleaned: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            dropped.append(repr(name))
        elif _matches(name, BLOCKED_ENV) and not _matches(name, allow):
            dropped.append(name)
        else:
            cleaned[name] = value
    if dropped:
        log.debug("env cleaning dropped %s", ", ".join(sorted(dropped)))
    return cleaned
