"""The preload shim decides in the calling process when the server can answer Run without asking
anyone (issue 11; server/protocol.py "Cached-only query", docs/DESIGN.md §9): from the decision
cache (a gRPC policy service: ``--policy``, or ``execgate run --cache-ttl``), or by the rules
themselves (``execgate run``'s default in-process service) — and a hostile script that reads our
source speaks that query itself.

What must hold, each run for real in ``execgate run`` (bwrap sandbox and the seccomp backstop, as
root and as an unprivileged account), in both modes:

* a query is answered Run only for an exec that would be Run anyway (with the cache: this very
  file, with a Run cached; in process: the rules say Run), and ``Undecided`` for everything else
  — a denied program, one the rules prompt for, with the cache one never decided — with nothing
  decided, prompted or audited for it;
* the Run of a query approves that one exec only: the same process exec'ing another file with the
  approved argv, past the shim by the raw system call, is decided by the backstop and denied; so
  is a child's, after a query for an exec by a child (the shim's ``posix_spawn``);
* the shim's own use: after the session's first exec (and, with the cache, each program's first)
  the execs run without the wrapper (strace counts its execs), each still one audit line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attack_support import Attacker, grant_traverse
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

QUERY = Path(__file__).parent / "data" / "cached_query.py"

RULES = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"

[[rule]]
id = "ask-esc"
program = "esc"
decision = "prompt"
justification = "a person decides"
"""


