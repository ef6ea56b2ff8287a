"""Sandboxes for the session's shell and bubblewrap command lines (docs/DESIGN.md §7, §8).

One place builds every ``bwrap`` argv in execgate: the shell's own sandbox (``execgate run --sandbox
bwrap``) and the sandboxed forms of escalated commands that the policy service prepares for a
``permissions`` or ``session_default`` execution.

The sandbox is: the whole filesystem read-only, a private ``/tmp`` (an empty tmpfs, or the
session's own host directory ``Permissions.tmp_dir`` bound there: :func:`bwrap_argv`) and ``/run``
(the host's service sockets live there), the writable roots bound read-write and nothing else (the start
directory is never bound by itself: it is visible only if a root covers it or it lies outside
``/tmp``, ``/run``, ``/proc`` and ``/dev``), no network unless granted (a
fresh network namespace that has only loopback), and, for root as for anyone:

* ``--unshare-user --cap-drop ALL``: a user namespace and no capability at all — effective,
  permitted and bounding sets empty — so root inside cannot remount, unmount (``/tmp``, the socket
  directory) or override file permissions. Without ``--unshare-user`` bwrap run by root keeps the
  bounding set; without ``--cap-drop ALL`` it keeps every capability (bwrap(1) "--cap-drop";
  checked here in ``/proc/self/status``, tests/server/test_sandbox.py);
* ``--disable-userns``: no nested user namespace either, which would give back capabilities over a
  new mount namespace (bwrap(1), bubblewrap ≥ 0.8);
* no_new_privs: bwrap always sets ``PR_SET_NO_NEW_PRIVS`` (``NoNewPrivs: 1``, asserted in a test);
* ``--new-session``: the command is not in the caller's terminal session, so it cannot push input
  into a terminal with ``TIOCSTI`` (bwrap(1) "--new-session");
* ``--unshare-pid --die-with-parent``: when bwrap dies, the kernel kills every process inside;
* ``--unshare-ipc``: no SysV IPC or POSIX message queues shared with the host;
* ``/proc/sys``, ``/proc/sysrq-trigger``, ``/proc/irq``, ``/proc/bus``, ``/proc/fs`` read-only:
  root inside is still the host's uid 0 to permission checks on files (a user namespace maps it to
  itself), and a sysctl file checks nothing else.

Files that must stay out of reach (a remote policy service's socket, the token and key files of
``execgate run``: ``Permissions.hidden_paths``) are hidden by masking their directory after every
bind, else by a cover on the file (:func:`hiding`); execgate's own package
(``Permissions.protected_paths``, :func:`own_package_dirs`) is bound read-only over a writable root
that holds it (:func:`_protect`). Both travel in the session's profile, so sandboxed escalations
get them too.

Inherited fds (the session's ``CODEX_ESCALATE_SOCKET``) pass through bwrap unchanged. The session's
fallback socket directory is bound back in **read-only** after ``/tmp`` is replaced: connect(2) on a
socket inode works on a read-only mount, while unlink, rename and bind fail (``EROFS``; renaming the
mount point itself is ``EBUSY``), so no one inside can put a fake server in its place.

bwrap itself is found only in :data:`TRUSTED_BIN_DIRS`, never through a PATH.
Flag meanings are from bwrap(1) (bubblewrap 0.8).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal, Sequence

from execgate.server.policy import Permissions

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]

#: Where bwrap is looked for, in order: root-owned system directories, never a caller's PATH.
TRUSTED_BIN_DIRS: tuple[str, ...] = ("/usr/bin", "/bin", "/usr/local/bin")

#: Mount points the sandbox replaces with its own (tmpfs, devtmpfs copy, procfs): a path under one
#: of them is visible inside only if a bound root covers it.
_REPLACED = ("/tmp", "/dev", "/proc", "/run", "/var/run")

#: Kernel knobs under a fresh /proc that root in the sandbox could still write: root's uid maps to
#: the host's uid 0, and sysctl files check the uid only (``/proc/sys/kernel/core_pattern`` names a
#: program the kernel runs as host root). Bound read-only over the new /proc, as container runtimes
#: do; without capabilities they cannot be unmounted.
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")

#: Directories that are never a session's working directory themselves (they would become
#: writable roots); a project directory below one of them is fine.
_SYSTEM_DIRS = frozenset({
    "/", "/tmp", "/var/tmp", "/proc", "/dev", "/run", "/sys", "/usr", "/etc", "/var", "/boot", "/bin",
    "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/home", "/root", "/opt", "/srv", "/mnt", "/media",
})
#: Trees no directory of which is a working directory: system files, the boot loader, pseudo
#: file systems. ``/var`` is one, except :data:`_SCRATCH_UNDER_SYSTEM` below it.
_SYSTEM_TREES = ("/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var",
                 "/proc", "/sys", "/dev", "/run")
#: Scratch space inside a system tree: directories below it (not it) may be working directories.
_SCRATCH_UNDER_SYSTEM = ("/var/tmp",)
#: Directories of credentials under a home directory: nothing at or below one is a working directory.
_CREDENTIAL_DIRS = (".ssh", ".gnupg")
#: Pseudo file systems: no directory under them is a working directory either.
_PSEUDO_FS = ("/proc", "/sys", "/dev", "/run")


class SandboxError(Exception):
    """Raised when the requested sandbox cannot be set up (bwrap missing or unusable, a root or
    start directory that cannot be confined)."""


def find_bwrap(dirs: Sequence[str] = TRUSTED_BIN_DIRS) -> str | None:
    """The absolute path of bubblewrap in the first of ``dirs`` holding it, or None.

    A candidate counts only if it is an executable regular file owned by root and writable by
    nobody else, in a directory with the same property: a file someone else can replace is not a
    launcher to trust. PATH is never consulted.
    """
    for directory in dirs:
        path = os.path.join(directory, "bwrap")
        try:
            st, dst = os.stat(path), os.stat(directory)
        except OSError:
            continue
        if (os.path.isabs(path) and st.st_uid == 0 and dst.st_uid == 0 and not (st.st_mode | dst.st_mode) & 0o022
                and os.access(path, os.X_OK) and os.path.isfile(path)):
            return path
    return None


def under(path: str, root: str) -> bool:
    """True if absolute ``path`` is ``root`` or lies below it (lexically, both normalised)."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def unsafe_workdir(path: str, home: str | None = None) -> str | None:
    """Why ``path`` must not be a session's working directory (a writable root), or None if it may.

    Refused: the system directories themselves (``/``, ``/tmp``, ``/var/tmp``, ``/home``,
    ``/root``, ``/opt``, ``/srv``, …: ``_SYSTEM_DIRS``); anything at or below ``/etc``, ``/usr``,
    ``/boot``, ``/bin``, ``/sbin``, the ``/lib*`` directories, ``/var`` (but below ``/var/tmp``)
    and the pseudo file systems ``/proc``, ``/sys``, ``/dev``, ``/run`` (``_SYSTEM_TREES``); and any
    directory of a ``.ssh`` or ``.gnupg`` of ``home``, of ``/root`` or of a ``/home/*``. Allowed:
    project directories under ``/opt``, ``/srv``, ``/home/*``, ``/root``, ``/tmp`` and
    ``/var/tmp``, and the user's ``home`` itself (not when it is one of the refused trees or
    ``/``). ``path`` is judged as written and resolved (symlinks): both must pass.
    """
    real = os.path.realpath(path)
    # Both spellings: /lib64 resolves to /usr/lib64 where /usr is merged.
    names = tuple(dict.fromkeys((os.path.normpath(path), real)))
    refusal = (f"{path} is a system directory; it would become writable in the sandbox "
               "(use a project directory, e.g. one made with mktemp -d)")
    for name in names:
        if name == "/" or any(under(name, tree) for tree in _SYSTEM_TREES) and not any(
                under(name, scratch) and name != scratch for scratch in _SCRATCH_UNDER_SYSTEM):
            return refusal
        if _credential_dir(name, home):
            return (f"{path} is a credentials directory (.ssh, .gnupg) or lies in one; it would become writable "
                    "in the sandbox (use a project directory)")
    if home and real == os.path.realpath(home):
        return None
    if set(names) & _SYSTEM_DIRS:
        return refusal
    return None


