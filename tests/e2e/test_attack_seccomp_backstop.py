"""Attacks on the preload shim's blind spots (issue #10, issue #9 class 11): programs that exec
without the shim seeing it. Under ``execgate run`` (default options: bwrap where it works, the
seccomp backstop on) each one tries to exec a marker the rules deny; the marker must not run, the
caller must get ``Execution denied: <reason>`` on its stderr, and an allowed program must still
run the same way. Every program here is built for real in the test setup (gcc, gcc -static,
gcc -m32, go) or is a stock one (busybox-static, the dynamic loader, Python ctypes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attack_support import attacker  # noqa: F401  (fixture)

MARKER = "eg-bs-marker"
REASON = "marker denied by the backstop rules"
RULES = f"""default = "run"

[[rule]]
id = "marker-deny"
program = "{MARKER}"
decision = "deny"
justification = "{REASON}"
"""
LOADER = "/lib64/ld-linux-x86-64.so.2"

EXECIT = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
extern char **environ;
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
#if defined(VIA_THREAD)
#include <pthread.h>
static char **args;
static void *run(void *unused)
{
    (void)unused;
    syscall(SYS_execve, args[1], args + 1, environ); /* from a thread that is not the leader */
    return NULL;
}
#endif
int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
#if defined(VIA_RAW)
    syscall(SYS_execve, argv[1], argv + 1, environ);
#elif defined(VIA_THREAD)
    pthread_t t;
    args = argv;
    pthread_create(&t, NULL, run, NULL);
    pthread_join(t, NULL);
#elif defined(VIA_DIRFD)
    /* execveat(dirfd, "name", ...): the path relative to an open directory */
    char *slash = strrchr(argv[1], '/');
    *slash = '\0';
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    *slash = '/';
    syscall(SYS_execveat, dir, slash + 1, argv + 1, environ, 0);
#elif defined(VIA_FEXECVE)
    fexecve(open(argv[1], O_RDONLY), argv + 1, environ); /* execveat(fd, "", ..., AT_EMPTY_PATH) */
#elif defined(VIA_MEMFD)
    /* A copy of the program under another name: a memfd (fexecve = execveat(fd, "", AT_EMPTY_PATH)). */
    int in = open(argv[1], O_RDONLY), mfd = memfd_create("innocent", 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(mfd, buf, (size_t)n) != n) return 4;
    fexecve(mfd, argv + 1, environ);
#elif defined(VIA_DLVSYM)
    execve_fn real = (execve_fn)dlvsym(RTLD_NEXT, "execve", "GLIBC_2.2.5");
    if (real == NULL) { fprintf(stderr, "no execve@GLIBC_2.2.5\n"); return 3; }
    real(argv[1], argv + 1, environ);
#else
    execv(argv[1], argv + 1);
#endif
    fprintf(stderr, "execit: %s: %s\n", argv[1], strerror(errno));
    return 126;
}
"""
DROP_SHIM_AUDIT = r"""
#define _GNU_SOURCE
#include <link.h>
#include <string.h>
unsigned int la_version(unsigned int v) { (void)v; return LAV_CURRENT; }
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag)
{
    (void)cookie; (void)flag;
    return strstr(name, "libexecgate_preload") ? NULL : (char *)name;  /* drop the shim */
}
"""
#: Installs its own seccomp user-notification filter for execve and answers CONTINUE to its child's
#: raw exec: the kernel notifies the most recently installed listener, so without the backstop's
#: refusal (EPERM) this would take the exec away from the session's server.
OWN_LISTENER = r"""
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 59, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = 4, .filter = f};
    if (argc < 2)
        return 2;
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int l = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (l < 0)
        perror("own-listener: seccomp");
    pid_t pid = fork();
    if (pid == 0) {
        syscall(SYS_execve, argv[1], argv + 1, environ);
        perror("own-listener: execve");
        _exit(126);
    }
    if (l >= 0) {
        struct seccomp_notif req;
        struct seccomp_notif_resp resp;
        memset(&req, 0, sizeof req);
        if (ioctl(l, SECCOMP_IOCTL_NOTIF_RECV, &req) == 0) {
            memset(&resp, 0, sizeof resp);
            resp.id = req.id;
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
            ioctl(l, SECCOMP_IOCTL_NOTIF_SEND, &resp);
        }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}
"""
EXECIT_GO = """package main

import (
\t"fmt"
\t"os"
\t"os/exec"
)

func main() {
\tcmd := exec.Command(os.Args[1], os.Args[2:]...)
\tcmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
\tif err := cmd.Run(); err != nil {
\t\tfmt.Fprintln(os.Stderr, "execit-go:", err)
\t\tos.Exit(126)
\t}
}
"""
EXECIT_CTYPES = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
args = [a.encode() for a in sys.argv[1:]]
argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
libc.syscall(59, args[0], argv, None)  # x86_64 execve, straight to the kernel
print("execit-ctypes:", os.strerror(ctypes.get_errno()), file=sys.stderr)
sys.exit(126)
"""

#: case id → the command that runs ``{prog}`` its way (``{bin}``: the programs' directory).
CASES = {
    "gcc-static": "{bin}/execit-static {prog}",
    "raw-syscall": "{bin}/execit-raw {prog}",
    "static-fexecve": "{bin}/execit-fexecve {prog}",
    "execveat-dirfd": "{bin}/execit-dirfd {prog}",
    "raw-syscall-in-a-thread": "{bin}/execit-thread {prog}",
    "own-seccomp-listener": "{bin}/own-listener {prog}",
    "ctypes-syscall-59": f"{sys.executable} {{bin}}/execit_ctypes.py {{prog}}",
    "dlvsym-execve": "{bin}/execit-dlvsym {prog}",
    "ld-audit-drops-shim": "LD_AUDIT={bin}/drop-shim.so {bin}/execit {prog}",
    "loader-run-directly": f"busybox env -u LD_PRELOAD {LOADER} {{bin}}/execit {{prog}}",
    "busybox-static-sh": "busybox sh -c '{prog}'",
    "go-os-exec": "{bin}/execit-go {prog}",
    "m32-libc": "{bin}/execit32 {prog}",
    "m32-raw-int80": "{bin}/execit32-raw {prog}",
}


def _cc(*args: str) -> None:
    done = subprocess.run(["gcc", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def programs():
    """Every exec-ing program of :data:`CASES`, built once (mode 0755, readable by everyone)."""
    out = Path(tempfile.mkdtemp(prefix="eg-bs-progs-", dir="/tmp"))
    out.chmod(0o755)
    src = out / "execit.c"
    src.write_text(EXECIT)
    _cc("-O1", "-o", str(out / "execit"), str(src))
    _cc("-O1", "-static", "-o", str(out / "execit-static"), str(src))
    _cc("-O1", "-DVIA_RAW", "-o", str(out / "execit-raw"), str(src))
    _cc("-O1", "-static", "-DVIA_FEXECVE", "-o", str(out / "execit-fexecve"), str(src))
    _cc("-O1", "-static", "-DVIA_MEMFD", "-o", str(out / "execit-memfd"), str(src))
    _cc("-O1", "-static", "-DVIA_DIRFD", "-o", str(out / "execit-dirfd"), str(src))
    _cc("-O1", "-DVIA_THREAD", "-pthread", "-o", str(out / "execit-thread"), str(src))
    (out / "own-listener.c").write_text(OWN_LISTENER)
    _cc("-O1", "-o", str(out / "own-listener"), str(out / "own-listener.c"))
    _cc("-O1", "-DVIA_DLVSYM", "-o", str(out / "execit-dlvsym"), str(src), "-ldl")
    _cc("-O1", "-m32", "-o", str(out / "execit32"), str(src))
    _cc("-O1", "-m32", "-DVIA_RAW", "-o", str(out / "execit32-raw"), str(src))
    (out / "drop-shim.c").write_text(DROP_SHIM_AUDIT)
    _cc("-shared", "-fPIC", "-o", str(out / "drop-shim.so"), str(out / "drop-shim.c"))
    (out / "execit_ctypes.py").write_text(EXECIT_CTYPES)
    gosrc = out / "execit-go.go"
    gosrc.write_text(EXECIT_GO)
    env = {"PATH": "/usr/lib/go/bin:/usr/bin:/bin", "HOME": str(out), "GOCACHE": str(out / ".gocache"),
           "GOPATH": str(out / ".gopath"), "GO111MODULE": "off", "CGO_ENABLED": "0"}
    done = subprocess.run(["go", "build", "-o", str(out / "execit-go"), str(gosrc)], env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(out / ".gocache", ignore_errors=True)
    for path in out.iterdir():
        path.chmod(0o755)
    try:
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _session(attacker, programs: Path, command: str, *options: str):
    """``execgate run`` (default sandbox and backstop unless ``options`` say otherwise) of a script
    in which ``command`` execs the marker, then ``/usr/bin/id -u`` (allowed)."""
    work = attacker.workdir()
    bindir = work / "bin"
    shutil.copytree(programs, bindir, ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(bindir, MARKER)
    rules = work / "rules.toml"
    rules.write_text(RULES)
    audit = work / "audit.jsonl"
    script = (f"{command.format(bin=bindir, prog=marker)}; echo denied-status=$?; "
              f"{command.format(bin=bindir, prog='/usr/bin/id -u')}; echo allowed-status=$?")
    done = attacker.execgate("run", "--rules", str(rules), "--audit-log", str(audit), *options, "--", script,
                             cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


@pytest.mark.parametrize("case", list(CASES))
def test_unseen_exec_of_a_denied_program_is_denied(attacker, programs, case):
    done, records = _session(attacker, programs, CASES[case])
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert "execgate: seccomp backstop: on" in done.stderr
    assert f"Execution denied: {REASON}" in done.stderr
    assert "denied-status=0" not in done.stdout
    # The control: the same route still runs an allowed program, as the attacker.
    assert f"\n{attacker.uid}\nallowed-status=0\n" in done.stdout, done.stdout + done.stderr
    # Decided once: one audit line for the marker's exec, one for id's.
    assert [r["decision"] for r in records if r["program"].endswith("/" + MARKER)] == ["deny"]
    assert [r["decision"] for r in records if r["program"] == "/usr/bin/id"] == ["run"]


def test_32bit_program_is_gated_by_the_32bit_shim(attacker, programs):
    """Issue #9 class 11: with the backstop off, the i386 build of the shim gates a -m32 program."""
    done, records = _session(attacker, programs, CASES["m32-libc"], "--seccomp", "off")
    assert "cannot be preloaded" not in done.stderr  # the loader found a shim of its own ABI
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert f"Execution denied: {REASON}" in done.stderr
    assert f"\n{attacker.uid}\nallowed-status=0\n" in done.stdout, done.stdout + done.stderr
    assert [r["decision"] for r in records if r["program"].endswith("/" + MARKER)] == ["deny"]


