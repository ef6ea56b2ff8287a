/*
 * seccomp_launch.c — execgate's seccomp backstop launcher (docs/DESIGN.md §6, issue #10):
 *
 *     execgate-seccomp-launch FD PROGRAM ARGV0 ARGV1 ...
 *     execgate-seccomp-launch --no-setid -- PROGRAM ARG1 ...
 *     execgate-seccomp-launch --probe
 *
 * Sets no_new_privs, installs a seccomp filter whose every execve/execveat (x86_64 and i386
 * numbers; x32 ones fail with EACCES) returns SECCOMP_RET_USER_NOTIF, sends the filter's listener
 * fd over the inherited Unix socket FD (SCM_RIGHTS, one datagram "execgate-seccomp-listener"),
 * closes both fds and execs PROGRAM with ARGV0 ARGV1 ... . From then on every exec of this
 * process and of all its descendants waits for the escalation server's answer on the listener
 * (seccomp_unotify(2)); the first one, this launcher's own exec of PROGRAM, is the one the server
 * knows to expect.
 *
 * The filter also refuses (EPERM) to install a further filter with SECCOMP_FILTER_FLAG_NEW_LISTENER:
 * when several filters return USER_NOTIF, the kernel notifies the most recently installed one, so a
 * process that could add its own listener could answer its own execs with CONTINUE.
 *
 * --probe installs the same filter in this process and exits 0 if the kernel allows it here;
 * otherwise it prints the reason and exits 1.
 *
 * --no-setid (the first command inside every bwrap sandbox, sandbox.py) sets no_new_privs and
 * installs a filter, independent of the backstop, under which no process can give a file the
 * set-user-ID or set-group-ID bit: chmod, fchmod, fchmodat, fchmodat2 with S_ISUID or S_ISGID in
 * the mode, and open, openat, creat, mknod, mknodat asking for either bit, fail with EPERM;
 * openat2 (whose mode sits in a struct the filter cannot read) fails with ENOSYS, so callers fall
 * back to openat; so do io_uring_setup/enter/register (io_uring's IORING_OP_OPENAT creates files
 * in the kernel, unseen by the filter). Why: root inside a root session's sandbox is the host's uid 0 (its user
 * namespace maps 0 to 0), and a file's owner needs no capability to set its set-ID bits
 * (chmod(2)), so a set-user-ID root copy of a shell left in the working directory would hand
 * root to every local user. Then it execs PROGRAM with argv PROGRAM ARG1 ... as bwrap would
 * (execvp: a PATH search; the preload shim, if loaded, gates it).
 *
 * Exit statuses: 2 usage; 126 the filter could not be installed, the listener not sent, or the exec
 * failed (ENOSYS from a closed listener: the server did not take it); 127 PROGRAM not found.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

#ifndef __x86_64__
#error "seccomp_launch.c: the filter knows the x86_64 (and i386, x32) system call numbers only"
#endif

#define X32_BIT 0x40000000u
#define LISTENER_MESSAGE "execgate-seccomp-listener"

/* Instruction indices of the filter (jumps are relative: target - (at + 1)). */
enum {
    L_ARCH, L_IS64, L_NR64, L_X32, L_EXECVE64, L_EXECVEAT64, L_SECCOMP64,
    L_X32_EXECVE, L_X32_EXECVEAT, L_X32_SECCOMP,
    L_IS32, L_NR32, L_EXECVE32, L_EXECVEAT32, L_SECCOMP32,
    L_FLAGS, L_NEWLISTENER,
    L_ALLOW, L_NOTIFY, L_EACCES, L_EPERM, L_KILL, L_COUNT
};

#define JUMP(at, op, k, t, f) [at] = BPF_JUMP(BPF_JMP | (op) | BPF_K, (k), (t) - (at) - 1, (f) - (at) - 1)
#define LOAD(at, off) [at] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define RET(at, v) [at] = BPF_STMT(BPF_RET | BPF_K, (v))

static const struct sock_filter filter[L_COUNT] = {
    LOAD(L_ARCH, offsetof(struct seccomp_data, arch)),
    JUMP(L_IS64, BPF_JEQ, AUDIT_ARCH_X86_64, L_NR64, L_IS32),
    LOAD(L_NR64, offsetof(struct seccomp_data, nr)),
    JUMP(L_X32, BPF_JGE, X32_BIT, L_X32_EXECVE, L_EXECVE64),
    JUMP(L_EXECVE64, BPF_JEQ, 59, L_NOTIFY, L_EXECVEAT64),
    JUMP(L_EXECVEAT64, BPF_JEQ, 322, L_NOTIFY, L_SECCOMP64),
    JUMP(L_SECCOMP64, BPF_JEQ, 317, L_FLAGS, L_ALLOW),
    JUMP(L_X32_EXECVE, BPF_JEQ, X32_BIT | 520, L_EACCES, L_X32_EXECVEAT),
    JUMP(L_X32_EXECVEAT, BPF_JEQ, X32_BIT | 545, L_EACCES, L_X32_SECCOMP),
    JUMP(L_X32_SECCOMP, BPF_JEQ, X32_BIT | 317, L_FLAGS, L_ALLOW),
    JUMP(L_IS32, BPF_JEQ, AUDIT_ARCH_I386, L_NR32, L_KILL),
    LOAD(L_NR32, offsetof(struct seccomp_data, nr)),
    JUMP(L_EXECVE32, BPF_JEQ, 11, L_NOTIFY, L_EXECVEAT32),
    JUMP(L_EXECVEAT32, BPF_JEQ, 358, L_NOTIFY, L_SECCOMP32),
    JUMP(L_SECCOMP32, BPF_JEQ, 354, L_FLAGS, L_ALLOW),
    /* seccomp(op, flags, args): the low 32 bits of args[1] (little endian) are the flags. */
    LOAD(L_FLAGS, offsetof(struct seccomp_data, args[1])),
    JUMP(L_NEWLISTENER, BPF_JSET, SECCOMP_FILTER_FLAG_NEW_LISTENER, L_EPERM, L_ALLOW),
    RET(L_ALLOW, SECCOMP_RET_ALLOW),
    RET(L_NOTIFY, SECCOMP_RET_USER_NOTIF),
    RET(L_EACCES, SECCOMP_RET_ERRNO | EACCES),
    RET(L_EPERM, SECCOMP_RET_ERRNO | EPERM),
    RET(L_KILL, SECCOMP_RET_KILL_PROCESS),
};