def _credential_dir(path: str, home: str | None) -> bool:
    """True if ``path`` is at or below ``.ssh`` or ``.gnupg`` of ``home`` (as written and
    resolved), of ``/root`` or of a directory directly under ``/home``."""
    homes = {"/root"} | ({home, os.path.realpath(home)} if home else set())
    parts = path.split("/")
    if len(parts) >= 4 and parts[1] == "home":
        homes.add("/".join(parts[:3]))
    return any(under(path, os.path.join(h, d)) for h in homes for d in _CREDENTIAL_DIRS)


def visible_inside(path: str, permissions: Permissions) -> bool:
    """True if ``path`` names the same directory inside a :func:`bwrap_argv` sandbox as outside:
    a bound root covers it, or it lies outside the replaced mount points (``/tmp``, ``/dev``,
    ``/proc``, ``/run``) and the masked directories (the real HOME: an empty tmpfs inside)."""
    roots = (*permissions.writable_roots, *permissions.readable_roots)
    return any(under(path, r) for r in roots) or not any(under(path, m)
                                                         for m in (*_REPLACED, *permissions.masked_dirs))


def in_session_tmp(path: str, permissions: Permissions) -> bool:
    """True if ``path`` lies in the session's own ``/tmp`` directory (``permissions.tmp_dir``
    bound at ``/tmp``) and no root covers it: it names the same files in the session's sandbox
    and in every sandbox built from ``permissions`` (a sandboxed escalation), but another
    directory, or none, on the host."""
    return bool(permissions.tmp_dir) and under(path, "/tmp") and not visible_inside(path, permissions)


