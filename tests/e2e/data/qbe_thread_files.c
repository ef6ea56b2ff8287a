/* Red team (tests/e2e/test_attack_query_by_exec2.py): a marked exec of /proc/self/fd/N made by a
 * thread whose fd table is its own (clone CLONE_VM|CLONE_THREAD|CLONE_SIGHAND, no CLONE_FILES).
 * The backstop identifies fd N of the calling *thread* (/proc/TID/fd/N); the kernel resolves
 * /proc/self to the thread *group* and runs fd N of the leader's table.
 *
 * Usage: qbe_thread_files [--plain] JUDGED NAME RUN ARGV0 [ARGV1 ...]
 *   the thread's fd N is JUDGED, the leader's fd N is RUN, NAME is the 6th argument.
 * Prints "EXEC <errno>" on failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MARK 0x45584547L

static int plain, fdn;
static const char *judged, *name;
static char **args;
static char fdpath[64];
static long token;
extern char **environ;

static int thread(void *unused)
{
    (void)unused;
    int t = open(judged, O_PATH);
    if (t < 0 || dup2(t, fdn) != fdn)
        _exit(3);
    if (plain)
        syscall(SYS_execve, fdpath, args, environ);
    else
        syscall(SYS_execve, fdpath, args, environ, MARK, token, name);
    char msg[32];
    int n = snprintf(msg, sizeof msg, "EXEC %d\n", errno);
    write(1, msg, n);
    syscall(SYS_exit_group, 1);
    return 1;
}

int main(int argc, char **argv)
{
    int i = 1;
    if (argc > 1 && strcmp(argv[1], "--plain") == 0)
        plain = 1, i++;
    if (argc - i < 4)
        return 2;
    judged = argv[i];
    name = argv[i + 1];
    const char *run = argv[i + 2];
    args = argv + i + 3;
    const char *tok = getenv("EXECGATE_BACKSTOP_QUERY");
    token = tok ? atol(tok) : 1;
    fdn = open(run, O_PATH); /* the leader's fd N: what the kernel will run */
    if (fdn < 0)
        return 2;
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fdn);
    static char stack[1 << 16];
    if (clone(thread, stack + sizeof stack, CLONE_VM | CLONE_THREAD | CLONE_SIGHAND, NULL) < 0) {
        perror("clone");
        return 2;
    }
    for (;;)
        pause();
}