def test_no_listener_or_socket_reaches_the_shell(attacker, programs):
    """The launcher's seccomp listener (with it a script could answer its own execs) and its socket
    to the server are closed before the shell starts."""
    work = attacker.workdir()
    done = attacker.execgate("run", "--", "ls -l /proc/$$/fd/", cwd=work)
    assert done.returncode == 0, done.stderr
    assert "seccomp" not in done.stdout
    # stdin, stdout, stderr, the dir being listed, and the session's CODEX_ESCALATE_SOCKET only
    assert done.stdout.count("socket:[") == 1, done.stdout


def test_denial_is_written_through_the_callers_own_stderr(attacker, programs):
    """The message goes through the caller's very open file description (pidfd_getfd), never a
    reopen of /proc/PID/fd/2: a stderr opened read-only stays unwritten, and the exec is still denied."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    (work / "rules.toml").write_text(RULES)
    script = f"echo keep > ro.txt; {work}/bin/execit-static {marker} 2<ro.txt; echo status=$?; cat ro.txt"
    done = attacker.execgate("run", "--rules", str(work / "rules.toml"), "--", script, cwd=work)
    assert not attacker.marker_ran(MARKER)
    assert done.stdout == "status=126\nkeep\n", done.stdout + done.stderr


def test_escalation_cannot_happen_in_place(attacker, programs):
    """An exec the rules escalate, made where the shim cannot see it: refused with a reason saying
    to run it through the shell; the same program run from the shell is escalated."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", "eg-bs-escalate")
    rules = work / "rules.toml"
    rules.write_text(f'default = "run"\n\n[[rule]]\nid = "esc"\nprogram = "{marker}"\n'
                     'decision = "escalate"\njustification = "runs outside"\n')
    audit = work / "audit.jsonl"
    done = attacker.execgate("run", "--rules", str(rules), "--audit-log", str(audit), "--",
                             f"{work}/bin/execit-static {marker}; echo status=$?", cwd=work)
    assert not attacker.marker_ran("eg-bs-escalate"), done.stdout + done.stderr
    assert "status=126" in done.stdout
    assert "needs escalation" in done.stderr and "run it through the session's shell" in done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["decision"] for r in records if r["program"] == str(marker)] == ["escalate"]
    done = attacker.execgate("run", "--rules", str(rules), "--", str(marker), cwd=work)
    assert attacker.marker_ran("eg-bs-escalate"), done.stdout + done.stderr


