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
- ``PATH`` is :data:`SAFE_PATH` unless ``allow_env`` lets the caller's through;
- last, the rule's ``set_env`` (fixed values of the rule's author, never the caller's) is set over
  the result: the shipped git rules set ``GIT_SSH_COMMAND`` so that ssh fails fast instead of
  prompting or waiting on an unreachable host.

Everything else, ``HOME`` and ``TMPDIR`` included, is dropped. The result is what approvers are
shown (:mod:`execgate.policy_service.approvals`) and exactly what the command gets.

A caller that set a variable configuring the escalated program (``GIT_SSH_COMMAND`` for git,
:func:`withheld`) is told that it did not pass, rather than left to wonder why the program
ignores it (:func:`withheld_note`).
"""

from __future__ import annotations

import logging
import os
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


def clean_env(env: Mapping[str, str], allow: Iterable[str] = (),
              set_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build an escalated command's environment from the caller's ``env`` (see the module doc).

    Args:
        env: the caller's environment.
        allow: variable names or fnmatch globs (case-sensitive) that pass as they are,
            typically a rule's ``allow_env``; ``PATH`` among them lets the caller's PATH through.
        set_env: variables set last, over whatever the caller had (a rule's ``set_env``: values
            of the rule's author, validated when the rules load).

    Returns:
        A new dict: the allowed variables, plus ``PATH`` (:data:`SAFE_PATH` unless allowed and
        given), then ``set_env``. Entries that cannot be put in an environment at all (a name
        that is empty or holds ``=`` or NUL, a value holding NUL) are dropped whatever ``allow``
        says.
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
    for name, value in (set_env or {}).items():
        if name and "=" not in name and "\0" not in name and "\0" not in value:
            built[name] = value
    if dropped and log.isEnabledFor(logging.DEBUG):
        log.debug("escalated env: dropped %s", ", ".join(sorted(dropped)))
    return built


#: Variables that configure a program, by its basename (fnmatch globs, case-sensitive): a caller
#: that set one expects the program to use it (:func:`tool_variables`).
TOOL_ENV: Mapping[str, tuple[str, ...]] = {
    "git": ("GIT_*", "SSH_AUTH_SOCK"),
    "ssh": ("SSH_AUTH_SOCK", "SSH_ASKPASS*"), "scp": ("SSH_AUTH_SOCK", "SSH_ASKPASS*"),
    "sftp": ("SSH_AUTH_SOCK", "SSH_ASKPASS*"), "rsync": ("RSYNC_*", "SSH_AUTH_SOCK"),
    "pip": ("PIP_*", "REQUESTS_CA_BUNDLE"), "pip3": ("PIP_*", "REQUESTS_CA_BUNDLE"),
    "python": ("PIP_*",), "python3": ("PIP_*",), "uv": ("UV_*", "SSL_CERT_FILE"),
    "npm": ("npm_config_*", "NPM_CONFIG_*", "NODE_EXTRA_CA_CERTS"),
    "npx": ("npm_config_*", "NPM_CONFIG_*", "NODE_EXTRA_CA_CERTS"),
    "pnpm": ("npm_config_*", "NPM_CONFIG_*", "PNPM_*", "NODE_EXTRA_CA_CERTS"),
    "yarn": ("npm_config_*", "YARN_*", "NODE_EXTRA_CA_CERTS"),
    "cargo": ("CARGO_*", "RUSTUP_*"), "rustup": ("RUSTUP_*", "CARGO_*"),
    "go": ("GO*",),
    "curl": ("CURL_*", "SSL_CERT_*"), "wget": ("WGETRC",),
}

#: Proxy variables, which every network client among :data:`TOOL_ENV` reads.
PROXY_ENV: tuple[str, ...] = (
    "http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
)


def tool_variables(program: str) -> tuple[str, ...]:
    """Globs of the variables that configure ``program`` (a path or basename): its own
    ``NAME_*`` (the basename in capitals: ``GIT_*``, ``CARGO_*``), and for a program of
    :data:`TOOL_ENV` (``python3.11`` counts as ``python3``) that entry and :data:`PROXY_ENV`."""
    name = os.path.basename(program)
    known = TOOL_ENV.get(name) or TOOL_ENV.get(name.rstrip("0123456789.")) or ()
    stem = name.upper().replace("-", "_").replace(".", "_")
    own = (f"{stem}_*",) if stem.replace("_", "").isalnum() else ()
    return (*own, *known, *(PROXY_ENV if known else ()))


def withheld(env: Mapping[str, str], program: str, allow: Iterable[str] = (),
             set_env: Mapping[str, str] | None = None) -> list[str]:
    """The variables of the caller's ``env`` that configure ``program`` (:func:`tool_variables`)
    and that its escalated environment (:func:`clean_env` with ``allow`` and ``set_env``) does
    not carry with the caller's value; sorted."""
    built = clean_env(env, allow, set_env)
    patterns = tool_variables(program)
    return sorted(name for name, value in env.items()
                  if _matches(name, patterns) and built.get(name) != value)


#: Most variables a note names (the rest are counted), and the longest name it shows.
_NOTE_NAMES = 8
_NOTE_NAME_CHARS = 64


def withheld_note(env: Mapping[str, str], program: str, allow: Iterable[str] = (),
                  set_env: Mapping[str, str] | None = None, rule_id: str = "") -> str:
    """One line for the caller's terminal when :func:`withheld` names anything, else "": which
    variables the escalated ``program`` does not get, which of them the rule sets itself, and
    how a rule passes one (``allow_env``). Names are the caller's: only plain ones
    (``[A-Za-z0-9_]``, at most 64 characters) are shown, at most 8, the rest counted."""
    set_env = set_env or {}
    names = withheld(env, program, allow, set_env)
    if not names:
        return ""
    shown = [n for n in names if len(n) <= _NOTE_NAME_CHARS and n.replace("_", "").isalnum() and n.isascii()]
    more = len(names) - len(shown[:_NOTE_NAMES])
    shown = shown[:_NOTE_NAMES]
    listed = ", ".join(shown) + (f" and {more} more" if shown and more else f"{more} variables" if more else "")
    rule = f"rule {rule_id}" if rule_id else "the default decision"
    replaced = [n for n in shown if n in set_env]
    passable = [n for n in shown if n not in set_env]
    own = (f"; {', '.join(f'{n}={set_env[n]!r}' for n in replaced)} {'is' if len(replaced) == 1 else 'are'} "
           "the rule's own") if replaced else ""
    how = (f"; a rule passes them with allow_env = [{', '.join(repr(n).replace(chr(39), chr(34)) for n in passable)}]"
           if passable else "")
    return (f"{program} runs escalated ({rule}) without your {listed}{own}: an escalated command gets only "
            "allowlisted variables (terminal and locale ones, a fixed PATH), those its rule passes (allow_env) "
            f"and those it sets (set_env){how} (examples/README.md, allow_env)")