def _session(attacker: Attacker, script: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    audit = work / "audit.jsonl"
    attacker.marker_program(work, "mark")
    shutil.copy(QUERY, work / "q.py")
    done = attacker.execgate("run", "-q", "--rules", str(work / "rules.toml"), "--audit-log", str(audit),
                             "--cwd", str(work), *extra, "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


#: The two ways the query is answered: the gRPC embedded service with its decision cache, and
#: the default in-process service (the rules' own Run).
MODES = {"cache": ("--cache-ttl", "60"), "inprocess": ()}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_query_answers_only_what_would_run_anyway(attacker: Attacker, mode: str) -> None:
    py = sys.executable
    grant_traverse(attacker.name, Path(py).resolve()) if not attacker.is_root else None
    script = (f"cp /bin/true ./ok && cp /bin/true ./esc && cp /bin/true ./other; ./ok; ./ok; "
              f"{py} q.py query ./ok ./ok; {py} q.py query ./mark mark; {py} q.py query ./other other; "
              f"{py} q.py query ./esc esc; {py} q.py query-exec ./ok ./ok -- ./mark; "
              f"{py} q.py query-child-exec ./ok ./ok -- ./mark; echo end=$?")
    done, records = _session(attacker, script, "--sandbox", "bwrap", *MODES[mode])
    out = done.stdout + done.stderr
    assert "end=" in done.stdout, out
    answers = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    other = "Undecided" if mode == "cache" else "Run"  # never decided: not cached; the rules say Run
    assert answers == ["ANSWER ./ok Run", "ANSWER ./mark Undecided", f"ANSWER ./other {other}",
                       "ANSWER ./esc Undecided", "ANSWER ./ok Run", "ANSWER ./ok Run"], out
    # The Run of the query approved ./ok; the raw exec of ./mark with ok's argv was decided anew,
    # by the process itself and by its child.
    assert done.stdout.count("EXEC EACCES") == 2 and "CHILD 3" in done.stdout, out
    assert "Execution denied: the marker must never run" in done.stderr, out
    assert not attacker.marker_ran("mark"), out
    work = attacker.workdir()
    by_program: dict[str, list[tuple[str, bool]]] = {}
    for r in records:
        by_program.setdefault(Path(r["program"]).name, []).append((r["decision"], r["cached"]))
    # ./ok: two execs and three Run answers to queries, one line each; nothing for ./esc (a query
    # only: no decision, no prompt); ./mark: the backstop's two denials only.
    if mode == "cache":
        assert sorted(by_program.get("ok", [])) == [("run", False)] + [("run", True)] * 4, records
        assert "other" not in by_program, records
        assert sorted(by_program.get("mark", [])) == [("deny", False), ("deny", True)], records  # a cached Deny
    else:
        assert by_program.get("ok") == [("run", False)] * 5, records
        assert by_program.get("other") == [("run", False)], records
        assert by_program.get("mark") == [("deny", False)] * 2, records
    assert "esc" not in by_program, records
    assert not any(r["program"].startswith(str(work)) and r["decision"] == "escalate" for r in records), records


@pytest.mark.parametrize("mode", sorted(MODES))
def test_answered_execs_run_without_the_wrapper(mode: str) -> None:
    """strace counts the execs of the native wrapper — with the cache one per program (its first,
    decided exec), in process one for the whole session (its first exec ends the session's start)
    — not one per exec, for bash's fork and exec and for make's posix_spawn alike; the audit log
    still has one line per exec (the backstop decided none twice)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is needed (scripts/setup.sh installs it)")
    work = Path(__import__("tempfile").mkdtemp(prefix="eg-shimcache-"))
    try:
        audit, trace = work / "audit.jsonl", work / "trace"
        done = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace),
             sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none", *MODES[mode],
             "--audit-log", str(audit), "--cwd", str(work), "--",
             "for i in 1 2 3 4 5 6 7 8; do /bin/true; done; /bin/echo a; /bin/echo b; "
             "printf 'all:\\n\\t@/bin/echo c\\n\\t@/bin/echo d\\n\\t@/bin/echo e\\n' > Makefile; "
             "/usr/bin/make -s"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and done.stdout == "a\nb\nc\nd\ne\n", done.stdout + done.stderr
        lines = trace.read_text().splitlines()
        done_execs = [line for line in lines if line.endswith("= 0")]
        wrapper_execs = [line for line in done_execs if "execgate-wrapper-native\", [" in line]
        true_execs = [line for line in done_execs if '["/bin/true"]' in line]
        assert len(true_execs) == 8, "\n".join(lines)
        # With the cache: /bin/true's first exec, /bin/echo's and make's (printf is bash's
        # builtin); the echos make spawns (posix_spawn) are cached. In process: the first only.
        assert len(wrapper_execs) == (3 if mode == "cache" else 1), "\n".join(wrapper_execs)
        assert len([line for line in done_execs if '["/bin/echo", ' in line]) == 5, "\n".join(lines)
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        mine = sorted((Path(r["program"]).name, r["cached"]) for r in records if r["program"] in ("/bin/true", "/bin/echo"))
        if mode == "cache":
            assert mine == [("echo", False)] + [("echo", True)] * 4 + [("true", False)] + [("true", True)] * 7, records
        else:
            assert mine == [("echo", False)] * 5 + [("true", False)] * 8, records
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_long_and_non_utf8_arguments_go_through_the_query_intact(tmp_path: Path) -> None:
    """The shim writes its request in 512-byte pieces with the target fd on the first: a 20 KB
    argument, and bytes that are not UTF-8 (sent as ``\\udcXX``), reach the program unchanged
    when the query answers (the default in-process service: the rules' Run)."""
    audit = tmp_path / "audit.jsonl"
    script = ('long=$(head -c 20000 /dev/zero | tr "\\0" x); odd=$(printf "a\\377b\\303"); '
              'for i in 1 2 3; do /bin/echo "$long" | wc -c; /bin/echo "$odd" | od -An -c | tr -s " "; done')
    trace = tmp_path / "trace"
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace),
                           sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--audit-log", str(audit), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["20001", " a 377 b 303 \\n"] * 3, done.stdout + done.stderr
    # No exec of echo went through the wrapper (the session's first exec, head's, did): all six
    # were answered to the shim's query (in process: the rules' Run), one audit line each.
    wrapped = [line for line in trace.read_text().splitlines()
               if "execgate-wrapper-native\", [" in line and '"/bin/echo", "/bin/echo"' in line]
    assert wrapped == [], wrapped
    echoes = [json.loads(line) for line in audit.read_text().splitlines() if '"/bin/echo"' in line]
    assert len(echoes) == 6 and all(r["decision"] == "run" for r in echoes), echoes


SPAWN_WITH_ACTIONS = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
extern char **environ;
/* Warm the cache with two spawns of ./ok, then spawn "./ok" with a file action that makes the
 * child's "./ok" another file: a chdir into d2 (where ok is the marker), or /dev/fd/5 after a
 * dup2 of the marker's fd onto 5. */
static void spawn(const char *path, posix_spawn_file_actions_t *fa) {
    char *av[] = {"./ok", NULL}; pid_t pid; int st;
    int r = posix_spawn(&pid, path, fa, NULL, av, environ);
    if (r) { printf("spawn error %d\n", r); return; }
    waitpid(pid, &st, 0);
    printf("status %d\n", WEXITSTATUS(st));
}
int main(void) {
    posix_spawn_file_actions_t fa;
    spawn("./ok", NULL); spawn("./ok", NULL);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, "d2");
    spawn("./ok", &fa);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, open("d2/ok", O_RDONLY), 5);
    spawn("./ok", NULL);
    spawn("/dev/fd/5", &fa);
    return 0;
}
"""

TINY_STACK = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
/* execve through the shim on a clone(CLONE_VM|CLONE_VFORK) child's 8 KiB stack (a guard page
 * below it), after a first exec has put /bin/true in the cache. */
static int child(void *unused) { char *av[] = {"/bin/true", NULL}; execve("/bin/true", av, environ); _exit(42); }
int main(void) {
    size_t size = 8 * 1024;
    for (int i = 0; i < 3; i++) {
        char *m = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        mprotect(m, 4096, PROT_NONE);
        int st;
        pid_t p = clone(child, m + 4096 + size, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
        waitpid(p, &st, 0);
        printf("%s\n", WIFSIGNALED(st) ? "signal" : WEXITSTATUS(st) == 0 ? "ok" : "failed");
    }
    return 0;
}
"""