def test_exec_of_a_copy_in_a_memfd_is_refused(attacker, programs):
    """A static program copies the denied marker into a memfd named "innocent" and execs that:
    the backstop refuses an exec of a file without a name (as the shim does), whatever the name;
    a named file opened the same way still runs (the fexecve case of the parametrised test)."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    (work / "rules.toml").write_text(RULES)
    done = attacker.execgate("run", "--rules", str(work / "rules.toml"), "--",
                             f"{work}/bin/execit-memfd {marker}; echo status=$?", cwd=work)
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert "status=126" in done.stdout
    assert "Execution denied: an unnamed file (/memfd:innocent (deleted)) cannot be judged by name" in done.stderr


SWAP_ARGV = """import ctypes, os, sys
from execgate.wrapper import client
env = dict(os.environ)
answer = client.request_decision(client.connect(env), "/bin/echo", ["echo", "approved"], env)
print("answer", answer.action, flush=True)
libc = ctypes.CDLL(None, use_errno=True)
argv = (ctypes.c_char_p * 3)(b"echo", sys.argv[1].encode(), None)
libc.syscall(59, b"/bin/echo", argv, None)
print("exec failed:", os.strerror(ctypes.get_errno()), flush=True)
"""


@pytest.mark.parametrize("second", ["forbidden", "approved"])
def test_an_approval_covers_exactly_the_approved_argv(attacker, second):
    """A script asks the server itself (as the wrapper does) to Run ``echo approved``, then makes a
    raw exec of ``echo forbidden``, which the rules deny: the approval recorded for its pid must not
    let a different argv through undecided. The control: exactly the approved argv runs."""
    work = attacker.workdir()
    rules = work / "rules.toml"
    rules.write_text('default = "run"\n\n[[rule]]\nid = "no-forbidden"\nprogram = "echo"\nprefix = ["forbidden"]\n'
                     'decision = "deny"\njustification = "forbidden echo"\n')
    (work / "swap.py").write_text(SWAP_ARGV)
    audit = work / "audit.jsonl"
    done = attacker.execgate("run", "--rules", str(rules), "--audit-log", str(audit), "--",
                             f"{sys.executable} swap.py {second}", cwd=work)
    assert "answer Run" in done.stdout, done.stdout + done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    echoes = [(r["argv"], r["decision"]) for r in records if r["program"] == "/bin/echo"]
    if second == "forbidden":
        assert "forbidden\n" not in done.stdout
        assert "exec failed: Permission denied" in done.stdout
        assert "Execution denied: forbidden echo" in done.stderr
        assert echoes == [(["echo", "approved"], "run"), (["echo", "forbidden"], "deny")]
    else:
        assert done.stdout.endswith("approved\n"), done.stdout + done.stderr
        assert echoes == [(["echo", "approved"], "run")]  # decided once


#: Routes that name a file by a path the server once resolved differently from the kernel
#: (found by review, 2026-12-01): case id → shell lines run in the working directory, which set
#: up the route and exec ``{target}`` through it with a static raw execve (``{run}``).
MISNAMED = {
    # ``d/..`` is ``sub`` (d's target's parent) for the kernel, the workdir lexically.
    "symlink-dotdot": "mkdir -p sub/deeper; ln -s sub/deeper d; ln -s {target} sub/alias; {run} ./d/../alias",
    # The caller's own open files, by the names /proc/self/fd and /dev/fd give them.
    "proc-self-fd": "{run} /proc/self/fd/3 3<{target}",
    "dev-fd": "{run} /dev/fd/3 3<{target}",
    "proc-thread-self-fd": "{run} /proc/thread-self/fd/3 3<{target}",
}


@pytest.mark.parametrize("case", list(MISNAMED))
def test_a_path_the_kernel_resolves_otherwise_is_judged_as_the_kernel_runs_it(attacker, programs, case):
    """The backstop identifies the file the kernel will run (a walk of the path as named, in the
    caller's view), never the lexically normalised path: the denied marker reached through a
    symlink and ``..``, or through /proc/self/fd/N and /dev/fd/N, is denied by its own name; the
    same route to an allowed program still runs it, decided once."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    (work / "rules.toml").write_text(RULES)
    audit = work / "audit.jsonl"
    run = f"{work}/bin/execit-static"
    script = (f"mkdir denied allowed; cd denied; {MISNAMED[case].format(run=run, target=marker)}; "
              f"echo denied-status=$?; cd ../allowed; {MISNAMED[case].format(run=run, target='/usr/bin/id')}; "
              "echo allowed-status=$?")
    done = attacker.execgate("run", "--rules", str(work / "rules.toml"), "--audit-log", str(audit), "--",
                             script, cwd=work)
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert f"Execution denied: {REASON}" in done.stderr, done.stderr
    assert "denied-status=126" in done.stdout
    assert f"\nuid={attacker.uid}(" in done.stdout and "allowed-status=0" in done.stdout, done.stdout + done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["decision"] for r in records if r["rule_id"] == "marker-deny"] == ["deny"]


