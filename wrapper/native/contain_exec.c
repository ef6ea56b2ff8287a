/* execgate-contain: place this process in a session's containment, then become PROGRAM.
 *
 *   execgate-contain [--cgroup PROCS] [--pdeathsig PPID] [--errfd FD] -- PROGRAM ARGV0 [ARG...]
 *
 * Started by the escalation server (server/spawn.py) in front of every process it spawns for a
 * session: the session's shell (or its bwrap) and every escalated command. Before anything of the
 * session runs, and so before it can fork:
 *
 *   --cgroup PROCS    writes "0" to PROCS, a cgroup v2 ``cgroup.procs`` file: the kernel moves the
 *                     writing process into that cgroup (cgroup-v2.rst, "cgroup.procs"; a pid of 0
 *                     means the writer). Every process it forks afterwards is born there, so the
 *                     session's ``cgroup.kill`` reaches it: no window in which a child escapes.
 *   --pdeathsig PPID  prctl(PR_SET_PDEATHSIG, SIGKILL) (prctl(2)), then checks that the parent is
 *                     still PPID (it may have died before the prctl), else exits 137 at once.
 *   --errfd FD        on failure, writes "<stage> <errno>\n" (stage "cgroup", "pdeathsig" or
 *                     "exec") to FD before exiting 127; FD is close-on-exec, so the spawning server
 *                     reads EOF when PROGRAM started (what subprocess.Popen does with its own pipe).
 *
 * PROGRAM is executed with argv ARGV0 ARG... and this process's environment, unchanged, through
 * the raw execve system call: the LD_PRELOAD shim of a session, if it is in the environment, is
 * loaded here too and would otherwise turn this exec into a gated one (wrapper/native/README.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

static int errfd = -1;

static void fail(const char *stage, int err)
{
    if (errfd >= 0) {
        char line[64];
        int n = snprintf(line, sizeof line, "%s %d\n", stage, err);
        if (n > 0 && write(errfd, line, (size_t)n) < 0) { /* nothing more to do */ }
    }
    fprintf(stderr, "execgate-contain: %s: %s\n", stage, strerror(err));
    _exit(127);
}

static long number(const char *text)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0) {
        fprintf(stderr, "execgate-contain: not a number: %s\n", text);
        _exit(127);
    }
    return v;
}

static void join_cgroup(const char *procs)
{
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cgroup", errno);
    if (write(fd, "0", 1) != 1) fail("cgroup", errno);
    if (close(fd) != 0) fail("cgroup", errno);
}

int main(int argc, char **argv)
{
    const char *procs = NULL;
    long ppid = -1;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { i++; break; }
        if (i + 1 >= argc) break;
        if (strcmp(argv[i], "--cgroup") == 0) procs = argv[++i];
        else if (strcmp(argv[i], "--pdeathsig") == 0) ppid = number(argv[++i]);
        else if (strcmp(argv[i], "--errfd") == 0) errfd = (int)number(argv[++i]);
        else break;
    }
    if (i > argc || argc - i < 2 || strcmp(argv[i - 1], "--") != 0) {
        fprintf(stderr, "usage: execgate-contain [--cgroup PROCS] [--pdeathsig PPID] [--errfd FD] "
                        "-- PROGRAM ARGV0 [ARG...]\n");
        return 127;
    }
    if (errfd >= 0 && fcntl(errfd, F_SETFD, FD_CLOEXEC) != 0) errfd = -1;
    if (procs) join_cgroup(procs);
    if (ppid >= 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail("pdeathsig", errno);
        if (getppid() != (pid_t)ppid) _exit(137); /* the parent is gone already */
    }
    syscall(SYS_execve, argv[i], &argv[i + 1], environ);
    fail("exec", errno);
    return 127;
}