def _cc(source: str, out: Path) -> Path:
    (out.parent / (out.name + ".c")).write_text(source)
    subprocess.run(["gcc", "-O2", "-o", str(out), str(out.parent / (out.name + ".c"))], check=True)
    return out


@pytest.mark.parametrize("seccomp", ["off", "on"])
def test_posix_spawn_with_file_actions_is_asked_about_by_the_wrapper(attacker: Attacker, seccomp: str) -> None:
    """A cached Run for ``./ok`` must not cover a ``posix_spawn`` of ``./ok`` whose file actions
    (a chdir, a dup2 under /dev/fd/N) make the child's path another file: the shim leaves such a
    spawn to the wrapper, which resolves the path in the child. With the backstop off, the
    previous code ran the marker twice and audited it as a cached Run of ./ok."""
    work = attacker.workdir()
    _cc(SPAWN_WITH_ACTIONS, work / "spawner")
    (work / "d2").mkdir()
    attacker.marker_program(work / "d2", "ok")
    shutil.copy("/bin/true", work / "ok")
    os.chown(work / "d2", attacker.uid, attacker.gid)
    for name in ("ok", "spawner", "d2/ok"):
        os.chown(work / name, attacker.uid, attacker.gid)
    rules = work / "rules.toml"
    rules.write_text('[[rule]]\nid = "no-marker"\nprogram = "' + str(work / "d2" / "ok") + '"\n'
                     'decision = "deny"\njustification = "the marker must never run"\n'
                     '[[rule]]\nid = "no-fd-paths"\nprogram = "/dev/fd/5"\ndecision = "deny"\n'
                     'justification = "not by fd"\n')
    audit = work / "audit.jsonl"
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--seccomp", seccomp, "--rules", str(rules),
                             "--audit-log", str(audit), "--cwd", str(work), "--", "./spawner; echo end", cwd=work)
    out = done.stdout + done.stderr
    assert "end" in done.stdout, out
    assert not attacker.marker_ran("ok"), out
    assert "MARKER" not in done.stdout, out
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    oks = [r for r in records if r["program"] == str(work / "ok")]
    assert len(oks) == 3 and all(r["decision"] == "run" for r in oks), records  # the three plain spawns


