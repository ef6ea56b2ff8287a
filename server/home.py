"""The HOME of an ``execgate run`` session (``--home private|real|DIR``; docs/DESIGN.md §7).

A coding agent's everyday loop writes under HOME: ``git config --global``, pip's and npm's caches
(``~/.cache/pip``, ``~/.npm``), cargo's registry, Go's module cache. The bwrap sandbox's root is
read-only, so with the user's real HOME all of that fails (``EROFS``), while the real HOME is in
plain view (``~/.ssh``, ``~/.npmrc`` tokens, cloud credentials). The choices:

* ``private`` (the default with a sandbox) — a fresh 0700 directory made directly under the host's
  ``/tmp`` (which every bwrap sandbox hides under its own tmpfs; this one directory is bound back
  as a writable root, at the same path, so escalated commands see it as the session does). The
  session's ``HOME`` and XDG/cache variables (:data:`HOME_VARS`) point into it. It is seeded with
  nothing secret: ``.gitconfig`` gets only ``user.name`` and ``user.email`` from the user's own
  (the rest may hold credential helpers, ``http.extraHeader`` tokens, ``url.*.insteadOf`` with
  passwords), and toolchain directories (:data:`TOOLCHAINS`: pyenv, rustup, cargo's and Go's
  ``bin``, nvm, ``~/.local/bin``) are symlinked to the user's and stay read-only: a shim
  written there would run outside the sandbox the next time the user types its name. Inside a
  bwrap sandbox the real HOME is **masked** by an empty tmpfs; only those toolchains, the working
  directory and execgate's own files under it show through. Removed when ``execgate run`` ends.
* ``real`` — the user's real HOME, **writable** in the sandbox: the session gets the user's
  dotfiles and credentials (and can change ``~/.bashrc``, which runs outside the sandbox later).
* ``DIR`` — like ``private``, but the user's directory (made if missing, kept afterwards; seeded
  only where it holds no ``.gitconfig``): caches that survive between runs.

Without a sandbox nothing can be masked or kept read-only: ``private`` and ``DIR`` then only set
the variables (the shell can still read and write the real HOME); the default there is ``real``.

The session's private ``/tmp`` (:func:`with_private_tmp`) is made the same way: a fresh 0700
directory directly under the host's ``/tmp``, bound read-write **at** ``/tmp`` in the session's
sandbox and in every sandboxed escalation of it (``Permissions.tmp_dir``, carried in the profile
the escalation server sends with every request), so that ``cd "$(mktemp -d)" && git clone …``
works; removed when ``execgate run`` ends.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field, replace

from execgate.server.sandbox import ShellSandbox, under, unsafe_workdir

#: Toolchain paths under the real HOME that a private HOME links to (read-only inside a sandbox).
TOOLCHAINS: tuple[str, ...] = (".pyenv", ".rustup", ".cargo/bin", ".nvm", ".local/bin", "go/bin")

#: Where the private HOMEs are made: the host's /tmp, hidden inside every bwrap sandbox.
PRIVATE_PARENT = "/tmp"


class HomeError(Exception):
    """Raised when ``--home`` cannot be set up; the message says why."""


@dataclass
class SessionHome:
    """The HOME a session gets.

    Attributes:
        mode: "private", "real" or "dir".
        path: the directory the session's ``HOME`` names.
        env: variables to set in the shell's environment (empty for ``real``).
        writable: extra writable roots for the sandbox (the HOME itself).
        readable: read-only roots (toolchains under the real HOME).
        masked: directories emptied inside the sandbox (the real HOME).
        note: one line for the user.
        remove: True if :meth:`cleanup` deletes ``path``.
    """

    mode: str
    path: str
    env: dict[str, str] = field(default_factory=dict)
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    masked: tuple[str, ...] = ()
    note: str = ""
    remove: bool = False

    def cleanup(self) -> None:
        """Delete a private HOME (read-only files and directories included, e.g. Go's module
        cache). Idempotent; does nothing for ``real`` and ``DIR``."""
        if self.remove and os.path.isdir(self.path):
            remove_tree(self.path)


def home_vars(home: str) -> dict[str, str]:
    """The variables a non-real HOME sets: ``HOME``, the XDG base directories
    (XDG Base Directory Specification) and the caches of pip, npm, cargo and Go."""
    cache = os.path.join(home, ".cache")
    return {
        "HOME": home,
        "XDG_CACHE_HOME": cache,
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
        "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
        "PIP_CACHE_DIR": os.path.join(cache, "pip"),
        "npm_config_cache": os.path.join(home, ".npm"),
        "CARGO_HOME": os.path.join(home, ".cargo"),
        "GOPATH": os.path.join(home, "go"),
    }


#: Names of the variables :func:`home_vars` sets.
HOME_VARS: tuple[str, ...] = tuple(home_vars("/"))


def prepare_home(choice: str | None, *, sandboxed: bool, real_home: str | None) -> SessionHome:
    """Resolve ``--home`` (None: ``private`` with a sandbox, ``real`` without) and make the
    directory.

    Args:
        choice: "private", "real", a directory path, or None.
        sandboxed: the shell runs in bwrap (the real HOME can be masked).
        real_home: the user's HOME (``$HOME``), or None if unset.

    Raises:
        HomeError: ``real`` without a HOME, or a DIR that is a system directory or not a directory.
    """
    choice = choice or ("private" if sandboxed else "real")
    real = os.path.realpath(real_home) if real_home and os.path.isdir(real_home) else None
    if choice == "real" or (real is not None and choice not in ("private",) and _same(choice, real)):
        if real is None:
            raise HomeError("--home real: HOME is not set or not a directory")
        how = "writable in the sandbox: the session has your dotfiles and credentials" if sandboxed else "as is"
        return SessionHome("real", real, writable=(real,) if sandboxed else (), note=f"home: your real HOME {real}, {how}")
    if choice == "private":
        path = tempfile.mkdtemp(prefix="execgate-home-", dir=PRIVATE_PARENT)
        mode, remove = "private", True
    else:
        path, mode, remove = _user_dir(choice), "dir", False
    try:
        readable = _seed(path, real)
    except OSError as exc:
        if remove:
            shutil.rmtree(path, ignore_errors=True)
        raise HomeError(f"--home: cannot set up {path}: {exc}") from exc
    masked = (real,) if sandboxed and real is not None else ()
    hidden = f"; your HOME {real} is hidden" if masked else ("" if sandboxed else "; no sandbox: your real HOME stays reachable")
    kept = "removed at exit" if remove else "kept"
    return SessionHome(mode, path, env=home_vars(path), writable=(path,), readable=readable if sandboxed else (),
                       masked=masked, note=f"home: {mode} {path} ({kept}{hidden}; --home real for yours)",
                       remove=remove)


def _same(a: str, b: str) -> bool:
    return os.path.realpath(os.path.abspath(os.path.expanduser(a))) == b


def _user_dir(choice: str) -> str:
    """``--home DIR``: absolute, made (0700) if missing, never a system directory."""
    path = os.path.abspath(os.path.expanduser(choice))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise HomeError(f"--home {choice}: {exc.strerror or exc}") from exc
    if (why := unsafe_workdir(path)) is not None:
        raise HomeError(f"--home {choice}: {why}")
    return os.path.realpath(path)


def _seed(home: str, real: str | None) -> tuple[str, ...]:
    """Fill a new HOME: ``.cache``, a ``.gitconfig`` with the user's name and e-mail only (if it
    has none), and links to the toolchains of the real HOME. Returns those toolchain paths."""
    os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
    gitconfig = os.path.join(home, ".gitconfig")
    if not os.path.lexists(gitconfig):
        identity = _git_identity(real)
        with open(gitconfig, "x", encoding="utf-8") as f:
            if identity:
                f.write("[user]\n" + "".join(f'\t{k} = "{_quote(v)}"\n' for k, v in identity.items()))
    linked = []
    for rel in TOOLCHAINS if real is not None else ():
        target, link = os.path.join(real, rel), os.path.join(home, rel)
        if not os.path.isdir(target) or os.path.lexists(link):
            continue
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(target, link)
        linked.append(target)
    return tuple(linked)


def _git_identity(real: str | None) -> dict[str, str]:
    """``user.name`` and ``user.email`` of the user's global git configuration (none if unset)."""
    git = shutil.which("git")
    if git is None or real is None:
        return {}
    found = {}
    env = {"HOME": real, "PATH": os.environ.get("PATH", os.defpath)}
    for key in ("name", "email"):
        try:
            done = subprocess.run([git, "config", "--global", "--get", f"user.{key}"], capture_output=True,
                                  text=True, timeout=10, check=False, env=env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip():
            found[key] = done.stdout.strip()
    return found


def _quote(value: str) -> str:
    """A git-config double-quoted value (git-config(1) "Syntax")."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(top: str) -> None:
    """Delete directory ``top`` and everything in it, as far as possible; never raises.

    What a session left there is its own choice: read-only directories (Go's module cache),
    trees deeper than Python's recursion limit, 100,000 directories side by side, symlinks to host
    files. So the walk is iterative (no recursion: a 1,300-deep tree crashed ``shutil.rmtree``'s
    cleanup, review round 3), reads each directory once (a rescan per subdirectory made 12,000
    siblings take 40 s, review round 4) and works on directory fds: each directory is opened
    ``O_NOFOLLOW`` relative to its parent's fd, made writable with ``fchmod`` on that very
    directory (never a chmod by path, which would follow a symlink put in its place), emptied with
    ``unlinkat`` and removed with ``unlinkat(AT_REMOVEDIR)``. A symlink is removed, never followed."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    # (fd, parent fd, name in the parent, entries left to visit)
    stack: list[tuple[int, int | None, str, list[os.DirEntry[str]]]] = [(fd, None, "", _entries(fd))]
    while stack:
        fd, parent, name, entries = stack[-1]
        child = None
        while entries and child is None:
            entry = entries.pop()
            if not entry.is_dir(follow_symlinks=False):
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except OSError:
                    pass
                continue
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                try:  # a directory without search permission: open it after a chmod of it alone
                    os.chmod(entry.name, 0o700, dir_fd=fd, follow_symlinks=False)
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except (OSError, NotImplementedError):
                    child = None
                    continue
            stack.append((child, fd, entry.name, _entries(child)))
        if child is not None:
            continue
        stack.pop()
        os.close(fd)
        if parent is not None:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                pass
    try:
        os.rmdir(top)
    except OSError:
        pass


def _entries(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory open on ``fd`` (made writable and searchable by its owner
    first, through that fd), or none if it cannot be read."""
    try:
        os.fchmod(fd, 0o700)
    except OSError:
        pass
    try:
        with os.scandir(fd) as it:
            return list(it)
    except OSError:
        return []


@dataclass
class SessionTmp:
    """The host directory behind a session's private ``/tmp`` (None: none, the sandbox's /tmp is
    a tmpfs or there is no sandbox)."""

    path: str | None = None

    def cleanup(self) -> None:
        """Delete the directory and everything the session left in it. Idempotent."""
        if self.path is not None and os.path.isdir(self.path):
            remove_tree(self.path)


def with_private_tmp(sandbox: ShellSandbox) -> tuple[ShellSandbox, SessionTmp]:
    """``sandbox`` with a fresh host directory as its private ``/tmp`` (``Permissions.tmp_dir``),
    and that directory (to remove at exit). Unchanged, with no directory, without bwrap.

    The directory is made by this process (so owned by the session's user), mode 0700, directly
    under the host's ``/tmp`` (:data:`PRIVATE_PARENT`), which every bwrap sandbox hides: only it is
    bound, at ``/tmp``.

    Raises:
        HomeError: the directory cannot be made.
    """
    if sandbox.mode != "bwrap" or sandbox.permissions is None:
        return sandbox, SessionTmp()
    try:
        path = os.path.realpath(tempfile.mkdtemp(prefix="execgate-tmp-", dir=PRIVATE_PARENT))
    except OSError as exc:
        raise HomeError(f"cannot make the session's private /tmp under {PRIVATE_PARENT}: {exc.strerror or exc}") from exc
    note = sandbox.note.replace("a private /tmp", f"a private /tmp ({path} on the host, removed at exit)", 1)
    return replace(sandbox, permissions=replace(sandbox.permissions, tmp_dir=path), note=note), SessionTmp(path)


def with_home(sandbox: ShellSandbox, home: SessionHome) -> ShellSandbox:
    """``sandbox`` with ``home``'s roots added and the real HOME masked (unchanged without bwrap).

    Raises:
        HomeError: a writable root (the working directory) is the real HOME that ``home`` masks,
            or an ancestor of it: bound writable over the mask, it would show the real HOME,
            writable, while the session is told it is hidden. The message names ``--home real``.
    """
    if sandbox.mode != "bwrap" or sandbox.permissions is None:
        return sandbox
    perms = sandbox.permissions
    for root in perms.writable_roots:
        for real in home.masked:
            if any(under(real, spelled) for spelled in (root, os.path.realpath(root))):
                what = "your HOME" if os.path.realpath(root) == real else f"an ancestor of your HOME {real}"
                raise HomeError(f"--cwd {root} is {what}, which --home {home.mode} hides from the session; to work "
                                "there use --home real (your dotfiles and credentials become writable in the "
                                "sandbox), or --cwd a project directory below it")
    writable = tuple(dict.fromkeys((*perms.writable_roots, *home.writable)))
    readable = tuple(dict.fromkeys(r for r in (*perms.readable_roots, *home.readable) if r not in writable))
    masked = tuple(dict.fromkeys((*perms.masked_dirs, *home.masked)))
    return replace(sandbox, permissions=replace(perms, writable_roots=writable, readable_roots=readable,
                                                masked_dirs=masked))
