/* Test probe: call one exec-family function the way the arguments say and report the outcome, so
 * that the same calls can be compared with and without the preload shim.
 * usage: probe PATHVALUE|-unset FUNCTION FILE [ARGS...]   (argv[0] of the exec is FILE) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char *argv[])
{
    if (argc < 4)
        return 2;
    if (strcmp(argv[1], "-unset") == 0)
        unsetenv("PATH");
    else
        setenv("PATH", argv[1], 1);
    const char *fn = argv[2], *file = argv[3];
    char **args = argv + 3;
    int rc = 0, err = 0;
    pid_t pid;
    fflush(stdout);
    if (!strcmp(fn, "execve")) rc = execve(file, args, environ);
    else if (!strcmp(fn, "execv")) rc = execv(file, args);
    else if (!strcmp(fn, "execvp")) rc = execvp(file, args);
    else if (!strcmp(fn, "execvpe")) rc = execvpe(file, args, environ);
    else if (!strcmp(fn, "execl")) rc = execl(file, file, "a1", (char *)0);
    else if (!strcmp(fn, "execlp")) rc = execlp(file, file, "a1", (char *)0);
    else if (!strcmp(fn, "execle")) rc = execle(file, file, "a1", (char *)0, environ);
    else if (!strcmp(fn, "fexecve")) {
        int fd = open(file, O_RDONLY);
        rc = fd < 0 ? -1 : fexecve(fd, args, environ);
    } else if (!strcmp(fn, "execveat")) {
        int dfd = open(".", O_RDONLY | O_DIRECTORY);
        rc = execveat(dfd, file, args, environ, 0);
    } else if (!strcmp(fn, "posix_spawn") || !strcmp(fn, "posix_spawnp")) {
        err = (fn[11] == 'p' ? posix_spawnp : posix_spawn)(&pid, file, NULL, NULL, args, environ);
        if (err == 0) {
            int st;
            waitpid(pid, &st, 0);
            printf("spawned status=%d\n", WEXITSTATUS(st));
            return 0;
        }
        printf("%s %s: %s\n", fn, file, strerrorname_np(err));
        return 1;
    } else return 2;
    err = errno;
    printf("%s %s: rc=%d %s\n", fn, file, rc, strerrorname_np(err));
    return 1;
}
