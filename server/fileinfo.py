"""What the server learns of the file an exec would run (issue #9 class 12): ELF or ``#!`` script,
ELF class and machine, static or dynamic, setuid/setgid/file capabilities.

:func:`describe` reads it from an fd open on the file (read-only, or ``O_PATH`` as the wrappers
send it: an ``O_PATH`` fd is reopened read-only through ``/proc/self/fd/N``, proc(5)). The fd is
the wrapper's target fd when there is one, else the file that the request's path resolves to in
the caller's view (:func:`execgate.server.identity.walk`, ``O_PATH``, so that opening never
touches a device or blocks on a FIFO): the very file that the identity describes
(:mod:`execgate.server.exec_facts`). The facts come from:

* elf(5): ``e_ident`` (``\\x7fELF``, ``EI_CLASS`` 1 = 32-bit, 2 = 64-bit, ``EI_DATA``), ``e_machine``,
  and the program headers: a ``PT_INTERP`` entry names the dynamic loader (the program is
  *dynamic*); none: *static* (no loader runs, so no ``LD_PRELOAD``; ``gcc -static``, static-pie,
  the loader itself run as a program);
* execve(2) "Interpreter scripts": ``#!`` then the interpreter path, up to the first blank, in the
  first 256 bytes (``BINPRM_BUF_SIZE``);
* inode(7) / stat(2): ``S_ISUID``, ``S_ISGID`` (set-group-ID counts only with group execute, as
  execve(2) applies it), and capabilities(7): a ``security.capability`` extended attribute.

Bounds: at most :data:`MAX_READ` bytes are read from the file (header, program headers, the
loader's path); anything longer is reported as a problem, not read.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from typing import Literal

#: First bytes examined for ``#!`` (the kernel's BINPRM_BUF_SIZE, execve(2)).
SCRIPT_HEAD = 256
#: Program header table bytes read at most (real programs use < 1 KiB; the kernel allows 64 KiB).
MAX_PHDR_BYTES = 4096
#: Longest PT_INTERP path read (the kernel refuses longer ones: PATH_MAX).
MAX_INTERP = 4096
#: Upper bound of the bytes :func:`describe` reads from one file.
MAX_READ = 64 + MAX_PHDR_BYTES + MAX_INTERP

ELF_MAGIC = b"\x7fELF"
PT_INTERP = 3
#: e_machine values (elf(5), <elf.h>) with their usual names.
MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}
_EHDR = {1: struct.Struct("HHIIIIIHHHHHH"), 2: struct.Struct("HHIQQQIHHHHHH")}  # after e_ident[16]
_PHDR = {1: struct.Struct("IIIIIIII"), 2: struct.Struct("IIQQQQQQ")}

Format = Literal["elf", "script", "other"]
Linkage = Literal["static", "dynamic"]


class NotRegular(ValueError):
    """The path names no regular file (a directory, FIFO, device, socket): nothing is read."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What :func:`describe` learnt of one file.

    Attributes:
        format: ``elf``, ``script`` (``#!``) or ``other`` (execve(2) fails with ENOEXEC; a shell
            then runs it as a shell script itself).
        elf_class: 32 or 64 (``EI_CLASS``); None if not ELF or unreadable.
        machine: ``e_machine``; None if not ELF or truncated.
        linkage: ``dynamic`` (a ``PT_INTERP`` header) or ``static``; None if unknown.
        interpreter: the ``PT_INTERP`` path of a dynamic ELF, or a script's ``#!`` interpreter.
        setuid, setgid: the set-user/group-ID bits that execve(2) would apply.
        capabilities: the file carries file capabilities (``security.capability``).
        problem: why a fact is missing (truncated or malformed header), else None.
        interpreter_info: for a script, what was learnt of its interpreter (one level), if read.
    """

    format: Format
    elf_class: int | None = None
    machine: int | None = None
    linkage: Linkage | None = None
    interpreter: str | None = None
    setuid: bool = False
    setgid: bool = False
    capabilities: bool = False
    problem: str | None = None
    interpreter_info: FileInfo | None = None

    @property
    def machine_name(self) -> str | None:
        """``x86_64``, ``i386``, … or ``machine-N``; None when unknown."""
        return None if self.machine is None else MACHINES.get(self.machine, f"machine-{self.machine}")


def kinds(info: FileInfo | None) -> frozenset[str]:
    """The tags a rule's ``file_kind`` matches: ``static``/``dynamic``, ``elf32``/``elf64``,
    ``setuid``, ``setgid``, ``setcap``, ``script``, ``other``, ``malformed``; ``{"unknown"}``
    when nothing was learnt (``info`` None)."""
    if info is None:
        return frozenset({"unknown"})
    tags = {info.format}
    if info.format == "elf":
        tags.discard("elf")
        if info.elf_class is not None:
            tags.add(f"elf{info.elf_class}")
        if info.linkage is not None:
            tags.add(info.linkage)
        if info.problem is not None:
            tags.add("malformed")
    for flag, tag in ((info.setuid, "setuid"), (info.setgid, "setgid"), (info.capabilities, "setcap")):
        if flag:
            tags.add(tag)
    return frozenset(tags)


def describe(fd: int) -> FileInfo:
    """Describe the file open on ``fd``.

    Args:
        fd: an fd open on the file (read-only, or ``O_PATH``); borrowed, never closed here. An
            ``O_PATH`` fd (or one opened write-only) is reopened read-only via
            ``/proc/self/fd/N`` for the reads, and that second fd is closed here.

    Returns:
        The facts; malformed or truncated content is reported in ``problem``, never raised.

    Raises:
        NotRegular: ``fd`` is not a regular file (checked with fstat(2) before any read).
        OSError: fstat or the reopen failed (e.g. EACCES: the server may not read the file).
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"not a regular file (mode {stat.filemode(st.st_mode)})")
    setuid = bool(st.st_mode & stat.S_ISUID)
    setgid = bool(st.st_mode & stat.S_ISGID) and bool(st.st_mode & stat.S_IXGRP)
    caps = _has_capabilities(fd)
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        head = os.pread(rfd, SCRIPT_HEAD, 0)
        if head.startswith(ELF_MAGIC):
            info = _elf(rfd, head)
        elif head.startswith(b"#!"):
            info = FileInfo("script", interpreter=_shebang(head))
        else:
            info = FileInfo("other")
    finally:
        os.close(rfd)
    return _with_modes(info, setuid, setgid, caps)


