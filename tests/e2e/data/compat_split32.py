"""i386 exec system calls (int 0x80) from a 64-bit process, with the path pointer's upper 32 bits
set: the kernel's compat execve/execveat use the low 32 bits (the real path), the seccomp data --
and so the backstop -- carry all 64 (another string). Usage: split32.py execve|execveat REAL SHOWN"""
import ctypes, os, struct, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LOW, HIGH = 0x10000000, 0x7E0010000000  # HIGH & 0xFFFFFFFF == LOW
for addr in (LOW, HIGH):  # PROT_READ|WRITE|EXEC, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE
    if libc.mmap(addr, 0x1000, 7, 0x2 | 0x20 | 0x100000, -1, 0) != addr:
        sys.exit(f"mmap {addr:#x}: {os.strerror(ctypes.get_errno())}")
mode, real, shown = sys.argv[1], sys.argv[2].encode() + b"\0", sys.argv[3].encode() + b"\0"
ctypes.memmove(LOW + 0x900, b"true\0", 5)
ctypes.memmove(LOW + 0x800, struct.pack("<II", LOW + 0x900, 0), 8)  # argv: 32-bit pointers
ctypes.memmove(LOW, real, len(real))
if mode == "execve":  # ebx = path, ecx = argv, edx = envp
    ctypes.memmove(HIGH, shown, len(shown))
    regs = dict(bx=HIGH, cx=LOW + 0x800, dx=0, si=0, di=0, nr=11)
else:  # execveat: ebx = dirfd, ecx = path, edx = argv, esi = envp, edi = flags (AT_EMPTY_PATH)
    ctypes.memmove(HIGH, b"\0", 1)  # the backstop sees "" and judges the file open on dirfd
    fd = os.open(sys.argv[3], os.O_PATH)
    regs = dict(bx=fd, cx=HIGH, dx=LOW + 0x800, si=0, di=0x1000, nr=358)
code = (b"\x53"  # push rbx
        + b"\x48\xbb" + struct.pack("<Q", regs["bx"]) + b"\x48\xb9" + struct.pack("<Q", regs["cx"])
        + b"\x48\xba" + struct.pack("<Q", regs["dx"]) + b"\x48\xbe" + struct.pack("<Q", regs["si"])
        + b"\x48\xbf" + struct.pack("<Q", regs["di"]) + b"\xb8" + struct.pack("<I", regs["nr"])
        + b"\xcd\x80\x5b\xc3")  # int 0x80; pop rbx; ret
ctypes.memmove(LOW + 0xC00, code, len(code))
result = ctypes.CFUNCTYPE(ctypes.c_int)(LOW + 0xC00)()
print(f"{mode} returned {result}", file=sys.stderr)
sys.exit(126)