def test_a_clone_child_with_a_small_stack_can_exec_through_the_query(tmp_path: Path) -> None:
    """The shim's query runs on the caller's stack, which may be a clone child's few KiB: an 8 KiB
    stack is enough, as it is for the wrapper's way (the first version needed 10 KiB)."""
    _cc(TINY_STACK, tmp_path / "tiny")
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--cwd", str(tmp_path), "--", "/bin/true; ./tiny"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.split() == ["ok", "ok", "ok"], done.stdout + done.stderr


def test_large_cache_hits_all_reach_the_audit_log(tmp_path: Path) -> None:
    """Cache hits are audited in batches: hits with ~1 MB argvs (4 MiB and more together, gRPC's
    default message limit) used to make the whole batch fail, three times, and be dropped — the
    next small exec of the same window with it. Every exec must have its audit line."""
    audit = tmp_path / "audit.jsonl"
    script = ('big=$(head -c 120000 /dev/zero | tr "\\0" x); /bin/echo warm > /dev/null; sleep 0.6; '
              'for i in 1 2 3 4 5 6 7; do /bin/true $big $big $big $big $big $big $big $big; done; '
              '/bin/echo SMALL-EXEC; sleep 1.5; echo done')
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           *MODES["cache"], "--audit-log", str(audit), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "SMALL-EXEC" in done.stdout, done.stdout + done.stderr
    assert "will not be in the audit log" not in done.stderr and "RESOURCE_EXHAUSTED" not in done.stderr, done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    trues = [r for r in records if r["program"] == "/bin/true"]
    assert len(trues) == 7 and sum(r["cached"] for r in trues) == 6, [(r["program"], r["cached"]) for r in records]
    assert any(r["program"] == "/bin/echo" and r["argv"] == ["/bin/echo", "SMALL-EXEC"] for r in records), records


def test_the_audit_line_names_the_file_that_runs(attacker: Attacker) -> None:
    """A request names one program and attaches the fd of another file (the wrapper's extension:
    the fd is what runs): the decision is made on the file the fd is, and the audit line's
    ``real_path`` says which file that was, whatever ``program`` the caller claimed."""
    py = sys.executable
    script = f"cp /bin/true ./copy; {py} q.py ask-other /usr/bin/ls ./copy ls -l; ln -sf /bin/true ./t; ./t"
    done, records = _session(attacker, script, "--sandbox", "bwrap")
    assert "ANSWER /usr/bin/ls Run" in done.stdout, done.stdout + done.stderr
    work = attacker.workdir()
    claimed = [r for r in records if r["program"] == "/usr/bin/ls"]
    assert [r["real_path"] for r in claimed] == [str(work / "copy")], records
    linked = [r for r in records if r["program"] == str(work / "t")]
    assert [r["real_path"] for r in linked] == [os.path.realpath("/bin/true")], records