def _with_modes(info: FileInfo, setuid: bool, setgid: bool, caps: bool) -> FileInfo:
    return FileInfo(info.format, info.elf_class, info.machine, info.linkage, info.interpreter,
                    setuid, setgid, caps, info.problem)


def _has_capabilities(fd: int) -> bool:
    """True if ``fd``'s file has a ``security.capability`` xattr (capabilities(7)); False when it
    has none or extended attributes are unsupported."""
    try:
        os.getxattr(f"/proc/self/fd/{fd}", "security.capability")
    except OSError:
        return False
    return True


def _shebang(head: bytes) -> str | None:
    """The interpreter path of a ``#!`` line (execve(2)): after ``#!`` and blanks, up to a blank
    or newline; None if empty or cut off by the 256-byte buffer."""
    line = head[2:]
    end = line.find(b"\n")
    if end < 0:
        if len(head) >= SCRIPT_HEAD:
            return None  # the kernel refuses a truncated interpreter path (ENOEXEC)
        end = len(line)
    words = line[:end].replace(b"\t", b" ").split()
    return os.fsdecode(words[0]) if words else None


def _elf(fd: int, head: bytes) -> FileInfo:
    """Parse the ELF header and program headers (elf(5)) from ``fd`` (``head``: its first bytes)."""
    if len(head) < 6:
        return FileInfo("elf", problem="truncated ELF identification")
    cls, data = head[4], head[5]
    if cls not in _EHDR or data not in (1, 2):
        return FileInfo("elf", problem=f"unknown ELF class {cls} or data encoding {data}")
    order = "<" if data == 1 else ">"
    ehdr = struct.Struct(order + _EHDR[cls].format)
    elf_class = 32 if cls == 1 else 64
    if len(head) < 16 + ehdr.size:
        return FileInfo("elf", elf_class, problem="truncated ELF header")
    fields = ehdr.unpack_from(head, 16)
    machine, phoff, phentsize, phnum = fields[1], fields[4], fields[8], fields[9]
    phdr = struct.Struct(order + _PHDR[cls].format)
    if phentsize != phdr.size or phnum in (0, 0xFFFF) or phnum * phentsize > MAX_PHDR_BYTES:
        return FileInfo("elf", elf_class, machine,
                        problem=f"program header table not readable ({phnum} entries of {phentsize} bytes)")
    table = os.pread(fd, phnum * phentsize, phoff)
    if len(table) < phnum * phentsize:
        return FileInfo("elf", elf_class, machine, problem="truncated program header table")
    for n in range(phnum):
        entry = phdr.unpack_from(table, n * phentsize)
        if entry[0] != PT_INTERP:
            continue
        offset, filesz = (entry[1], entry[4]) if cls == 1 else (entry[2], entry[5])
        return FileInfo("elf", elf_class, machine, "dynamic", _interp(fd, offset, filesz))
    return FileInfo("elf", elf_class, machine, "static")


def _interp(fd: int, offset: int, size: int) -> str | None:
    """The PT_INTERP path (NUL-terminated), or None if oversized or truncated."""
    if not 1 < size <= MAX_INTERP:
        return None
    raw = os.pread(fd, size, offset)
    if len(raw) < size:
        return None
    return os.fsdecode(raw.split(b"\0", 1)[0])
