/*
 * execgate.h — names and small helpers shared by the preload shim (preload.c) and the native
 * execve wrapper (wrapper.c).
 *
 * Why: both sides must agree on the environment variables of the session's env overlay
 * (docs/DESIGN.md §2, server/protocol.py) and on how the inherited socket is recognised.
 * Limits: every helper here is async-signal-safe and heap-free, so that the shim may call it in a
 * vfork child; nothing here takes a lock or touches stdio.
 */
#ifndef EXECGATE_H
#define EXECGATE_H

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* The Codex protocol's variables (server/protocol.py). */
#define EG_ENV_SOCKET "CODEX_ESCALATE_SOCKET"
#define EG_ENV_WRAPPER "EXEC_WRAPPER"
/* execgate's own variables. */
#define EG_ENV_SOCKET_PATH "EXECGATE_SOCKET_PATH" /* fallback SOCK_STREAM socket of the session */
#define EG_ENV_SOCKET_ID "EXECGATE_SOCKET_ID"     /* "<fd>:<inode>" of the inherited socket */
#define EG_ENV_DEPTH "EXECGATE_DEPTH"             /* gated execs along this process's ancestry */
#define EG_ENV_MAX_DEPTH "EXECGATE_MAX_DEPTH"     /* limit of EG_ENV_DEPTH (default below) */
#define EG_ENV_IN_WRAPPER "EXECGATE_IN_WRAPPER"   /* set only for the wrapper process itself */
#define EG_ENV_CACHED_QUERY "EXECGATE_CACHED_QUERY" /* "1": the shim asks the cache first */
#define EG_ENV_BACKSTOP_QUERY "EXECGATE_BACKSTOP_QUERY" /* the backstop's token: query by exec */
#define EG_ENV_PREFIX "EXECGATE_"
/* A query by exec (server/protocol.py "Query by exec"): execveat(fd, "", AT_EMPTY_PATH) by the
 * raw system call, its unused 6th argument the address of {QUERY_EXEC_MARK, token, name};
 * QUERY_UNDECIDED_ERRNO when not answered Run. */
#define EG_QUERY_MARK 0x45584547L
struct eg_query_mark {
    long magic; /* EG_QUERY_MARK */
    long token; /* EXECGATE_BACKSTOP_QUERY */
    const char *name; /* the path the caller asked to run: the name the policy judges */
};
#define EG_QUERY_UNDECIDED_ERRNO EOPNOTSUPP

/* Largest frame payload either side accepts (server/protocol.py MAX_FRAME_BYTES). */
#define EG_MAX_FRAME_BYTES (1u << 20)

#define EG_DEFAULT_MAX_DEPTH 128L
/* The shell libc runs for a file with no format the kernel knows (glibc's _PATH_BSHELL). */
#define EG_BSHELL "/bin/sh"
/* PATH used by glibc's execvp family when PATH is unset (glibc >= 2.33: confstr(_CS_PATH)). */
#define EG_DEFAULT_PATH "/bin:/usr/bin"

/* Length of the name part of "NAME=value" if it equals NAME, else 0. */
static inline size_t eg_env_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return (strncmp(entry, name, n) == 0 && entry[n] == '=') ? n : 0;
}

/* Parse a non-negative decimal that fits in a long; -1 if STR is not one. */
static inline long eg_parse_ulong(const char *str)
{
    long v = 0;
    if (str == NULL || *str == '\0')
        return -1;
    for (; *str; str++) {
        if (*str < '0' || *str > '9' || v > (0x7fffffffL - 9) / 10)
            return -1;
        v = v * 10 + (*str - '0');
    }
    return v;
}

/* Write decimal V into BUF (at least 24 bytes); returns BUF. */
static inline char *eg_format_ulong(char *buf, unsigned long v)
{
    char tmp[24];
    int i = 0, j = 0;
    do {
        tmp[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (i)
        buf[j++] = tmp[--i];
    buf[j] = '\0';
    return buf;
}

/*
 * Is FD still the session's inherited socket? It must be an AF_UNIX SOCK_DGRAM socket and, when
 * ID ("<fd>:<inode>", from EXECGATE_SOCKET_ID) names this fd, the same socket inode: a program
 * may close the fd (CPython's subprocess does by default) and reuse the number for its own
 * datagram socket (syslog), which must never receive a handshake.
 */
static inline int eg_socket_fd_valid(int fd, const char *id)
{
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    struct stat st;
    if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM)
        return 0;
    len = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
        return 0;
    if (id != NULL && *id != '\0') {
        const char *colon = strchr(id, ':');
        char fdpart[24];
        if (colon == NULL || (size_t)(colon - id) >= sizeof fdpart)
            return 1; /* malformed id: the type checks above decide */
        memcpy(fdpart, id, (size_t)(colon - id));
        fdpart[colon - id] = '\0';
        if (eg_parse_ulong(fdpart) == fd) {
            long ino = eg_parse_ulong(colon + 1);
            if (fstat(fd, &st) != 0 || ino < 0 || (unsigned long)st.st_ino != (unsigned long)ino)
                return 0;
        }
    }
    return 1;
}

/* Write the NULL-terminated list of strings to fd 2 with raw write(2); errors are ignored. */
static inline void eg_write_err(const char *const parts[])
{
    char line[1024];
    size_t n = 0;
    int saved = errno;
    for (; *parts && n < sizeof line - 1; parts++) {
        size_t k = strlen(*parts);
        if (k > sizeof line - 1 - n)
            k = sizeof line - 1 - n;
        memcpy(line + n, *parts, k);
        n += k;
    }
    line[n++] = '\n';
    while (n > 0) {
        ssize_t w = write(2, line, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        memmove(line, line + w, n - (size_t)w);
        n -= (size_t)w;
    }
    errno = saved;
}

#endif /* EXECGATE_H */
