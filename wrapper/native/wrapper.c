/*
 * wrapper.c — execgate's native execve wrapper: `execgate-wrapper-native FILE ARGV0 ARGV1 ...`.
 *
 * What: the client side of the Codex shell-escalation protocol (docs/DESIGN.md §2), the same as the
 * Python reference client wrapper/client.py. It asks the escalation server about one exec and
 * enforces the answer:
 *   handshake  datagram b"\0" + SCM_RIGHTS(fresh SOCK_STREAM socketpair end) on the inherited
 *              CODEX_ESCALATE_SOCKET, or, when that fd is gone, connect to EXECGATE_SOCKET_PATH;
 *   request    frame {"file","argv","workdir","env"} (env minus the two overlay variables),
 *              with the target opened O_PATH attached and "execgate_target_fd":true (execgate
 *              extension: the server judges that very file);
 *   Run        execveat(target, "", AT_EMPTY_PATH) in place by the raw syscall (never
 *              re-intercepted by the preload shim; a "#!" script by path, if it still names the
 *              target), inherited socket kept so that the program's children are gated too;
 *   Escalate   frame {"fds":[0,1,2]} with duplicates of 0,1,2 on its first byte, wait for
 *              {"exit_code":N}, exit N; with "execgate_signals": true, forward SIGINT, SIGTERM,
 *              SIGHUP and SIGQUIT as frames {"signal":N};
 *   Deny       "Execution denied: <reason>" on stderr, exit 1.
 * A frame is a 4-byte little-endian length and compact UTF-8 JSON.
 *
 * Why native: it runs once per exec of every sandboxed process; a C program starts in about a
 * millisecond, the Python client in tens.
 *
 * Limits: strings are sent as JSON; bytes that are not valid UTF-8 (in argv, env, paths) are
 * escaped as lone surrogates \udc80..\udcff, Python's "surrogateescape" convention, which a Python
 * server decodes back to the same bytes with os.fsencode(); a strict UTF-8 peer (serde) rejects
 * such a request, and the exec then fails closed. Environment entries without '=' are not sent;
 * for a repeated name the first entry (the one getenv sees) is sent. Any failure prints one line
 * "execgate-wrapper: ..." on stderr and exits non-zero (126; 127 when a Run's file is missing);
 * the program never runs unchecked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "execgate.h"
#include "request.h"

#define MAX_FRAME_BYTES EG_MAX_FRAME_BYTES
#define EXIT_FAILURE_GATE 126
#define EXIT_DENIED 1
#define JSON_MAX_DEPTH 64

extern char **environ;

static void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int code, const char *fmt, ...)
{
    va_list ap;
    char line[1024];
    int n = snprintf(line, sizeof line, "execgate-wrapper: ");
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
    exit(code);
}

/* ---- growable byte buffer ------------------------------------------------------------------- */

struct buf {
    char *p;
    size_t len, cap;
};

static void buf_put(struct buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (b->p == NULL)
            die(EXIT_FAILURE_GATE, "out of memory");
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* ---- JSON encoding: request.h, into a growable buffer ------------------------------------- */

static void buf_sink(void *ctx, const char *s, size_t n)
{
    buf_put((struct buf *)ctx, s, n);
}

/* The request (request.h eg_request_json) for FILE, with this process's environment. */
static void build_request(struct buf *b, const char *file, char *const argv[], const char *cwd,
                          int with_fd)
{
    eg_request_json(buf_sink, b, file, argv, cwd, environ, with_fd, EG_QUERY_NONE);
}

/* ---- JSON decoding: a small strict parser; unknown fields are kept and ignored ------------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
    enum jtype t;
    int b;               /* J_BOOL */
    int is_int;          /* J_NUM: an integer that fits in long long */
    long long i;         /* J_NUM */
    char *s;             /* J_STR: decoded, NUL-terminated */
    char *key;           /* member name when inside an object */
    struct jv *kids, *next;
};

struct jp {
    const char *p, *end;
};

