/*
 * request.h — the client side of the escalation protocol's first two steps, shared by the native
 * wrapper (wrapper.c) and the preload shim's cached-only query (preload.c): the handshake on the
 * inherited datagram socket and the request frame's JSON (server/protocol.py, docs/DESIGN.md §2).
 *
 * Why one place: the wrapper and the shim must send byte-for-byte the same request (the server
 * identifies the caller's file and matches its cache on it), and the shim runs where the wrapper
 * may use the heap but the shim may not (a vfork child: no malloc, no stdio, no locks).
 * Everything here writes through a caller-supplied sink and calls only system calls.
 *
 * Encoding (the protocol module doc): JSON strings of UTF-8; a byte that is not part of a valid
 * UTF-8 sequence (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF) is written as
 * the lone surrogate escape \udcXX (Python's "surrogateescape", PEP 383), which the server maps
 * back to the same byte.
 */
#ifndef EXECGATE_REQUEST_H
#define EXECGATE_REQUEST_H

#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "execgate.h"

/* eg_request_json's CACHED_ONLY: a full request, or the cached-only query for an exec by the
 * caller itself or by a child it spawns (server/protocol.py). */
#define EG_QUERY_NONE 0
#define EG_QUERY_SELF 1
#define EG_QUERY_CHILD 2

/* A sink for JSON text: PUT(CTX, S, N) appends the N bytes at S. */
typedef void (*eg_put_fn)(void *ctx, const char *s, size_t n);

/* Length of the valid UTF-8 sequence at S (N bytes left), or 0 (RFC 3629, no surrogates). */
static inline size_t eg_utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return (n >= 3 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return (n >= 4 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 &&
                (s[3] & 0xC0) == 0x80)
                   ? 4
                   : 0;
    }
    return 0;
}

/* Write STR (N bytes) as a JSON string. */
static inline void eg_json_string(eg_put_fn put, void *ctx, const char *str, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    char esc[8];
    put(ctx, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k;
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            put(ctx, esc, 2);
            i++;
        } else if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                              : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (named) {
                put(ctx, named, 2);
            } else {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
                put(ctx, esc, 6);
            }
            i++;
        } else if ((k = eg_utf8_len(s + i, n - i)) > 0) {
            /* a run of plain bytes goes out in one piece */
            size_t j = i + k;
            while (j < n && s[j] >= 0x20 && s[j] < 0x80 && s[j] != '"' && s[j] != '\\')
                j++;
            put(ctx, (const char *)s + i, j - i);
            i = j;
        } else {
            memcpy(esc, "\\udc", 4);
            esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
            put(ctx, esc, 6);
            i++;
        }
    }
    put(ctx, "\"", 1);
}

static inline void eg_put_str(eg_put_fn put, void *ctx, const char *s)
{
    put(ctx, s, strlen(s));
}

/* An entry of ENVP the request leaves out: no '=', an empty name, a Codex overlay variable
 * (CODEX_ESCALATE_SOCKET, EXEC_WRAPPER: server/protocol.py REQUEST_ENV_EXCLUDED), or a name an
 * earlier entry already had (the first is the one getenv sees). */
static inline int eg_request_skips(char *const envp[], size_t i)
{
    const char *e = envp[i], *eq = strchr(e, '=');
    if (eq == NULL || eq == e || eg_env_is(e, EG_ENV_SOCKET) || eg_env_is(e, EG_ENV_WRAPPER))
        return 1;
    for (size_t j = 0; j < i; j++)
        if (strncmp(envp[j], e, (size_t)(eq - e + 1)) == 0)
            return 1;
    return 0;
}

/*
 * The request's JSON: {"file":F,"argv":[...],"workdir":W,"env":{...}} in the field order of the
 * Codex request, then "execgate_target_fd":true when the target's fd rides on the frame (WITH_FD)
 * and "execgate_cached_only":true for the shim's cached-only query (CACHED_ONLY: EG_QUERY_SELF,
 * or EG_QUERY_CHILD adding "execgate_cached_for_child":true; EG_QUERY_NONE for a request). ENVP
 * NULL: an empty "env" (the cached-only query: a cached answer never depends on it).
 */
static inline void eg_request_json(eg_put_fn put, void *ctx, const char *file, char *const argv[],
                                   const char *cwd, char *const envp[], int with_fd, int cached_only)
{
    eg_put_str(put, ctx, "{\"file\":");
    eg_json_string(put, ctx, file, strlen(file));
    eg_put_str(put, ctx, ",\"argv\":[");
    for (size_t i = 0; argv[i] != NULL; i++) {
        if (i)
            put(ctx, ",", 1);
        eg_json_string(put, ctx, argv[i], strlen(argv[i]));
    }
    eg_put_str(put, ctx, "],\"workdir\":");
    eg_json_string(put, ctx, cwd, strlen(cwd));
    eg_put_str(put, ctx, ",\"env\":{");
    int first = 1;
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *e = envp[i], *eq;
        if (eg_request_skips(envp, i))
            continue;
        eq = strchr(e, '=');
        if (!first)
            put(ctx, ",", 1);
        first = 0;
        eg_json_string(put, ctx, e, (size_t)(eq - e));
        put(ctx, ":", 1);
        eg_json_string(put, ctx, eq + 1, strlen(eq + 1));
    }
    put(ctx, "}", 1);
    if (with_fd)
        eg_put_str(put, ctx, ",\"execgate_target_fd\":true");
    if (cached_only != EG_QUERY_NONE)
        eg_put_str(put, ctx, ",\"execgate_cached_only\":true");
    if (cached_only == EG_QUERY_CHILD)
        eg_put_str(put, ctx, ",\"execgate_cached_for_child\":true");
    put(ctx, "}", 1);
}

/* Handshake on the inherited datagram socket DGRAM: a fresh SOCK_STREAM socketpair, one end sent
 * with the one-byte payload "\0" (SCM_RIGHTS, unix(7)). Returns our stream end (close-on-exec)
 * or -1 with errno set. */
static inline int eg_handshake(int dgram)
{
    int sv[2];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    char byte = 0;
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    ssize_t w;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    memset(&ctl, 0, sizeof ctl);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &sv[1], sizeof(int));
    do
        w = sendmsg(dgram, &msg, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    int err = errno;
    close(sv[1]);
    if (w != 1) {
        close(sv[0]);
        errno = w < 0 ? err : EIO;
        return -1;
    }
    return sv[0];
}

/* One recvmsg of at most N bytes into P from stream FD, EINTR retried; every fd that rides along
 * is closed (the server sends none; a peer's must not pile up). Returns recvmsg's result. */
static inline ssize_t eg_recv_some(int fd, char *p, size_t n)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 16)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {p, n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    ssize_t r;
    do
        r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *c = r >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c != NULL; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++)
                close(((int *)CMSG_DATA(c))[k]);
    return r;
}

#endif /* EXECGATE_REQUEST_H */