def test_the_wrapper_fast_path_is_only_for_the_wrapper_itself(attacker, programs):
    """The wrapper's own exec continues undecided. A copy of the marker placed so that a path
    through a symlink and ``..`` is lexically the wrapper's path (the kernel runs the copy) used to
    pass as the wrapper, undecided and unaudited: it is decided now (an audit line names it)."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    (work / "rules.toml").write_text(RULES)
    audit = work / "audit.jsonl"
    depth = len(work.parts)  # components of work/dd: that many ".." reach "/" lexically
    chain = "/".join(f"k{i}" for i in range(depth))
    dots = "/.." * depth
    script = (f'mkdir -p {chain} "$PWD$(dirname "$EXEC_WRAPPER")"; ln -s {chain} dd; '
              f'cp {marker} "$PWD$EXEC_WRAPPER"; '
              f'{work}/bin/execit-static "$PWD/dd{dots}$EXEC_WRAPPER"; echo status=$?; echo "wrapper=$EXEC_WRAPPER"')
    done = attacker.execgate("run", "--rules", str(work / "rules.toml"), "--audit-log", str(audit), "--",
                             script, cwd=work)
    wrapper = next(line[len("wrapper="):] for line in done.stdout.splitlines() if line.startswith("wrapper="))
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["program"] for r in records if r["program"] == wrapper] == [wrapper], done.stdout + done.stderr


def test_a_path_through_proc_is_refused_undecided(attacker, programs):
    """An absolute symlink to ``/proc/self/cwd/...`` names, for the caller, a file relative to its
    own cwd; resolved through ``/proc/PID/root`` in the server it named the server's (the
    wrapper, undecided). Such a path cannot be identified in the caller's view: refused."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    script = (f'mkdir P; ln -s "$EXEC_WRAPPER" wl; ln -s {marker} P/wl; ln -s /proc/self/cwd/wl s; '
              f'cd P; {work}/bin/execit-static {work}/s; echo status=$?')
    done = attacker.execgate("run", "--", script, cwd=work)
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert "status=126" in done.stdout
    assert "cannot be identified" in done.stderr, done.stderr