static void jskip(struct jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int jhex4(struct jp *j, unsigned *out)
{
    unsigned v = 0;
    if (j->end - j->p < 4)
        return -1;
    for (int k = 0; k < 4; k++) {
        char c = *j->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(struct buf *b, unsigned cp)
{
    char u[4];
    if (cp < 0x80) {
        u[0] = (char)cp;
        buf_put(b, u, 1);
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
        buf_put(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63));
        u[2] = (char)(0x80 | (cp & 63));
        buf_put(b, u, 3);
    } else {
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63));
        u[2] = (char)(0x80 | ((cp >> 6) & 63)), u[3] = (char)(0x80 | (cp & 63));
        buf_put(b, u, 4);
    }
}

/* Parse a string at j->p (on the opening quote); returns a malloc'd decoded string or NULL. */
static char *jstring(struct jp *j)
{
    struct buf b = {0};
    buf_put(&b, "", 0);
    j->p++;
    while (j->p < j->end) {
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            return b.p;
        if (c < 0x20)
            break;
        if (c != '\\') {
            buf_put(&b, &c, 1);
            continue;
        }
        if (j->p >= j->end)
            break;
        c = (unsigned char)*j->p++;
        const char *simple = strchr("\"\\/bfnrt", c);
        if (c != 'u' && simple != NULL && c != '\0') {
            static const char map[] = "\"\\/\b\f\n\r\t";
            buf_put(&b, &map[simple - "\"\\/bfnrt"], 1);
        } else if (c == 'u') {
            unsigned cp, lo;
            if (jhex4(j, &cp) != 0)
                break;
            if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' &&
                j->p[1] == 'u') {
                const char *save = j->p;
                j->p += 2;
                if (jhex4(j, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    j->p = save;
            }
            put_utf8(&b, cp);
        } else {
            break;
        }
    }
    free(b.p);
    return NULL;
}

static struct jv *jvalue(struct jp *j, int depth);

static struct jv *jnew(enum jtype t)
{
    struct jv *v = calloc(1, sizeof *v);
    if (v == NULL)
        die(EXIT_FAILURE_GATE, "out of memory");
    v->t = t;
    return v;
}

static struct jv *jnumber(struct jp *j)
{
    const char *start = j->p;
    int is_int = 1;
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return NULL;
    if (*j->p == '0')
        j->p++;
    else
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    if (j->p < j->end && *j->p == '.') {
        is_int = 0;
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return NULL;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        is_int = 0;
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return NULL;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    struct jv *v = jnew(J_NUM);
    if (is_int) {
        char tmp[32];
        size_t n = (size_t)(j->p - start);
        if (n < sizeof tmp) {
            memcpy(tmp, start, n);
            tmp[n] = '\0';
            errno = 0;
            v->i = strtoll(tmp, NULL, 10);
            v->is_int = errno == 0;
        }
    }
    return v;
}

static int jliteral(struct jp *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return 0;
    j->p += n;
    return 1;
}

/* Members of an array or object; CLOSE is ']' or '}'. */
static struct jv *jcontainer(struct jp *j, int depth, enum jtype t, char close)
{
    struct jv *v = jnew(t), **tail = &v->kids;
    j->p++;
    jskip(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        jskip(j);
        if (t == J_OBJ) {
            if (j->p >= j->end || *j->p != '"' || (key = jstring(j)) == NULL)
                return NULL;
            jskip(j);
            if (j->p >= j->end || *j->p++ != ':')
                return NULL;
        }
        struct jv *kid = jvalue(j, depth + 1);
        if (kid == NULL)
            return NULL;
        kid->key = key;
        *tail = kid;
        tail = &kid->next;
        jskip(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return v;
        }
        return NULL;
    }
}

/* Parse one value; NULL on any syntax error (the process exits soon: nodes are not freed). */
static struct jv *jvalue(struct jp *j, int depth)
{
    struct jv *v;
    if (depth > JSON_MAX_DEPTH)
        return NULL;
    jskip(j);
    if (j->p >= j->end)
        return NULL;
    switch (*j->p) {
    case '{':
        return jcontainer(j, depth, J_OBJ, '}');
    case '[':
        return jcontainer(j, depth, J_ARR, ']');
    case '"':
        v = jnew(J_STR);
        return (v->s = jstring(j)) ? v : NULL;
    case 't':
    case 'f':
        v = jnew(J_BOOL);
        v->b = *j->p == 't';
        return jliteral(j, v->b ? "true" : "false") ? v : NULL;
    case 'n':
        return jliteral(j, "null") ? jnew(J_NULL) : NULL;
    default:
        return jnumber(j);
    }
}

static struct jv *jparse(const char *text, size_t n)
{
    struct jp j = {text, text + n};
    struct jv *v = jvalue(&j, 0);
    jskip(&j);
    return (v != NULL && j.p == j.end) ? v : NULL;
}

/* Member KEY of object V (the last one if repeated, as serde_json and Python keep), or NULL. */
static struct jv *jget(const struct jv *v, const char *key)
{
    struct jv *found = NULL;
    if (v == NULL || v->t != J_OBJ)
        return NULL;
    for (struct jv *k = v->kids; k != NULL; k = k->next)
        if (strcmp(k->key, key) == 0)
            found = k;
    return found;
}

/* ---- socket I/O ----------------------------------------------------------------------------- */

/* Send all of P, with FDS attached to the first byte when NFDS > 0. */
static void send_all(int fd, const char *p, size_t n, const int *fds, int nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } ctl;
    while (n > 0) {
        struct iovec iov = {(void *)p, n};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nfds > 0) {
            memset(&ctl, 0, sizeof ctl);
            msg.msg_control = ctl.buf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            die(EXIT_FAILURE_GATE, "cannot send to the escalation server: %s", strerror(errno));
        nfds = 0;
        p += w;
        n -= (size_t)w;
    }
}

static void send_frame(int fd, const char *json, size_t n, const int *fds, int nfds)
{
    struct buf b = {0};
    unsigned char len[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                            (unsigned char)(n >> 24)};
    if (n > MAX_FRAME_BYTES)
        die(EXIT_FAILURE_GATE, "request of %zu bytes exceeds the %u-byte frame limit", n,
            MAX_FRAME_BYTES);
    buf_put(&b, len, 4);
    buf_put(&b, json, n);
    send_all(fd, b.p, b.len, fds, nfds);
    free(b.p);
}

/* Read exactly N bytes with recvmsg (fds may ride on any frame's first byte: close them).
 * Returns 0, or -1 on EOF before the first byte. */
static int recv_exact(int fd, char *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = eg_recv_some(fd, p + got, n - got);
        if (r < 0)
            die(EXIT_FAILURE_GATE, "cannot read from the escalation server: %s", strerror(errno));
        if (r == 0) {
            if (got == 0)
                return -1;
            die(EXIT_FAILURE_GATE, "the escalation server closed the connection mid-frame");
        }
        got += (size_t)r;
    }
    return 0;
}