STATIC_MARKER = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void) {
    int fd = open("MARKERS/static", O_WRONLY | O_CREAT, 0644);
    write(1, "STATIC MARKER RAN\n", 18);
    return fd < 0;
}
"""


@pytest.mark.parametrize("kind", ["query", "full", "mmap"])
def test_an_approved_file_rewritten_in_place_is_decided_again(attacker: Attacker, kind: str) -> None:
    """A Run is for the file as it was judged: a copy of /bin/true (dynamic) gets Run; the caller
    then rewrites it in place (same inode) into a static program, which a ``file_kind`` rule
    denies, and executes the fd it asked with. The backstop must not let that exec through as the
    approved one: it is decided again — and denied. By truncate and write the change time and
    size differ; through a shared mapping whose pages were written before the check (``mmap``:
    red-team round 3) neither does, and the backstop reads the kinds of a file the caller can
    modify again."""
    work = attacker.workdir()
    source = STATIC_MARKER.replace("MARKERS", str(attacker.markers))
    (work / "smark.c").write_text(source)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(work / "smark"), str(work / "smark.c")], check=True)
    os.chown(work / "smark", attacker.uid, attacker.gid)
    (work / "rules.toml").write_text('[[rule]]\nid = "no-static"\nfile_kind = ["static"]\ndecision = "deny"\n'
                                     'justification = "static programs are not allowed"\n')
    shutil.copy(QUERY, work / "q.py")
    audit = work / "audit.jsonl"
    py = sys.executable
    if kind == "mmap":  # one size for both, so that the rewrite keeps it
        size = max(os.path.getsize("/bin/true"), os.path.getsize(work / "smark"))
        for name in ("smark",):
            with open(work / name, "ab") as grow:
                grow.truncate(size)
        prepare = f"cp /bin/true ./f && truncate -s {size} ./f"
    else:
        prepare = "cp /bin/true ./f"
    script = f"{prepare}; ./smark; {py} q.py rewrite-exec {kind} {work / 'f'} ./smark f; echo end"
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), "--", script, cwd=work)
    out = done.stdout + done.stderr
    assert "end" in done.stdout and f"ANSWER {work / 'f'} Run" in done.stdout, out
    assert "SAME INODE True" in done.stdout, out
    if kind == "mmap":
        assert "CTIME SAME True SIZE SAME True" in done.stdout, out
    assert "STATIC MARKER RAN" not in done.stdout and not attacker.marker_ran("static"), out
    assert "EXEC EACCES" in done.stdout, out
    assert done.stderr.count("Execution denied: static programs are not allowed") == 2, out  # ./smark, then f


def test_root_cannot_make_a_file_look_unmodifiable_and_rewrite_it(tmp_path: Path) -> None:
    """Root without a sandbox, in a mount namespace of its own, views a directory through a
    read-only bind (the judge then finds the file unmodifiable) while it keeps a writable bind
    of the same directory, maps the file through that one, asks, and rewrites it in place after
    the Run (red-team round 4: the static program ran). For a root caller the backstop reads the
    kinds of every approved file again."""
    if os.geteuid() != 0:
        pytest.skip("the route needs root (mount namespaces)")
    # The read-only view is mounted on /mnt (in the script's own mount namespace: the host's /mnt
    # is untouched), so that every directory above it is on a mount made read-only as well.
    rt, rw, ro = tmp_path / "rt", tmp_path / "rw", Path("/mnt")
    for d in (rt, rw):
        d.mkdir()
    tmp_path.chmod(0o755)
    source = STATIC_MARKER.replace("MARKERS", str(tmp_path))
    (tmp_path / "smark.c").write_text(source)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(rt / "s"), str(tmp_path / "smark.c")], check=True)
    size = max(os.path.getsize("/bin/true"), os.path.getsize(rt / "s"))
    shutil.copy("/bin/true", rt / "f")
    for name in ("f", "s"):
        with open(rt / name, "ab") as grow:
            grow.truncate(size)
    shutil.copy(QUERY, rt / "q.py")
    (tmp_path / "rules.toml").write_text('[[rule]]\nid = "no-static"\nfile_kind = ["static"]\ndecision = "deny"\n'
                                         'justification = "static programs are not allowed"\n')
    (rt / "go.sh").write_text(
        f"mount --make-rprivate / && mount --bind {rt} {rw} && mount --bind {rt} {ro} && "
        f"mount -o remount,bind,ro {ro} && mount -o remount,bind,ro / && echo REMOUNTED && cd {ro} && "
        f"MAPFROM={rw / 'f'} {sys.executable} -B {ro / 'q.py'} rewrite-exec mmap {ro / 'f'} {ro / 's'} f\n")
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--rules", str(tmp_path / "rules.toml"), "--cwd", str(tmp_path), "--",
                           f"{rt / 's'}; unshare -m sh {rt / 'go.sh'}; echo end"],
                          capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert "end" in done.stdout and "REMOUNTED" in done.stdout and f"ANSWER {ro / 'f'} Run" in done.stdout, out
    assert "CTIME SAME True SIZE SAME True" in done.stdout, out
    assert "STATIC MARKER RAN" not in done.stdout and not (tmp_path / "static").exists(), out
    assert "EXEC EACCES" in done.stdout, out