def _not_nested(roots: Sequence[str], writable: Sequence[str]) -> list[str]:
    """``roots`` (absolute ones, each once) without those that lie strictly inside one of the
    ``writable`` roots, as written or resolved: those are visible and writable through it already,
    and binding them again would resolve their path through directories the session can change
    (a symlink planted in place of a parent: an escalation's bwrap then bound a host directory of
    the session's choosing, read-write, over the nested root's path; review round 4)."""
    spelled = [p for w in writable if os.path.isabs(w) for p in (os.path.normpath(w), os.path.realpath(w))]
    kept: dict[str, None] = {}
    for root in roots:
        if not os.path.isabs(root):
            continue
        forms = {os.path.normpath(root), os.path.realpath(root)}
        if not any(under(f, w) and f != w for f in forms for w in spelled):
            kept[root] = None
    return list(kept)


def tmp_mount_parents(permissions: Permissions, extra_binds: Sequence[str] = ()) -> list[str]:
    """The directories strictly between ``/tmp`` and each path a sandbox mounts below it (roots,
    execgate's package, extra binds, masked directories), shallowest first, when ``/tmp`` is the
    session's own directory (``permissions.tmp_dir``).

    Each is bound onto itself (``tmp_dir/…`` at ``/tmp/…``) right after ``tmp_dir``: in the
    session's own directory a plain directory could be renamed and a symlink put in its place, and
    a later sandbox of the session (an escalation) would then mount a root through the symlink,
    anywhere (review found a workdir bound over execgate's own launcher that way); a mount point
    cannot be renamed (``EBUSY``). They must exist in ``tmp_dir`` before the session starts:
    :func:`make_tmp_mount_parents`."""
    if not permissions.tmp_dir:
        return []
    writable = permissions.writable_roots
    mounted = (*_not_nested((*permissions.writable_roots, *permissions.readable_roots, *own_package_dirs()),
                            writable),
               *permissions.protected_paths, *permissions.masked_dirs, *extra_binds)
    parents: dict[str, None] = {}
    for path in mounted:
        path = os.path.normpath(path) if os.path.isabs(path) else ""
        if not under(path, "/tmp") or path == "/tmp":
            continue
        parts = path.split("/")[2:-1]  # below "/tmp", without the path itself
        for depth in range(1, len(parts) + 1):
            parents["/tmp/" + "/".join(parts[:depth])] = None
    return sorted(parents, key=lambda p: p.count("/"))