@pytest.mark.parametrize("route", ["shim", "backstop"])
def test_a_rule_naming_an_absolute_path_needs_that_very_file(attacker, programs, route):
    """``B/d2/../../…/usr/bin/id`` is lexically ``/usr/bin/id`` (a rule lets exactly that run
    under ``default = "deny"``), but the kernel follows ``d2`` and runs ``B/usr/bin/id``, a copy of
    the marker: the absolute-path rule applies only when the path as named is the file that runs."""
    work = attacker.workdir()
    shutil.copytree(programs, work / "bin", ignore=shutil.ignore_patterns("*.c", "*.go"))
    marker = attacker.marker_program(work / "bin", MARKER)
    base = work / "B"
    depth = len(base.parts)  # B/d2 has depth components: that many ".." reach "/" lexically
    chain = base.joinpath(*[f"c{i}" for i in range(depth)])
    chain.mkdir(parents=True)
    (base / "d2").symlink_to(chain.relative_to(base))
    (base / "usr/bin").mkdir(parents=True)
    shutil.copy(marker, base / "usr/bin/id")
    named = f"{base}/d2" + "/.." * depth + "/usr/bin/id"
    assert os.path.normpath(named) == "/usr/bin/id"
    rules = work / "rules.toml"
    rules.write_text('default = "deny"\n\n[[rule]]\nid = "id-only"\nprogram = "/usr/bin/id"\ndecision = "run"\n\n'
                     f'[[rule]]\nid = "execit"\nprogram = "{work}/bin/execit-static"\ndecision = "run"\n')
    prefix = "" if route == "shim" else f"{work}/bin/execit-static "
    done = attacker.execgate("run", "--rules", str(rules), "--", f"{prefix}{named}; {prefix}/usr/bin/id -u",
                             cwd=work)
    assert not attacker.marker_ran(MARKER), done.stdout + done.stderr
    assert "Execution denied" in done.stderr and "is not the one at that path" in done.stderr, done.stderr
    assert done.stdout == f"{attacker.uid}\n", done.stdout + done.stderr  # the real /usr/bin/id still runs
