/* execgate-ctty: make fd 0, a terminal, the controlling terminal of this process, then exec.
 *
 *   execgate-ctty PROGRAM ARGV0 [ARGS...]
 *
 * `execgate run` gives a session's shell a pseudoterminal of its own (pty(7)); the shell starts
 * in a new session (setsid(2), by the process that spawns it or by bwrap's --new-session), which
 * has no controlling terminal, and a terminal merely inherited on fd 0 does not become one. Only a
 * session leader may take one: unless this process leads its session already (execgate spawned it
 * directly), it makes a session of its own first — under bwrap --unshare-pid, --new-session makes
 * the sandbox's pid 1 the leader and the command pid 2 in that session. Then it asks for fd 0 with
 * TIOCSCTTY (tty_ioctl(4), "Controlling terminal"; argument 0: never steal a terminal that is
 * another session's), so that /dev/tty, job control and the terminal's signals (^C, ^Z) work for
 * the shell. It then runs
 * PROGRAM with the raw execve system call, as execgate-seccomp-launch does: a preload shim loaded
 * here must not turn execgate's own exec into a decision.
 *
 * Exit statuses: 2 usage; 126 no session, fd 0 could not be made the controlling terminal, or the exec failed
 * (127: PROGRAM not found). Nothing runs without its terminal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char *argv[])
{
    const char *me = "execgate-ctty";
    if (argc < 3) {
        fprintf(stderr, "usage: %s PROGRAM ARGV0 [ARGS...]\n", me);
        return 2;
    }
    if (getsid(0) != getpid() && setsid() < 0) {
        fprintf(stderr, "%s: cannot start a session: %s\n", me, strerror(errno));
        return 126;
    }
    if (ioctl(0, TIOCSCTTY, 0) != 0) {
        fprintf(stderr, "%s: cannot make fd 0 the controlling terminal: %s\n", me, strerror(errno));
        return 126;
    }
    syscall(SYS_execve, argv[1], &argv[2], environ);
    int err = errno;
    fprintf(stderr, "%s: cannot execute %s: %s\n", me, argv[1], strerror(err));
    return err == ENOENT ? 127 : 126;
}