def make_tmp_mount_parents(permissions: Permissions, extra_binds: Sequence[str] = ()) -> None:
    """Make :func:`tmp_mount_parents` in the fresh ``permissions.tmp_dir`` (before the session's
    shell starts, while nothing of the session runs: no symlink of its can be in the way).

    Raises:
        SandboxError: one cannot be made, or something other than a directory is there.
    """
    for inner in tmp_mount_parents(permissions, extra_binds):
        host = permissions.tmp_dir + inner[len("/tmp"):]
        try:
            os.mkdir(host, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SandboxError(f"cannot make {host} in the session's /tmp directory: {exc}") from exc
        if os.path.islink(host) or not os.path.isdir(host):
            raise SandboxError(f"{host} in the session's /tmp directory is not a directory")


def check_tmp_dir(tmp_dir: str) -> None:
    """Raise :class:`SandboxError` unless ``tmp_dir`` may be bound read-write at ``/tmp``: an
    absolute, normalised path with no symlink in it, naming an existing directory that is no
    system directory or credentials directory (:func:`unsafe_workdir`; ``/``, ``/tmp``,
    ``/var/tmp`` and the system trees included)."""
    if not os.path.isabs(tmp_dir) or os.path.normpath(tmp_dir) != tmp_dir or os.path.realpath(tmp_dir) != tmp_dir:
        raise SandboxError(f"the session's /tmp directory {tmp_dir!r} must be an absolute path without symlinks")
    if not os.path.isdir(tmp_dir):
        raise SandboxError(f"the session's /tmp directory {tmp_dir} does not exist")
    if (why := unsafe_workdir(tmp_dir)) is not None:
        raise SandboxError(f"the session's /tmp directory: {why}")


def bwrap_argv(
    permissions: Permissions,
    *,
    cwd: str,
    private_tmp: bool = True,
    extra_binds: Sequence[str] = (),
    bwrap: str | None = None,
    hidden: Sequence[str] = (),
) -> list[str]:
    """The bwrap prefix that confines a command to ``permissions`` (module doc: what it holds).

    Args:
        permissions: network on/off; writable roots bound read-write, readable roots read-only
            (the root is read-only already, so readable roots matter only for paths under a
            private ``/tmp`` or a masked directory); masked directories (the user's real HOME
            under a private one, :mod:`execgate.server.home`) replaced by an empty tmpfs before
            the roots are bound, so that a root below one (the working directory, execgate's own
            files, toolchains) still shows through: bwrap makes the mount points it needs in the
            tmpfs (bwrap(1) "--tmpfs", "--bind").
        cwd: absolute directory the command starts in (``--chdir``); it is not bound: it must be
            visible inside (:func:`visible_inside`).
        private_tmp: give the sandbox a private ``/tmp`` (before the binds, so binds under /tmp
            show): ``permissions.tmp_dir`` bound read-write there when it is set (the session's
            own host directory, the same one in the session's sandbox and in every sandboxed
            escalation of it, checked by :func:`check_tmp_dir`; hidden files must not lie in it),
            else a fresh tmpfs. Nothing else of the host's ``/tmp`` shows but the roots under it.
        extra_binds: absolute paths bound **read-only** last (the session's socket directory);
            none may lie in or contain a writable root, where its parent could be renamed away.
        bwrap: absolute path of bwrap; default :func:`find_bwrap`.
        hidden: absolute paths of files that must not be reachable inside (a policy service's
            socket, a token file), joined to ``permissions.hidden_paths``; each is hidden as
            :func:`hiding` says, after every bind: its directory masked by an empty tmpfs (a file
            put there later, a re-created socket, stays out of sight), else the file itself covered
            by ``/dev/null`` (connect(2) on a socket there is refused, a read gets nothing).

    ``permissions.protected_paths`` and this execgate's own package (:func:`own_package_dirs`)
    are bound read-only right after the writable roots wherever a writable root holds them, each
    directory between that root and them bound onto itself first (a mount point cannot be renamed:
    ``EBUSY``), so that the session can neither write them nor move them away and put others in
    their place (:func:`_protect`).

    Returns:
        ``[bwrap, flags…, "--"]``: append the command's argv to it.

    Raises:
        SandboxError: no trusted bwrap, a relative ``bwrap`` or ``cwd``, ``cwd`` not visible
            inside (a directory in the private ``/tmp`` is, when ``tmp_dir`` is bound there), an
            extra bind overlapping a writable root, or a ``tmp_dir`` that :func:`check_tmp_dir`
            refuses or that holds a hidden path.
    """
    bwrap = bwrap if bwrap is not None else find_bwrap()
    if bwrap is None or not os.path.isabs(bwrap):
        raise SandboxError(f"bwrap must be an absolute path found in {', '.join(TRUSTED_BIN_DIRS)}, got {bwrap!r}")
    tmp_dir = permissions.tmp_dir if private_tmp else None
    if tmp_dir:
        check_tmp_dir(tmp_dir)
        for given in (*permissions.hidden_paths, *hidden):
            if any(under(p, tmp_dir) for p in (os.path.normpath(given), os.path.realpath(given))):
                raise SandboxError(f"{given} must stay hidden but lies in the session's /tmp directory {tmp_dir}")
    if not os.path.isabs(cwd) or not (visible_inside(cwd, permissions)
                                      or (private_tmp and in_session_tmp(cwd, permissions))):
        raise SandboxError(f"start directory {cwd} is not visible inside the sandbox")
    for bind in extra_binds:
        if any(under(bind, r) or under(r, bind) for r in permissions.writable_roots):
            raise SandboxError(f"{bind} must stay read-only but overlaps a writable root")
    # --as-pid-1: the command itself is pid 1 of the new pid namespace. Otherwise bwrap's own
    # init would be pid 1, outside every seccomp filter the command installs (the set-ID filter,
    # the backstop), and a process of the session could ptrace it and make it chmod or exec.
    argv = [bwrap, "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--new-session",
            "--unshare-pid", "--as-pid-1", "--unshare-ipc", "--die-with-parent",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in _PROC_READ_ONLY:
        argv += ["--ro-bind-try", path, path]
    argv += _private_run()
    if tmp_dir:
        argv += ["--bind", tmp_dir, "/tmp"]
        for inner in tmp_mount_parents(permissions, extra_binds):
            argv += ["--bind", tmp_dir + inner[len("/tmp"):], inner]
    elif private_tmp:
        argv += ["--tmpfs", "/tmp"]
    for path in permissions.masked_dirs:
        if os.path.isabs(path) and os.path.isdir(path):
            argv += ["--tmpfs", os.path.normpath(path)]
    # execgate's own package is always visible (read-only): it holds the launcher that
    # no_setid_prefix() starts first, the wrapper and the preload shim, and may lie under a
    # private /tmp or a masked HOME (a virtualenv under /tmp: bwrap_usable() probes this way too).
    for root in _not_nested((*permissions.readable_roots, *own_package_dirs()), permissions.writable_roots):
        argv += ["--ro-bind-try", root, root]
    for root in _not_nested(permissions.writable_roots, permissions.writable_roots):
        argv += ["--bind-try", root, root]
    argv += _protect((*permissions.protected_paths, *own_package_dirs()), permissions.writable_roots)
    for bind in extra_binds:
        argv += ["--ro-bind", bind, bind]
    masks, covers = hiding(permissions, cwd=cwd, extra_binds=extra_binds, hidden=hidden, private_tmp=private_tmp)
    for directory in masks:
        argv += ["--tmpfs", directory]
    for path in covers:
        argv += ["--ro-bind", "/dev/null", path]
    if not permissions.network:
        argv.append("--unshare-net")
    argv += ["--chdir", cwd, "--"]
    return argv + no_setid_prefix()


def no_setid_prefix() -> list[str]:
    """``[launcher, "--no-setid", "--"]``: the first command inside every bwrap sandbox, which
    forbids giving a file the set-user-ID or set-group-ID bit before it execs the real command
    (``execgate-seccomp-launch --no-setid``; seccomp_launch.c says why: root in a root session's
    sandbox is the host's uid 0, and a set-user-ID root file it leaves in a writable root would
    give root to any local user). Empty where the launcher is not built (not x86_64)."""
    from execgate.wrapper.artifacts import seccomp_launcher_path

    try:
        launcher = str(seccomp_launcher_path())
    except FileNotFoundError:
        return []
    return [launcher, "--no-setid", "--"]


def own_package_dirs() -> tuple[str, ...]:
    """The directory of the installed ``execgate`` package this process runs (resolved, absolute;
    a one-item tuple): its Python sources, the native wrapper, preload shim, seccomp launcher and
    containment helper (:mod:`execgate.wrapper.artifacts`) and the shipped rules, all of which
    run or are read outside the sandbox."""
    return (os.path.dirname(os.path.dirname(os.path.realpath(__file__))),)


def running_python() -> tuple[str, ...]:
    """The Python installation this process runs (``sys.prefix``: a virtualenv, or the
    interpreter's own prefix), as written and resolved. Its packages and ``.pth`` files run,
    outside the sandbox, every time execgate starts: where it lies in a writable root it is
    protected like :func:`own_package_dirs`."""
    return tuple(dict.fromkeys((sys.prefix, os.path.realpath(sys.prefix))))


def _linked_in_root(path: str, roots: Sequence[str]) -> str | None:
    """Why ``path`` (a file of execgate's own that must stay read-only in the session) cannot be
    kept so: it is reached through a symlink that lies in a writable root — bwrap binds what the
    link points to, and the session replaces the link itself (a ``.venv`` linked to another
    directory: the next start ran the session's ``.pth``, review of 2026-12-02). None if not."""
    for root in roots:
        root = os.path.normpath(root)
        if not under(path, root) or path == root:
            continue
        current = root
        for part in os.path.relpath(path, root).split("/"):
            current = os.path.join(current, part)
            if os.path.islink(current):
                return (f"{path} (execgate's own, kept read-only in the session) is reached through the symlink "
                        f"{current}, which lies in the writable {root}: the session could replace it; run "
                        f"execgate by its real path, {os.path.realpath(path)}")
    return None


def _protect(paths: Sequence[str], writable_roots: Sequence[str]) -> list[str]:
    """bwrap arguments that keep each existing absolute path of ``paths`` read-only where a
    writable root holds it (as written or resolved: the path is then reached through that root).

    Each directory strictly between the root and the path is bound onto itself first (read-write,
    as it was): renaming a directory that holds a mount point works, renaming a mount point does
    not (``EBUSY``), so ``mv .venv .old && mkdir -p .venv/…`` cannot put other files where the
    protected ones were. A path inside another protected one is covered by that one's (recursive)
    read-only bind and gets none of its own; every read-write bind comes before every read-only
    one (a later bind of a directory would lay the host's writable directory over a read-only
    bind below it: execgate's package lies inside the virtualenv running it, and the virtualenv
    was left writable, review of 2026-12-02). A path outside every writable root is read-only
    already: nothing is added.
    """
    # Only the roots bwrap mounts: a root inside another is not bound (_not_nested), and a
    # directory inside it is renamed like any other (with --home holding --cwd, review of
    # 2026-12-02: the working directory itself was moved away and rebuilt).
    writable_roots = _not_nested(writable_roots, writable_roots)
    targets: dict[str, str] = {}  # path as the sandbox names it → the root holding it
    for given in dict.fromkeys(paths):
        if not os.path.isabs(given) or not os.path.lexists(given):
            continue
        real = os.path.realpath(given)
        for root in writable_roots:
            for spelled in dict.fromkeys((os.path.normpath(root), os.path.realpath(root))):
                target = next((p for p in (os.path.normpath(given), real) if under(p, spelled)), None)
                if target is not None:
                    targets.setdefault(os.path.normpath(os.path.join(root, os.path.relpath(target, spelled))),
                                       os.path.normpath(root))
                    break
            else:
                continue
            break
    outermost = [t for t in targets if not any(under(t, o) and t != o for o in targets)]
    between: dict[str, None] = {}
    for inside in sorted(outermost):
        root = targets[inside]
        rel = os.path.relpath(inside, root)
        current = root
        for part in ([] if rel == "." else rel.split("/")[:-1]):
            current = os.path.join(current, part)
            between[current] = None
    argv: list[str] = []
    for directory in sorted(between, key=lambda d: d.count("/")):
        argv += ["--bind", directory, directory]
    for inside in sorted(outermost):
        argv += ["--ro-bind", inside, inside]
    return argv


def hiding(
    permissions: Permissions, *, cwd: str, extra_binds: Sequence[str] = (), hidden: Sequence[str] = (),
    private_tmp: bool = True,
) -> tuple[list[str], list[str]]:
    """How :func:`bwrap_argv` hides ``permissions.hidden_paths`` and ``hidden`` (absolute paths;
    each taken as written and resolved).

    Returns:
        ``(masked, covered)``: directories replaced by an empty tmpfs, and files covered by
        ``/dev/null``. A file's directory is masked when that is safe: it exists, is no system
        directory (``/``, ``/etc``, ``/var``, ``/home``, …, anything under ``/proc``, ``/sys``,
        ``/dev``, ``/run``), lies in no writable root (the session could rename it, and the file
        lives where the session writes anyway) and holds no root, extra bind or ``cwd`` (they
        would vanish). With ``permissions.tmp_dir`` (the session's own ``/tmp`` directory), a
        file under ``/tmp`` that no root shows is skipped first: nothing is mounted in a directory
        the session writes. A file in a masked directory, or under a ``private_tmp``'s ``/tmp``, that
        no root shows needs nothing: the sandbox's own empty tmpfs is there. Else the
        file itself is covered, if it exists (bwrap would make a missing one as a mount point)
        and is no directory: then a file put in its place on the host during the session
        (``mv token.new token``, a restarted service's new socket) is visible inside
        (:meth:`ShellSandbox.start_warnings`).
    """
    writable = [p for r in permissions.writable_roots for p in (os.path.normpath(r), os.path.realpath(r))]
    # What shows inside (roots, binds), and with the start directory what a mask must not hide.
    shown = [p for r in (*permissions.writable_roots, *permissions.readable_roots, *permissions.protected_paths,
                         *own_package_dirs(), *extra_binds) if os.path.isabs(r)
             for p in (os.path.normpath(r), os.path.realpath(r))]
    keep = [*shown, *((os.path.normpath(cwd), os.path.realpath(cwd)) if os.path.isabs(cwd) else ())]
    masked: dict[str, None] = {}
    covered: dict[str, None] = {}
    for given in (*permissions.hidden_paths, *hidden):
        if not os.path.isabs(given):
            continue
        for path in dict.fromkeys((os.path.normpath(given), os.path.realpath(given))):
            directory = os.path.dirname(path)
            if private_tmp and permissions.tmp_dir and under(path, "/tmp") and not any(under(path, k) for k in shown):
                # /tmp is the session's own directory, which the session writes: a mount point made
                # there (bwrap creates it) could be a symlink the session put in its place. The host's
                # /tmp is out of sight already.
                continue
            if (os.path.isdir(directory) and directory not in _SYSTEM_DIRS
                    and not any(under(directory, m) for m in _PSEUDO_FS)
                    and not any(under(directory, w) for w in writable)
                    and not any(under(k, directory) for k in keep)):
                masked[directory] = None
            elif any(under(path, m) for m in (*permissions.masked_dirs, *(("/tmp",) if private_tmp else ()))) \
                    and not any(under(path, k) for k in shown):
                continue  # in a masked directory (the real HOME) or the private /tmp, no root shows it
            elif os.path.lexists(path) and not os.path.isdir(path):
                covered[path] = None
    # A file in a masked directory needs no cover of its own.
    return list(masked), [c for c in covered if not any(under(c, m) for m in masked)]


def _private_run() -> list[str]:
    """bwrap arguments for a private ``/run``: an empty tmpfs, with only the directory of a
    ``/etc/resolv.conf`` that links into ``/run`` (systemd-resolved) bound back read-only.

    ``/run`` holds the host's service sockets (``docker.sock``, systemd's ``private`` socket, the
    user's ``/run/user/UID/bus``): connect(2) needs only write permission on the socket file, which
    root inside (the host's uid 0) or the same user has, read-only mount or not.
    """
    argv = ["--tmpfs", "/run"]
    if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
        argv += ["--tmpfs", "/var/run"]
    resolv = os.path.realpath("/etc/resolv.conf")
    if under(resolv, "/run") or under(resolv, "/var/run"):
        argv += ["--ro-bind-try", os.path.dirname(resolv), os.path.dirname(resolv)]
    return argv


def bwrap_usable(dirs: Sequence[str] = TRUSTED_BIN_DIRS) -> str | None:
    """Return None if the trusted bwrap (:func:`find_bwrap` in ``dirs``) can start a sandbox
    here, else a one-line reason why not."""
    path = find_bwrap(dirs)
    if path is None:
        return f"bwrap not found in {', '.join(dirs)} (root-owned, not writable by others)"
    probe = bwrap_argv(Permissions(), cwd="/", bwrap=path) + ["/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} failed to start: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{path} cannot create a sandbox here: {err[-1] if err else 'status %d' % done.returncode}"
    return None


@dataclass(frozen=True, slots=True)
class ShellSandbox:
    """The chosen sandbox of a session's shell.

    Attributes:
        mode: "bwrap" or "none" (never "auto": that is resolved by :func:`choose_sandbox`).
        permissions: what the shell may do; sent to the policy as the session's sandbox profile
            (None when unconfined).
        note: one line saying what was chosen and why, for the user.
        bwrap: the absolute bwrap used.
        hidden: files hidden inside the sandbox (see :func:`bwrap_argv`): a remote policy
            service's Unix socket and the token and key files of ``execgate run``, so that the
            session cannot reach the decision endpoint with them. ``permissions.hidden_paths``
            holds them too: the profile sent with every request, whence every sandboxed
            escalation hides them as well.
    """

    mode: Literal["bwrap", "none"]
    permissions: Permissions | None
    note: str
    bwrap: str | None = None
    hidden: tuple[str, ...] = ()

    def launch_argv(self, shell_argv: Sequence[str], *, cwd: str, extra_binds: Sequence[str] = ()) -> list[str]:
        """Turn the shell's argv into the argv actually spawned (a bwrap prefix, or unchanged).

        ``extra_binds`` (the session's fallback-socket directory) are bound read-only.

        Raises:
            SandboxError: as :func:`bwrap_argv`.
        """
        if self.mode == "none" or self.permissions is None:
            return list(shell_argv)
        if self.permissions.tmp_dir:
            make_tmp_mount_parents(self.permissions, extra_binds)
        return bwrap_argv(self.permissions, cwd=cwd, extra_binds=extra_binds, bwrap=self.bwrap,
                          hidden=self.hidden) + list(shell_argv)

    def start_warnings(self, cwd: str, prefix: str = sys.prefix) -> list[str]:
        """Lines to print at start (empty without a sandbox): one per hidden file that only a
        file cover hides (:func:`hiding`; the shell starting in ``cwd``), since a file put in its
        place on the host during the session would be visible inside; and one if ``prefix``
        (the Python installation running execgate, a virtualenv) lies in a writable root: its
        ``execgate`` package is kept read-only, the rest of it (other packages, ``.pth`` files,
        the interpreter) is not, and runs outside the sandbox the next time it is used."""
        if self.mode == "none" or self.permissions is None:
            return []
        _, covered = hiding(self.permissions, cwd=cwd, hidden=self.hidden)
        lines = [f"{path} is hidden in the sandbox by a cover on that file only (its directory lies in a writable "
                "root, holds one, or is a system directory): replacing the file on the host during the session "
                "(mv, a restarted service's new socket) would make the new one visible; keep it in a directory "
                "of its own outside the working directory" for path in covered]
        if any(under(p, r) for p in {prefix, os.path.realpath(prefix)} for r in self.permissions.writable_roots):
            lines.append(f"the Python installation running execgate, {prefix}, lies in a writable root: it is kept "
                         "read-only in the session (code put there would run outside the sandbox the next time "
                         "execgate runs), so pip cannot install into it there; give the project a virtualenv of "
                         "its own, or install execgate outside the working directory")
        return lines


def choose_sandbox(
    mode: SandboxMode,
    *,
    workdir: str,
    writable: Sequence[str] = (),
    readable: Sequence[str] = (),
    bwrap_dirs: Sequence[str] = TRUSTED_BIN_DIRS,
    hidden: Sequence[str] = (),
    protected: Sequence[str] = (),
) -> ShellSandbox:
    """Resolve ``--sandbox auto|bwrap|none`` for a shell working in ``workdir``.

    ``writable`` lists further writable roots (a private HOME). ``readable`` lists paths that
    must stay visible even under the private ``/tmp`` or a masked directory (execgate's own
    install prefix, the wrapper, the preload shim: a virtualenv may live under /tmp).
    ``bwrap_dirs``: where bwrap is looked for (:func:`find_bwrap`). ``hidden``: files covered
    inside (see :class:`ShellSandbox`), carried in the profile's ``hidden_paths``; the profile's
    ``protected_paths`` name execgate's own package (:func:`own_package_dirs`) and the Python
    installation running it (:func:`running_python`), and ``protected``: files of execgate's
    own that the session must not change though they lie in its writable roots (the audit log);
    each must exist before the sandbox starts (a missing path is not bound). A private HOME is
    added by :func:`execgate.server.home.with_home`.

    Raises:
        SandboxError: ``bwrap`` was asked for and cannot run here; or a bwrap sandbox (``auto``
            included: fail closed, never a silent fallback) would make a system directory
            (:func:`unsafe_workdir`) writable.
    """
    if mode == "none":
        return ShellSandbox("none", None, "sandbox: none (the shell runs unconfined; every exec is still gated)")
    reason = bwrap_usable(bwrap_dirs)
    if reason is not None:
        if mode == "bwrap":
            raise SandboxError(reason)
        return ShellSandbox("none", None, f"sandbox: none ({reason})")
    roots = tuple(dict.fromkeys([os.path.abspath(workdir), *map(os.path.abspath, writable)]))
    home = os.environ.get("HOME")
    for root in roots:
        if (why := unsafe_workdir(root, home)) is not None:
            raise SandboxError(why)
    seen = tuple(dict.fromkeys(os.path.abspath(r) for r in readable if os.path.abspath(r) not in roots))
    covered = tuple(dict.fromkeys(os.path.abspath(h) for h in hidden))
    for path in (sys.prefix, *own_package_dirs(), *protected):
        if (why := _linked_in_root(os.path.abspath(path), roots)) is not None:
            raise SandboxError(why)
    perms = Permissions(network=False, writable_roots=roots, readable_roots=seen, hidden_paths=covered,
                        protected_paths=tuple(dict.fromkeys((*own_package_dirs(), *running_python(),
                                                             *map(os.path.abspath, protected)))))
    chosen = "bwrap" if mode == "bwrap" else "bwrap (auto: bubblewrap works here)"
    note = f"sandbox: {chosen}; read-only root, writable {', '.join(roots)} and a private /tmp, no network"
    return ShellSandbox("bwrap", perms, note, bwrap=find_bwrap(bwrap_dirs), hidden=covered)