/* Install the filter; returns the listener fd (close-on-exec, seccomp(2)) or -1 with errno set. */
static int install_filter(void)
{
    struct sock_fprog prog = {.len = L_COUNT, .filter = (struct sock_filter *)filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
}

/* The --no-setid filter, built at run time: per checked call, one self-contained block of five
   instructions (A holds the call number on entry and again when the block is left untaken). */
#define SETID_BITS 06000u /* S_ISUID | S_ISGID */
#define ARG_LOW(i) (offsetof(struct seccomp_data, args) + 8 * (i)) /* low 32 bits, little endian */
#define MAX_SETID_FILTER 128

struct checked { unsigned nr; unsigned mode_arg; };

/* x86_64 (also x32, whose numbers for these calls are the same with X32_BIT set) and i386. */
static const struct checked calls64[] = {
    {90, 1}, {91, 1}, {268, 2}, {452, 2}, {2, 2}, {257, 3}, {85, 1}, {133, 1}, {259, 2},
};
static const struct checked calls32[] = {
    {15, 1}, {94, 1}, {306, 2}, {452, 2}, {5, 2}, {295, 3}, {8, 1}, {14, 1}, {297, 2},
};
#define OPENAT2 437u
/* io_uring_setup, io_uring_enter, io_uring_register: 425-427 on x86_64 and i386 alike. */
#define IO_URING_SETUP 425u
#define IO_URING_REGISTER 427u

static int emit_calls(struct sock_filter *f, int n, const struct checked *calls, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, calls[i].nr, 0, 4);
        f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(calls[i].mode_arg));
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, SETID_BITS, 0, 1);
        f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, OPENAT2, 0, 1);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    /* io_uring's own open (IORING_OP_OPENAT) runs in the kernel, out of the filter's sight: no
       io_uring at all (ENOSYS, as Docker's default profile answers), callers fall back. */
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, IO_URING_SETUP, 0, 2);
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, IO_URING_REGISTER, 1, 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    return n;
}

static int install_no_setid(void)
{
    struct sock_filter f[MAX_SETID_FILTER];
    int n = 0;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    int is64 = n;
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 0); /* jf patched */
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    f[n++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~X32_BIT);
    n = emit_calls(f, n, calls64, sizeof calls64 / sizeof calls64[0]);
    f[is64].jf = (unsigned char)(n - is64 - 1);
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 1, 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    n = emit_calls(f, n, calls32, sizeof calls32 / sizeof calls32[0]);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

static int send_listener(int sock, int listener)
{
    char payload[] = LISTENER_MESSAGE;
    struct iovec iov = {.iov_base = payload, .iov_len = sizeof payload - 1};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    memset(control.buf, 0, sizeof control.buf);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t n;
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)iov.iov_len ? 0 : -1;
}

static int parse_fd(const char *s)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > 1 << 20)
        return -1;
    return (int)v;
}

int main(int argc, char *argv[])
{
    const char *me = "execgate-seccomp-launch";
    if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
        if (install_filter() < 0) {
            fprintf(stderr, "%s: cannot install a seccomp user-notification filter: %s\n", me, strerror(errno));
            return 1;
        }
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "--no-setid") == 0 && strcmp(argv[2], "--") == 0) {
        if (install_no_setid() != 0) {
            fprintf(stderr, "%s: cannot install the set-ID filter: %s\n", me, strerror(errno));
            return 126;
        }
        /* execvp, as bwrap itself runs its command: a PATH search, and the preload shim (when it
           is in the environment) gates this exec as it gated bwrap's. */
        execvp(argv[3], &argv[3]);
        int err = errno;
        fprintf(stderr, "%s: cannot execute %s: %s\n", me, argv[3], strerror(err));
        return err == ENOENT ? 127 : 126;
    }
    int sock = argc >= 4 ? parse_fd(argv[1]) : -1;
    if (sock < 0) {
        fprintf(stderr, "usage: %s FD PROGRAM ARGV0 [ARGS...] | --no-setid -- PROGRAM [ARGS...] | --probe\n", me);
        return 2;
    }
    int listener = install_filter();
    if (listener < 0) {
        fprintf(stderr, "%s: cannot install a seccomp user-notification filter: %s\n", me, strerror(errno));
        return 126;
    }
    if (send_listener(sock, listener) != 0) {
        fprintf(stderr, "%s: cannot hand the seccomp listener to the escalation server: %s\n", me,
                strerror(errno));
        return 126;
    }
    /* Neither fd may reach the program: with the listener it could answer its own execs. */
    close(listener);
    close(sock);
    /* The raw system call: a preload shim loaded into this process must not turn this exec into
       one of the wrapper (the server continues this first exec itself, undecided). */
    syscall(SYS_execve, argv[2], &argv[3], environ);
    int err = errno;
    fprintf(stderr, "%s: cannot execute %s: %s%s\n", me, argv[2], strerror(err),
            err == ENOSYS ? " (the escalation server did not take the seccomp listener)" : "");
    return err == ENOENT ? 127 : 126;
}