/* Read one frame and parse its JSON; exits on EOF or a broken frame. */
static struct jv *recv_json(int fd, const char *waiting_for)
{
    unsigned char h[4];
    if (recv_exact(fd, (char *)h, 4) != 0)
        die(EXIT_FAILURE_GATE, "the escalation server closed the connection before %s",
            waiting_for);
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    if (n > MAX_FRAME_BYTES)
        die(EXIT_FAILURE_GATE, "frame of %u bytes from the escalation server exceeds the limit", n);
    char *payload = malloc((size_t)n + 1);
    if (payload == NULL)
        die(EXIT_FAILURE_GATE, "out of memory");
    if (n > 0 && recv_exact(fd, payload, n) != 0)
        die(EXIT_FAILURE_GATE, "the escalation server closed the connection mid-frame");
    struct jv *v = jparse(payload, n);
    if (v == NULL || v->t != J_OBJ)
        die(EXIT_FAILURE_GATE, "broken answer from the escalation server (not a JSON object)");
    free(payload);
    return v;
}

/* ---- connecting ----------------------------------------------------------------------------- */

static int connect_path(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int fd;
    if (strlen(path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    while (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (errno == EINTR)
            continue;
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* A stream to the server: the inherited socket if it is still ours, else the fallback path. */
static int connect_server(void)
{
    const char *sock = getenv(EG_ENV_SOCKET), *path = getenv(EG_ENV_SOCKET_PATH);
    long fd = eg_parse_ulong(sock);
    char why[160] = "";
    if (fd >= 0 && eg_socket_fd_valid((int)fd, getenv(EG_ENV_SOCKET_ID))) {
        int s = eg_handshake((int)fd);
        if (s >= 0)
            return s;
        snprintf(why, sizeof why, "handshake on fd %ld failed: %s", fd, strerror(errno));
    } else if (sock != NULL) {
        snprintf(why, sizeof why, "%s=%s is not the session's socket any more", EG_ENV_SOCKET,
                 sock);
    } else {
        snprintf(why, sizeof why, "%s is not set", EG_ENV_SOCKET);
    }
    if (path != NULL && *path != '\0') {
        int s = connect_path(path);
        if (s >= 0)
            return s;
        die(EXIT_FAILURE_GATE, "cannot reach the escalation server: %s; connect to %s: %s", why,
            path, strerror(errno));
    }
    die(EXIT_FAILURE_GATE, "cannot reach the escalation server: %s and %s is not set", why,
        EG_ENV_SOCKET_PATH);
}

/* ---- the three outcomes --------------------------------------------------------------------- */

/* 1 if open file FD is a regular file starting with "#!" (read through a new open of
 * /proc/self/fd/FD, proc(5): an O_PATH fd cannot be read), else 0 (also when that cannot be read:
 * an interpreter could not read it either). Never opens anything but a regular file. */
static int is_script(int fd)
{
    struct stat st;
    char path[64], magic[2];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int r = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (r < 0)
        return 0;
    ssize_t n = pread(r, magic, sizeof magic, 0);
    close(r);
    return n == 2 && magic[0] == '#' && magic[1] == '!';
}

/* execve FILE by path, but only if it still names the file open on FD (same device and inode). */
static void exec_path_if_same(const char *file, char *const argv[], int fd)
{
    struct stat a, b;
    if (fstat(fd, &a) != 0 || stat(file, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        die(EXIT_FAILURE_GATE, "cannot execute %s: it names another file now than the one approved",
            file);
    syscall(SYS_execve, file, argv, environ);
}

/* Run: execute the very file the server judged. TARGET is the O_PATH fd sent with the request
 * (close-on-exec), or -1 when FILE could not be opened (then by path, to get execve's own error).
 * By raw syscalls: a preloaded shim must not turn this exec into another wrapper run.
 * execveat(TARGET, "", ..., AT_EMPTY_PATH) (execveat(2)); a "#!" script is executed by path
 * instead, after checking the path still names TARGET's file, since the kernel would hand the
 * interpreter "/dev/fd/N" of a close-on-exec fd, gone by then (execveat(2): ENOENT). */
static void run_in_place(const char *file, char *const argv[], int target)
{
    if (target >= 0 && is_script(target))
        exec_path_if_same(file, argv, target);
    else if (target >= 0) {
        syscall(SYS_execveat, target, "", argv, environ, AT_EMPTY_PATH);
        if (errno == ENOENT) /* a script we could not read here: as above */
            exec_path_if_same(file, argv, target);
    } else
        syscall(SYS_execve, file, argv, environ);
    int err = errno;
    die(err == ENOENT ? 127 : EXIT_FAILURE_GATE, "cannot execute %s: %s", file, strerror(err));
}

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t ignored = write(sig_pipe[1], &b, 1);
    (void)ignored;
    errno = saved;
}

static void forward_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction sa;
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        die(EXIT_FAILURE_GATE, "pipe: %s", strerror(errno));
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        /* A signal ignored on entry stays ignored (POSIX: background jobs ignore SIGINT/SIGQUIT). */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

static int dup_std(int fd)
{
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0)
        d = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (d < 0)
        die(EXIT_FAILURE_GATE, "cannot duplicate fd %d: %s", fd, strerror(errno));
    return d;
}

static void escalate(int stream, int signals)
{
    static const char msg[] = "{\"fds\":[0,1,2]}";
    int fds[3] = {dup_std(0), dup_std(1), dup_std(2)};
    /* Handlers only queue signals in a pipe, read after the fds frame is out: a signal frame
     * never precedes it, and a signal arriving meanwhile is not lost. */
    if (signals)
        forward_signals();
    send_frame(stream, msg, sizeof msg - 1, fds, 3);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    for (;;) {
        struct pollfd p[2] = {{stream, POLLIN, 0}, {sig_pipe[0], POLLIN, 0}};
        int n = poll(p, signals ? 2 : 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die(EXIT_FAILURE_GATE, "poll: %s", strerror(errno));
        if (signals && (p[1].revents & POLLIN)) {
            unsigned char sigs[16];
            ssize_t r = read(sig_pipe[0], sigs, sizeof sigs);
            for (ssize_t k = 0; k < r; k++) {
                char frame[32];
                int len = snprintf(frame, sizeof frame, "{\"signal\":%d}", sigs[k]);
                send_frame(stream, frame, (size_t)len, NULL, 0);
            }
        }
        if (p[0].revents) {
            struct jv *res = recv_json(stream, "the escalated command ended");
            struct jv *code = jget(res, "exit_code");
            if (code == NULL || code->t != J_NUM || !code->is_int)
                die(EXIT_FAILURE_GATE, "broken answer from the escalation server (no exit_code)");
            exit((int)(code->i & 0xff));
        }
    }
}

int main(int argc, char *argv[])
{
    const char *file;
    char cwd[PATH_MAX];
    struct buf req = {0};
    long depth = eg_parse_ulong(getenv(EG_ENV_DEPTH));
    long max_depth = eg_parse_ulong(getenv(EG_ENV_MAX_DEPTH));

    /* The marker is for this process only; the program must be gated again. */
    unsetenv(EG_ENV_IN_WRAPPER);
    if (argc < 2)
        die(2, "usage: execgate-wrapper-native FILE [ARGV0 ARGV1 ...]");
    file = argv[1];
    if (depth > (max_depth < 0 ? EG_DEFAULT_MAX_DEPTH : max_depth)) {
        fprintf(stderr, "%s: execgate exec depth limit reached\n", "Execution denied");
        return EXIT_DENIED;
    }
    if (getcwd(cwd, sizeof cwd) == NULL)
        die(EXIT_FAILURE_GATE, "cannot determine the working directory: %s", strerror(errno));

    int stream = connect_server();
    /* The target, opened in our own view as execve would resolve it (symlinks followed); the
     * server identifies this very file and Run executes it (execgate extension, DESIGN.md §2). */
    int target = open(file, O_PATH | O_CLOEXEC);
    build_request(&req, file, argv + 2, cwd, target >= 0);
    send_frame(stream, req.p, req.len, target >= 0 ? &target : NULL, target >= 0 ? 1 : 0);
    free(req.p);

    struct jv *resp = recv_json(stream, "answering");
    struct jv *action = jget(resp, "action");
    if (action != NULL && action->t == J_STR && strcmp(action->s, "Run") == 0) {
        close(stream);
        run_in_place(file, argv + 2, target);
    }
    if (action != NULL && action->t == J_STR && strcmp(action->s, "Escalate") == 0) {
        struct jv *sig = jget(resp, "execgate_signals");
        escalate(stream, sig != NULL && sig->t == J_BOOL && sig->b);
    }
    struct jv *deny = jget(action, "Deny");
    if (deny != NULL && deny->t == J_OBJ) {
        struct jv *reason = jget(deny, "reason");
        if (reason != NULL && reason->t == J_STR && reason->s[0] != '\0')
            fprintf(stderr, "Execution denied: %s\n", reason->s);
        else if (reason == NULL || reason->t == J_NULL || reason->t == J_STR)
            fprintf(stderr, "Execution denied\n");
        else
            die(EXIT_FAILURE_GATE, "broken answer from the escalation server (Deny.reason)");
        return EXIT_DENIED;
    }
    die(EXIT_FAILURE_GATE, "broken answer from the escalation server (unknown action)");
}
