/*
 * preload.c — execgate's LD_PRELOAD shim: every exec-family call and posix_spawn/posix_spawnp of a
 * dynamically linked process becomes an exec of the session's execve wrapper (EXEC_WRAPPER) with
 * argv [WRAPPER, RESOLVED_FILE, ARGV0, ARGV1, ...], exactly as a shell patched for Codex's
 * shell-escalation protocol would do (docs/DESIGN.md §2, §6). The wrapper asks the escalation server
 * and runs, escalates or denies the program.
 *
 * Why a shim: stock shells (bash, dash, zsh), make, xargs, find, Python and Perl call libc's exec
 * functions; interposing them gates every launcher without patching any of them.
 *
 * How:
 *  - A constructor captures execgate's variables at load into static buffers. Every exec and spawn
 *    hands on the caller's environment with CODEX_ESCALATE_SOCKET, EXEC_WRAPPER,
 *    EXECGATE_SOCKET_PATH, EXECGATE_SOCKET_ID and EXECGATE_MAX_DEPTH exactly as captured: a value
 *    the caller changed is replaced, one it dropped (env -i, subprocess.run(env={})) is put back,
 *    one that was absent at load is removed. LD_PRELOAD names this library first; EXECGATE_DEPTH
 *    is the shim's own count; EXECGATE_IN_WRAPPER is set only for the wrapper. Which wrapper runs
 *    and what counts as the wrapper's own exec come only from the captured values; the environment
 *    is never read again on the exec path (except PATH, for the search, as libc does).
 *  - Chain of trust: the session's shell is started by the server (which does not load the shim)
 *    with the session's true overlay; each shim captures at load and forces its values onto its
 *    children, so no process can hand its children another wrapper or another server socket
 *    (`EXEC_WRAPPER=/usr/bin/whoami bash -c whoami` or `EXECGATE_SOCKET_PATH=/tmp/fake.sock cmd`
 *    change nothing). Consequence: an execgate session started inside a gated session is gated
 *    by the outer one — the inner server's shell and everything it runs ask the outer server —
 *    which is intended: otherwise an inner `execgate run` with permissive rules would escape the
 *    outer gate's denials.
 *  - PATH search, the ENOEXEC fallback to /bin/sh and every errno follow glibc's execvpe and
 *    posix_spawnp; the shim checks existence, file type and X_OK (and a #! interpreter's existence)
 *    before handing over, so a caller sees ENOENT/EACCES/ENOEXEC exactly as without execgate.
 *  - The wrapper process gets EXECGATE_IN_WRAPPER=1; the shim loaded in it removes the variable at
 *    load and, if this process is the captured wrapper (its /proc/self/exe, or the script in its
 *    argv, is the EXEC_WRAPPER file), passes that process's own exec straight to the kernel, so the final exec of the
 *    program is never intercepted again (the native wrapper also uses the raw syscall). An exec of
 *    the captured EXEC_WRAPPER itself (a Codex-patched shell) is likewise not wrapped twice; it
 *    gets the forced environment too, so that wrapper asks the session's server.
 *  - Answered execs run here (docs/DESIGN.md §9, server/protocol.py "Cached-only query"): with
 *    EXECGATE_CACHED_QUERY=1 captured at load, an exec that passes the checks first asks the
 *    server from this process (eg_cached_run) for a Run given without a prompt (a cache hit, or
 *    the in-process service's rules) and, on Run, executes the target here — no second exec of
 *    the wrapper. Anything else falls back to the wrapper. Where the session's seccomp backstop
 *    stops every exec anyway (EXECGATE_BACKSTOP_QUERY captured), the exec itself is the query
 *    (eg_backstop_run): no socket work at all for an answered exec.
 *  - EXECGATE_DEPTH counts gated execs along the ancestry; past EXECGATE_MAX_DEPTH the exec is
 *    refused, so a misconfiguration loops into a denial, never a fork bomb.
 *  - The exec path may run in a vfork child (CPython's subprocess): no heap, no stdio, no locks;
 *    only stack buffers (variable-length arrays, as glibc's execl does), static data captured at
 *    load and raw write(2) for messages.
 *
 * Limits (see README.md beside this file): statically linked and setuid/setgid programs do not load
 * the shim (the exec *of* them is decided, what they exec is not); libc-internal spawns bypass
 * symbol interposition: the /bin/sh -c that glibc's system(), popen() and wordexp() start is not
 * decided. system() and popen() are interposed to force the session's variables back into the
 * caller's environ first, so that shell loads the shim with the session's values and its execs
 * are decided; wordexp() is not interposed (its shell's execs are decided only while the
 * caller's environ keeps the shim in LD_PRELOAD and the session's EXEC_WRAPPER). A lookup on
 * libc's own handle (dlsym(dlopen("libc.so.6"), ...)) skips the shim. EXECGATE_IN_WRAPPER turns
 * on passthrough only in the wrapper process itself (eg_is_wrapper_process). Raw execve
 * syscalls are not seen. Posix_spawn file actions that change directory
 * (posix_spawn_file_actions_addchdir_np) make the pre-checks run against the parent's directory.
 * A file format registered through binfmt_misc disables the ENOEXEC pre-check (the kernel decides).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h> /* snprintf at load time only */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "execgate.h"
#include "request.h"

extern char **environ;

typedef int (*eg_spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                           const posix_spawnattr_t *, char *const[], char *const[]);

#define EG_SAVED_MAX 16
/* eg_try's result when the exec was refused outright (no wrapper, depth limit): a PATH search
 * stops there instead of trying (and reporting) every further candidate. */
#define EG_STOP (-2)

static int eg_ready;                   /* eg_init() has run */
static int eg_passthrough;             /* this process is the wrapper: do not gate again */
static char eg_wrapper[PATH_MAX];      /* EXEC_WRAPPER; "" when not configured */
static struct stat eg_wrapper_st;      /* identity of EXEC_WRAPPER */
static int eg_wrapper_st_ok;
static char eg_self[PATH_MAX];         /* path of this library, as loaded */
static char eg_preload_entry[PATH_MAX + 16]; /* "LD_PRELOAD=<eg_self>" */
static char eg_depth_entry[48];        /* "EXECGATE_DEPTH=<depth + 1>" */
static long eg_depth, eg_max_depth;
static int eg_binfmt_misc = -1;        /* binfmt_misc has registered formats; -1: not looked yet */
static char eg_pool[16384];            /* storage of eg_saved and eg_forced */
static const char *eg_saved[EG_SAVED_MAX]; /* other EXECGATE_* entries, restored where missing */
static int eg_nsaved;
/* The variables that decide which wrapper runs and which server it asks: every exec gets exactly
 * the values captured at load (or none, if there was none at load), whatever the caller set. */
static const char *const eg_forced_names[] = {EG_ENV_SOCKET, EG_ENV_WRAPPER, EG_ENV_SOCKET_PATH,
                                              EG_ENV_SOCKET_ID, EG_ENV_MAX_DEPTH,
                                              EG_ENV_BACKSTOP_QUERY};
#define EG_NFORCED ((int)(sizeof eg_forced_names / sizeof eg_forced_names[0]))
static const char *eg_forced[EG_NFORCED]; /* "NAME=value" as captured at load, or NULL */
static eg_spawn_fn eg_real_posix_spawn;
static char eg_in_wrapper_entry[] = EG_ENV_IN_WRAPPER "=1";
static int eg_cached_query;            /* EXECGATE_CACHED_QUERY=1 at load: ask the cache first */
static long eg_sock_fd = -1;           /* CODEX_ESCALATE_SOCKET as captured */
static long eg_backstop_token = -1;    /* EXECGATE_BACKSTOP_QUERY as captured: query by exec */
static const char *eg_sock_id;         /* EXECGATE_SOCKET_ID's value as captured, or NULL */

/* ---- load-time capture (not on the exec path: may use libc freely) ------------------------- */

/* A copy of ENTRY in eg_pool, or NULL when the pool is full. */
static const char *eg_store(const char *entry)
{
    static size_t used;
    size_t n = strlen(entry) + 1;
    char *at = eg_pool + used;
    if (n > sizeof eg_pool - used)
        return NULL;
    memcpy(at, entry, n);
    used += n;
    return at;
}

static void eg_save(const char *entry)
{
    const char *copy;
    if (eg_nsaved < EG_SAVED_MAX && (copy = eg_store(entry)) != NULL)
        eg_saved[eg_nsaved++] = copy;
}

/* Index of ENTRY's name in eg_forced_names, or -1. */
static int eg_forced_index(const char *entry)
{
    for (int k = 0; k < EG_NFORCED; k++)
        if (eg_env_is(entry, eg_forced_names[k]))
            return k;
    return -1;
}

/* Capture NAME=value for forced slot K (a value that does not fit counts as none). */
static void eg_force(int k, const char *entry)
{
    eg_forced[k] = eg_store(entry);
}

static int eg_is_saved_name(const char *entry)
{
    if (eg_env_is(entry, EG_ENV_DEPTH) || eg_env_is(entry, EG_ENV_IN_WRAPPER) ||
        eg_forced_index(entry) >= 0)
        return 0;
    return strncmp(entry, EG_ENV_PREFIX, sizeof EG_ENV_PREFIX - 1) == 0;
}

/* "<fd>:<inode>" of the inherited socket, so that a reused fd number is recognised later. */
static void eg_capture_socket_id(int k)
{
    const char *id = getenv(EG_ENV_SOCKET_ID);
    long fd = eg_parse_ulong(getenv(EG_ENV_SOCKET));
    char entry[96], num[24];
    struct stat st;
    if (id != NULL) {
        const char *colon = strchr(id, ':');
        char fdpart[24];
        size_t n = colon ? (size_t)(colon - id) : 0;
        if (colon && n < sizeof fdpart) {
            memcpy(fdpart, id, n);
            fdpart[n] = '\0';
            if (eg_parse_ulong(fdpart) == fd || fd < 0) {
                if (strlen(id) < sizeof entry - sizeof EG_ENV_SOCKET_ID - 1) {
                    snprintf(entry, sizeof entry, "%s=%s", EG_ENV_SOCKET_ID, id);
                    eg_force(k, entry);
                }
                return;
            }
        }
    }
    if (fd < 0 || !eg_socket_fd_valid((int)fd, NULL) || fstat((int)fd, &st) != 0)
        return;
    snprintf(entry, sizeof entry, "%s=%ld:%s", EG_ENV_SOCKET_ID, fd,
             eg_format_ulong(num, (unsigned long)st.st_ino));
    eg_force(k, entry);
}

/* Does binfmt_misc know formats beyond the kernel's own (then the kernel, not us, says ENOEXEC)? */
static int eg_detect_binfmt_misc(void)
{
    char buf[4096];
    int found = 0;
    int fd = open("/proc/sys/fs/binfmt_misc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    long n;
    if (fd < 0)
        return 0;
    while (!found && (n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..") &&
                strcmp(d->d_name, "register") && strcmp(d->d_name, "status"))
                found = 1;
            off += d->d_reclen;
        }
    }
    close(fd);
    return found;
}

/* Is PATH the file of the captured EXEC_WRAPPER (same device and inode)? */
static int eg_same_as_wrapper(const char *path)
{
    struct stat st;
    return eg_wrapper_st_ok && stat(path, &st) == 0 && st.st_dev == eg_wrapper_st.st_dev &&
           st.st_ino == eg_wrapper_st.st_ino;
}

/*
 * Is this process the genuine wrapper, so that EXECGATE_IN_WRAPPER may switch on passthrough?
 * Only when the running executable (/proc/self/exe) is the captured EXEC_WRAPPER file (the native
 * wrapper, or a Codex-patched shell), or when EXEC_WRAPPER is a #! script (the Python wrapper) and
 * the kernel's argv for it names that very file as the script: argv[1], or argv[2] after the
 * optional argument of a "#!interp arg" line. Anything else carrying the marker — a shell that
 * glibc's wordexp() started from an environment the caller edited, a program a static binary
 * exec'd — is gated as usual. Residual: `python3 WRAPPER_SCRIPT ...` run by a process that does
 * not load the shim passes this check, but that is the wrapper itself, which asks the server.
 */
static int eg_is_wrapper_process(void)
{
    char buf[4096], head[2];
    ssize_t n = 0, r;
    int fd;
    if (eg_wrapper[0] == '\0' || !eg_wrapper_st_ok)
        return 0;
    if (eg_same_as_wrapper("/proc/self/exe"))
        return 1;
    fd = open(eg_wrapper, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 0;
    r = read(fd, head, 2);
    close(fd);
    if (r != 2 || head[0] != '#' || head[1] != '!')
        return 0;
    fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    while (n < (ssize_t)sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - (size_t)n)) > 0)
        n += r;
    close(fd);
    buf[n] = '\0';
    /* buf: "argv0\0argv1\0argv2\0..." */
    const char *arg = buf;
    for (int i = 0; i < 3 && arg < buf + n; i++, arg += strlen(arg) + 1)
        if (i > 0 && arg[0] != '\0' && eg_same_as_wrapper(arg))
            return 1;
    return 0;
}

#ifdef EG_LIB_DIR
/*
 * This build is installed as <dir>/<EG_LIB_DIR>/libexecgate_preload.so, EG_LIB_DIR being what the
 * loader expands "$LIB" to for this ABI (ld.so(8), "Dynamic string tokens"; Debian: lib/x86_64-linux-gnu
 * and lib32), next to the other ABI's build. Name this library <dir>/$LIB/libexecgate_preload.so in
 * the LD_PRELOAD it hands on, so that a child of either ABI loads its own build.
 */
static void eg_self_lib_token(void)
{
    static const char tail[] = "/" EG_LIB_DIR "/libexecgate_preload.so";
    size_t n = strlen(eg_self), t = sizeof tail - 1;
    if (n <= t || strcmp(eg_self + n - t, tail) != 0)
        return;
    static const char token[] = "/$LIB/libexecgate_preload.so";
    if (n - t + sizeof token <= sizeof eg_self)
        memcpy(eg_self + n - t, token, sizeof token);
}
#endif

static void eg_init(void)
{
    Dl_info info;
    const char *w;
    int in_wrapper;
    if (eg_ready)
        return;
    in_wrapper = getenv(EG_ENV_IN_WRAPPER) != NULL;
    if (in_wrapper)
        unsetenv(EG_ENV_IN_WRAPPER);
    w = getenv(EG_ENV_WRAPPER);
    if (w != NULL && strlen(w) < sizeof eg_wrapper) {
        strcpy(eg_wrapper, w);
        eg_wrapper_st_ok = stat(eg_wrapper, &eg_wrapper_st) == 0;
    }
    if (in_wrapper && eg_is_wrapper_process())
        eg_passthrough = 1;
    if (dladdr((void *)eg_init, &info) != 0 && info.dli_fname != NULL &&
        strlen(info.dli_fname) < sizeof eg_self)
        strcpy(eg_self, info.dli_fname);
#ifdef EG_LIB_DIR
    eg_self_lib_token();
#endif
    snprintf(eg_preload_entry, sizeof eg_preload_entry, "LD_PRELOAD=%s", eg_self);
    eg_depth = eg_parse_ulong(getenv(EG_ENV_DEPTH));
    if (eg_depth < 0)
        eg_depth = 0;
    eg_max_depth = eg_parse_ulong(getenv(EG_ENV_MAX_DEPTH));
    if (eg_max_depth < 0)
        eg_max_depth = EG_DEFAULT_MAX_DEPTH;
    snprintf(eg_depth_entry, sizeof eg_depth_entry, "%s=%ld", EG_ENV_DEPTH, eg_depth + 1);
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        int k = eg_forced_index(*e);
        if (k >= 0 && eg_forced[k] == NULL && strcmp(eg_forced_names[k], EG_ENV_SOCKET_ID) != 0)
            eg_force(k, *e); /* the first entry: the one getenv (and the wrapper) sees */
        else if (k < 0 && eg_is_saved_name(*e))
            eg_save(*e);
    }
    for (int k = 0; k < EG_NFORCED; k++)
        if (strcmp(eg_forced_names[k], EG_ENV_SOCKET_ID) == 0)
            eg_capture_socket_id(k);
    for (int k = 0; k < EG_NFORCED; k++) {
        if (eg_forced[k] == NULL)
            continue;
        if (strcmp(eg_forced_names[k], EG_ENV_SOCKET) == 0)
            eg_sock_fd = eg_parse_ulong(strchr(eg_forced[k], '=') + 1);
        else if (strcmp(eg_forced_names[k], EG_ENV_SOCKET_ID) == 0)
            eg_sock_id = strchr(eg_forced[k], '=') + 1;
        else if (strcmp(eg_forced_names[k], EG_ENV_BACKSTOP_QUERY) == 0)
            eg_backstop_token = eg_parse_ulong(strchr(eg_forced[k], '=') + 1);
    }
    if (eg_backstop_token <= 0 || eg_backstop_token > 0x7fffffffL)
        eg_backstop_token = -1;
    w = getenv(EG_ENV_CACHED_QUERY);
    eg_cached_query = w != NULL && strcmp(w, "1") == 0;
    eg_real_posix_spawn = (eg_spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    eg_ready = 1;
}

__attribute__((constructor)) static void eg_constructor(void)
{
    eg_init();
}

/* ---- exec path helpers: no heap, no stdio, no locks ---------------------------------------- */

static int eg_raw_execve(const char *path, char *const argv[], char *const envp[])
{
    return (int)syscall(SYS_execve, path, argv, envp);
}

static size_t eg_count(char *const v[])
{
    size_t n = 0;
    while (v != NULL && v[n] != NULL)
        n++;
    return n;
}

static void eg_complain(const char *what, const char *file, int err)
{
    const char *name = strerrorname_np(err);
    const char *parts[] = {"execgate: ", what, file, " (", name ? name : "error", ")", NULL};
    eg_write_err(parts);
}

static const char *eg_find_preload(char *const envp[])
{
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++)
        if (eg_env_is(envp[i], "LD_PRELOAD"))
            return envp[i];
    return NULL;
}

/* Bytes a merged "LD_PRELOAD=<self>:<theirs>" entry needs. */
static size_t eg_preload_cap(char *const envp[])
{
    const char *p = eg_find_preload(envp);
    return strlen(eg_self) + (p ? strlen(p) : 0) + 16;
}

/* Does the LD_PRELOAD value LIST name this library first (so its symbols win)? */
static int eg_preload_first(const char *list)
{
    size_t n = strlen(eg_self);
    return strncmp(list, eg_self, n) == 0 && (list[n] == '\0' || list[n] == ':' || list[n] == ' ');
}

/*
 * Fill OUT (room for eg_count(ENVP) + EG_SAVED_MAX + 4 entries) with the caller's environment,
 * except that execgate's forced variables are exactly as captured at load (a caller's value is
 * dropped and replaced; one absent at load stays absent), other captured EXECGATE_* variables
 * are put back where the caller dropped them, LD_PRELOAD names this library first, the depth is
 * the shim's incremented one and, only when FOR_WRAPPER, the wrapper marker is set.
 */
static void eg_env_build(char **out, char *const envp[], char *pbuf, size_t pcap, int for_wrapper)
{
    size_t n = 0;
    int have[EG_SAVED_MAX] = {0};
    int have_preload = 0;
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *e = envp[i];
        if (eg_env_is(e, EG_ENV_DEPTH) || eg_env_is(e, EG_ENV_IN_WRAPPER) ||
            eg_forced_index(e) >= 0)
            continue;
        if (eg_env_is(e, "LD_PRELOAD")) {
            if (have_preload++)
                continue;
            if (eg_self[0] == '\0' || eg_preload_first(e + 11)) {
                out[n++] = (char *)e;
            } else if (e[11] != '\0' && strlen(eg_self) + strlen(e) + 2 <= pcap) {
                strcpy(pbuf, eg_preload_entry);
                strcat(pbuf, ":");
                strcat(pbuf, e + 11);
                out[n++] = pbuf;
            } else {
                out[n++] = eg_preload_entry;
            }
            continue;
        }
        for (int k = 0; k < eg_nsaved; k++) {
            const char *eq = strchr(eg_saved[k], '=');
            size_t len = (size_t)(eq - eg_saved[k]);
            if (strncmp(e, eg_saved[k], len) == 0 && e[len] == '=')
                have[k] = 1;
        }
        out[n++] = (char *)e;
    }
    for (int k = 0; k < eg_nsaved; k++)
        if (!have[k])
            out[n++] = (char *)eg_saved[k];
    for (int k = 0; k < EG_NFORCED; k++)
        if (eg_forced[k] != NULL)
            out[n++] = (char *)eg_forced[k];
    if (!have_preload && eg_self[0] != '\0')
        out[n++] = eg_preload_entry;
    out[n++] = eg_depth_entry;
    if (for_wrapper)
        out[n++] = eg_in_wrapper_entry;
    out[n] = NULL;
}

/* Is PATH the session's wrapper (same string or same file)? */
static int eg_is_wrapper(const char *path)
{
    if (eg_wrapper[0] == '\0')
        return 0;
    if (strcmp(path, eg_wrapper) == 0)
        return 1;
    return eg_same_as_wrapper(path);
}

/* eg_precheck's kinds of file (*KIND). */
#define EG_KIND_OTHER 0   /* ELF, or a file only the kernel can judge (execute-only, binfmt_misc) */
#define EG_KIND_NOFORMAT 1 /* passes every check but has no format the kernel knows: ENOEXEC */
#define EG_KIND_HASHBANG 2 /* a "#!" script */

/*
 * Would the kernel start PATH? Returns 0 or the errno execve(2) would give; *SCRIPT is one of
 * the EG_KIND_* above (EG_KIND_NOFORMAT only with the ENOEXEC return).
 */
static int eg_precheck(const char *path, int *script)
{
    struct stat st;
    char buf[256];
    ssize_t n;
    int fd;
    *script = EG_KIND_OTHER;
    if (path[0] == '\0')
        return ENOENT;
    if (stat(path, &st) != 0)
        return errno;
    if (access(path, X_OK) != 0)
        return errno;
    if (!S_ISREG(st.st_mode))
        return EACCES;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 0; /* execute-only file: only the kernel can tell */
    do
        n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n >= 4 && memcmp(buf, "\177ELF", 4) == 0)
        return 0;
    if (n >= 2 && buf[0] == '#' && buf[1] == '!') {
        /* A missing interpreter makes execve fail with ENOENT (shells say "bad interpreter"). */
        char *p = buf + 2, *end;
        buf[n] = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        end = p + strcspn(p, " \t\n");
        *end = '\0';
        if (*p != '\0' && access(p, F_OK) != 0 && errno == ENOENT)
            return ENOENT;
        *script = EG_KIND_HASHBANG;
        return 0;
    }
    /* Looked up here, on the rare exec of a file with no known format, not in the constructor:
     * every process pays for the constructor, and the directory read is 4 system calls. A race
     * between threads only repeats the lookup. */
    int binfmt = __atomic_load_n(&eg_binfmt_misc, __ATOMIC_RELAXED);
    if (binfmt < 0) {
        binfmt = eg_detect_binfmt_misc();
        __atomic_store_n(&eg_binfmt_misc, binfmt, __ATOMIC_RELAXED);
    }
    if (binfmt)
        return 0;
    *script = EG_KIND_NOFORMAT;
    return ENOEXEC;
}

/*
 * Exec the wrapper for FILE: argv [WRAPPER, FILE, ARGV...], or for a script without a format
 * (SCRIPT) [WRAPPER, /bin/sh, /bin/sh, FILE, ARGV[1]...] as glibc's execvp runs it. Returns -1
 * (errno EACCES) only when the wrapper cannot be started; the reason goes to stderr.
 */
static int eg_exec_wrapper(const char *file, char *const argv[], char *const envp[], int script)
{
    size_t argc = eg_count(argv), envc = eg_count(envp), pcap = eg_preload_cap(envp), n = 0;
    char *nargv[argc + 5];
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    if (eg_depth >= eg_max_depth) {
        eg_complain("exec depth limit reached, refusing to exec ", file, ELOOP);
        errno = EACCES;
        return EG_STOP;
    }
    nargv[n++] = eg_wrapper;
    if (script) {
        nargv[n++] = (char *)EG_BSHELL;
        nargv[n++] = (char *)EG_BSHELL;
        nargv[n++] = (char *)file;
        for (size_t i = 1; i < argc; i++)
            nargv[n++] = argv[i];
    } else {
        nargv[n++] = (char *)file;
        for (size_t i = 0; i < argc; i++)
            nargv[n++] = argv[i];
    }
    nargv[n] = NULL;
    eg_env_build(nenv, envp, pbuf, pcap, 1);
    eg_raw_execve(eg_wrapper, nargv, nenv);
    int err = errno;
    eg_complain("cannot execute the exec wrapper ", eg_wrapper, err);
    /* Too large an argv/environment is the caller's E2BIG, as without execgate; any other failure
     * to start the wrapper is refused (EACCES), never run unchecked. */
    errno = err == E2BIG ? E2BIG : EACCES;
    return EG_STOP;
}

/* ---- the cached-only query (server/protocol.py, "Cached-only query"; DESIGN.md §9) ---------- */

/* A request frame being sent on stream FD in pieces of sizeof BUF, the first piece carrying
 * ATTACH (SCM_RIGHTS) when it is >= 0. */
struct eg_frame_out {
    int fd, attach, failed;
    size_t len;
    char buf[512];
};

static void eg_frame_flush(struct eg_frame_out *o)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    size_t off = 0;
    while (!o->failed && off < o->len) {
        struct iovec iov = {o->buf + off, o->len - off};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (o->attach >= 0) {
            memset(&ctl, 0, sizeof ctl);
            msg.msg_control = ctl.buf;
            msg.msg_controllen = sizeof ctl.buf;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &o->attach, sizeof(int));
        }
        ssize_t w = sendmsg(o->fd, &msg, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            o->failed = 1;
            break;
        }
        o->attach = -1;
        off += (size_t)w;
    }
    o->len = 0;
}

static void eg_count_put(void *ctx, const char *s, size_t n)
{
    (void)s;
    *(size_t *)ctx += n;
}

static void eg_frame_put(void *ctx, const char *s, size_t n)
{
    struct eg_frame_out *o = ctx;
    while (!o->failed && n > 0) {
        size_t k = sizeof o->buf - o->len < n ? sizeof o->buf - o->len : n;
        memcpy(o->buf + o->len, s, k);
        o->len += k, s += k, n -= k;
        if (o->len == sizeof o->buf)
            eg_frame_flush(o);
    }
}

/* Read exactly N bytes from stream FD (closing any fd that rides along); 0, or -1. */
static int eg_read_exact(int fd, char *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = eg_recv_some(fd, p + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Ask the server's cache about PATH (TARGET: PATH opened O_PATH, sent with the request) for an
 * exec by this process or by a child it spawns (KIND: EG_QUERY_SELF, EG_QUERY_CHILD). 1 when the
 * answer is exactly Run; 0 for anything else (Undecided, a broken or closed stream, no session
 * socket), with nothing left open. */
__attribute__((noinline)) static int eg_query_cache(const char *path, char *const argv[], int target,
                                                    int kind)
{
    static const char run[] = "{\"action\":\"Run\"}";
    /* Small buffers: this may run on a vfork or clone child's stack. A working directory longer
     * than the buffer (getcwd: ERANGE) goes the wrapper's way. */
    char cwd[1024], reply[sizeof run];
    unsigned char head[4];
    size_t total = 0;
    if (eg_sock_fd < 0 || !eg_socket_fd_valid((int)eg_sock_fd, eg_sock_id) ||
        getcwd(cwd, sizeof cwd) == NULL)
        return 0;
    eg_request_json(eg_count_put, &total, path, argv, cwd, NULL, 1, kind);
    if (total > EG_MAX_FRAME_BYTES)
        return 0;
    int stream = eg_handshake((int)eg_sock_fd);
    if (stream < 0)
        return 0;
    struct eg_frame_out out = {.fd = stream, .attach = target};
    for (int i = 0; i < 4; i++)
        head[i] = (unsigned char)(total >> (8 * i));
    eg_frame_put(&out, (const char *)head, 4);
    eg_request_json(eg_frame_put, &out, path, argv, cwd, NULL, 1, kind);
    eg_frame_flush(&out);
    int ok = !out.failed && eg_read_exact(stream, (char *)head, 4) == 0 &&
             ((uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
              (uint32_t)head[3] << 24) == sizeof run - 1 &&
             eg_read_exact(stream, reply, sizeof run - 1) == 0 &&
             memcmp(reply, run, sizeof run - 1) == 0;
    close(stream);
    return ok;
}

/* Execute the approved TARGET (PATH opened O_PATH) as the wrapper would; returns -1 (errno set)
 * when that fails. Kept apart from the query, so that the two never need their stack at once. */
__attribute__((noinline)) static int eg_exec_approved(const char *path, char *const argv[],
                                                      char *const envp[], int target, int hashbang)
{
    size_t envc = eg_count(envp), pcap = eg_preload_cap(envp);
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    struct stat a, b;
    eg_env_build(nenv, envp, pbuf, pcap, 0);
    if (!hashbang)
        syscall(SYS_execveat, target, "", argv, nenv, AT_EMPTY_PATH);
    /* A script (also one that was not a script at the check): the kernel would hand its
     * interpreter /dev/fd/N of a close-on-exec fd (execveat(2), ENOENT). By path, if the same. */
    if (hashbang || errno == ENOENT) {
        if (fstat(target, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            eg_raw_execve(path, argv, nenv);
        } else {
            eg_complain("refusing to exec a file other than the one approved: ", path, ESTALE);
            errno = EACCES;
        }
    }
    return -1;
}

/*
 * The shim decides in the calling process when the server's decision cache covers this exec
 * (docs/DESIGN.md §9): a cached-only query, and on Run the program is executed here — no second
 * exec of the wrapper. As the wrapper does (wrapper.c run_in_place): the very file the server
 * identified, execveat(fd, "", AT_EMPTY_PATH) by the raw syscall, or for a "#!" script (HASHBANG)
 * by path after checking that the path still names that file. Returns 0 when the cache did not
 * answer Run (the caller execs the wrapper, which asks with a full request), -1 (errno set) when
 * the approved exec failed, as execve would.
 */
static int eg_cached_run(const char *path, char *const argv[], char *const envp[], int hashbang)
{
    int err, target = open(path, O_PATH | O_CLOEXEC);
    if (target < 0)
        return 0;
    if (!eg_query_cache(path, argv, target, EG_QUERY_SELF)) {
        close(target);
        return 0;
    }
    eg_exec_approved(path, argv, envp, target, hashbang);
    err = errno;
    close(target);
    errno = err;
    return -1;
}

/*
 * Query by exec (server/protocol.py): where the session's seccomp backstop stops every exec
 * anyway, the exec itself is the query. PATH is opened (O_PATH) and that open file executed by
 * the raw execveat(fd, "", AT_EMPTY_PATH) — no path for the kernel to look up again after the
 * backstop's answer — whose unused 6th argument points at the mark, the token and PATH (the name
 * the policy judges). The backstop lets it continue on a Run the policy gives without asking
 * anyone (the program then runs here, no socket work at all), else fails it with
 * EG_QUERY_UNDECIDED_ERRNO: 0 is returned and the caller execs the wrapper. Returns -1 (errno
 * set) when the exec failed otherwise, as execve would. Not for a "#!" script (its interpreter
 * would get /dev/fd/N of a close-on-exec fd). A process outside any backstop never has the
 * variable: the shim's chain of trust forces it, as the socket's.
 */
static int eg_backstop_run(const char *path, char *const argv[], char *const envp[])
{
    size_t envc = eg_count(envp), pcap = eg_preload_cap(envp);
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    struct eg_query_mark mark = {EG_QUERY_MARK, eg_backstop_token, path};
    int err, target = open(path, O_PATH | O_CLOEXEC);
    if (target < 0)
        return 0;
    eg_env_build(nenv, envp, pbuf, pcap, 0);
    syscall(SYS_execveat, target, "", argv, nenv, AT_EMPTY_PATH, &mark);
    err = errno;
    close(target);
    errno = err;
    return err == EG_QUERY_UNDECIDED_ERRNO ? 0 : -1;
}

/* Exec the wrapper itself (a Codex-patched shell honouring EXEC_WRAPPER): not wrapped twice. */
static int eg_exec_wrapper_direct(const char *path, char *const argv[], char *const envp[])
{
    size_t envc = eg_count(envp), pcap = eg_preload_cap(envp);
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    eg_env_build(nenv, envp, pbuf, pcap, 1);
    return eg_raw_execve(path, argv, nenv);
}

/* Gate one exec attempt of PATH; returns only on failure, with errno as execve would set it:
 * -1, or EG_STOP when execgate itself refused the exec. */
static int eg_try(const char *path, char *const argv[], char *const envp[], int exec_script)
{
    int script, err;
    if (eg_passthrough) {
        eg_raw_execve(path, argv, envp);
        if (errno == ENOEXEC && exec_script) {
            size_t argc = eg_count(argv), n = 0;
            char *nargv[argc + 3];
            nargv[n++] = (char *)EG_BSHELL;
            nargv[n++] = (char *)path;
            for (size_t i = 1; i < argc; i++)
                nargv[n++] = argv[i];
            nargv[n] = NULL;
            eg_raw_execve(EG_BSHELL, nargv, envp);
        }
        return -1;
    }
    if (eg_wrapper[0] == '\0') {
        eg_complain("EXEC_WRAPPER is not set; refusing to exec ", path, EACCES);
        errno = EACCES;
        return EG_STOP;
    }
    if (eg_is_wrapper(path))
        return eg_exec_wrapper_direct(path, argv, envp);
    err = eg_precheck(path, &script);
    if (script == EG_KIND_NOFORMAT && exec_script)
        return eg_exec_wrapper(path, argv, envp, 1);
    if (err != 0) {
        errno = err;
        return -1;
    }
    if (eg_cached_query && eg_depth < eg_max_depth) {
        int ran = eg_backstop_token > 0 && script != EG_KIND_HASHBANG
                      ? eg_backstop_run(path, argv, envp)
                      : eg_cached_run(path, argv, envp, script == EG_KIND_HASHBANG);
        if (ran != 0)
            return ran;
    }
    return eg_exec_wrapper(path, argv, envp, 0);
}

/* glibc's __execvpe_common (posix/execvpe.c), with each execve replaced by eg_try. */
static int eg_execvpe_common(const char *file, char *const argv[], char *const envp[],
                             int exec_script)
{
    const char *path, *p, *subp;
    size_t file_len, path_len;
    int got_eacces = 0;
    if (file == NULL || *file == '\0') {
        errno = ENOENT;
        return -1;
    }
    if (strchr(file, '/') != NULL)
        return eg_try(file, argv, envp, exec_script) < 0 ? -1 : 0;
    path = getenv("PATH");
    if (path == NULL)
        path = EG_DEFAULT_PATH;
    file_len = strnlen(file, NAME_MAX) + 1;
    path_len = strnlen(path, PATH_MAX - 1) + 1;
    if (file_len - 1 > NAME_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    char buffer[path_len + file_len + 1];
    for (p = path;; p = subp) {
        subp = strchrnul(p, ':');
        if ((size_t)(subp - p) >= path_len) {
            if (*subp == '\0')
                break;
            continue;
        }
        memcpy(buffer, p, (size_t)(subp - p));
        buffer[subp - p] = '/';
        memcpy(buffer + (subp - p) + (p < subp), file, file_len);
        if (eg_try(buffer, argv, envp, exec_script) == EG_STOP)
            return -1;
        switch (errno) {
        case EACCES:
            got_eacces = 1;
            /* fall through */
        case ENOENT:
        case ESTALE:
        case ENOTDIR:
        case ENODEV:
        case ETIMEDOUT:
            break;
        default:
            return -1;
        }
        if (*subp++ == '\0')
            break;
    }
    if (got_eacces)
        errno = EACCES;
    return -1;
}

/* ---- posix_spawn ----------------------------------------------------------------------------- */

static eg_spawn_fn eg_spawn_real(void)
{
    if (eg_real_posix_spawn == NULL)
        eg_real_posix_spawn = (eg_spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    return eg_real_posix_spawn;
}

/* Spawn the wrapper for the already checked PATH, with the caller's file actions and attributes;
 * or, when the query answers Run, PATH itself. */
static int eg_spawn_gated(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    size_t argc = eg_count(argv), envc = eg_count(envp), pcap = eg_preload_cap(envp), n = 0;
    char *nargv[argc + 3];
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    eg_spawn_fn real = eg_spawn_real();
    if (real == NULL)
        return ENOSYS;
    if (eg_wrapper[0] == '\0') {
        eg_complain("EXEC_WRAPPER is not set; refusing to spawn ", path, EACCES);
        return EACCES;
    }
    if (eg_is_wrapper(path)) {
        eg_env_build(nenv, envp, pbuf, pcap, 1);
        return real(pid, path, fa, attr, argv, nenv);
    }
    if (eg_depth >= eg_max_depth) {
        eg_complain("exec depth limit reached, refusing to spawn ", path, ELOOP);
        return EACCES;
    }
    if (eg_cached_query && (fa == NULL || fa->__used == 0)) {
        /* The cache's Run for an exec by the child (DESIGN.md §9): spawned by path, with the
         * environment it would get through the wrapper; the backstop checks that the child's
         * exec is of the very file the server identified here. Only without file actions
         * (glibc's public __used count; their contents are opaque): a chdir or dup2 in the
         * child would make PATH name another file there than the one asked about here. */
        int target = open(path, O_PATH | O_CLOEXEC), ran = 0;
        if (target >= 0) {
            ran = eg_query_cache(path, argv, target, EG_QUERY_CHILD);
            close(target);
        }
        if (ran) {
            eg_env_build(nenv, envp, pbuf, pcap, 0);
            return real(pid, path, fa, attr, argv, nenv);
        }
    }
    eg_env_build(nenv, envp, pbuf, pcap, 1);
    nargv[n++] = eg_wrapper;
    nargv[n++] = (char *)path;
    for (size_t i = 0; i < argc; i++)
        nargv[n++] = argv[i];
    nargv[n] = NULL;
    return real(pid, eg_wrapper, fa, attr, nargv, nenv);
}

/* Check PATH as execve would, then spawn; posix_spawn has no ENOEXEC fallback (glibc >= 2.15). */
static int eg_spawn_one(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    int script;
    int err = eg_is_wrapper(path) ? 0 : eg_precheck(path, &script);
    if (err != 0)
        return err;
    return eg_spawn_gated(pid, path, fa, attr, argv, envp);
}

/* int posix_spawn(pid_t *restrict pid, const char *restrict path,
 *                 const posix_spawn_file_actions_t *file_actions,
 *                 const posix_spawnattr_t *restrict attrp,
 *                 char *const argv[restrict], char *const envp[restrict]); */
__attribute__((visibility("default"))) int posix_spawn(pid_t *pid, const char *path,
                                                     const posix_spawn_file_actions_t *fa,
                                                     const posix_spawnattr_t *attr,
                                                     char *const argv[], char *const envp[])
{
    eg_init();
    if (eg_passthrough)
        return eg_spawn_real() ? eg_spawn_real()(pid, path, fa, attr, argv, envp) : ENOSYS;
    return eg_spawn_one(pid, path, fa, attr, argv, envp);
}

/* int posix_spawnp(pid_t *restrict pid, const char *restrict file,
 *                  const posix_spawn_file_actions_t *file_actions,
 *                  const posix_spawnattr_t *restrict attrp,
 *                  char *const argv[restrict], char *const envp[restrict]);
 * PATH comes from the caller's environment, not ENVP (as in glibc). */
__attribute__((visibility("default"))) int posix_spawnp(pid_t *pid, const char *file,
                                                      const posix_spawn_file_actions_t *fa,
                                                      const posix_spawnattr_t *attr,
                                                      char *const argv[], char *const envp[])
{
    const char *path, *p, *subp;
    int got_eacces = 0, err = ENOENT;
    eg_init();
    if (file == NULL || *file == '\0')
        return ENOENT;
    if (eg_passthrough || strchr(file, '/') != NULL) {
        if (eg_passthrough) {
            typedef int (*fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                              const posix_spawnattr_t *, char *const[], char *const[]);
            fn real = (fn)dlsym(RTLD_NEXT, "posix_spawnp");
            return real ? real(pid, file, fa, attr, argv, envp) : ENOSYS;
        }
        return eg_spawn_one(pid, file, fa, attr, argv, envp);
    }
    path = getenv("PATH");
    if (path == NULL)
        path = EG_DEFAULT_PATH;
    size_t file_len = strnlen(file, NAME_MAX) + 1, path_len = strnlen(path, PATH_MAX - 1) + 1;
    if (file_len - 1 > NAME_MAX)
        return ENAMETOOLONG;
    char buffer[path_len + file_len + 1];
    for (p = path;; p = subp) {
        subp = strchrnul(p, ':');
        if ((size_t)(subp - p) < path_len) {
            int script;
            memcpy(buffer, p, (size_t)(subp - p));
            buffer[subp - p] = '/';
            memcpy(buffer + (subp - p) + (p < subp), file, file_len);
            err = eg_is_wrapper(buffer) ? 0 : eg_precheck(buffer, &script);
            if (err == 0)
                return eg_spawn_gated(pid, buffer, fa, attr, argv, envp);
            if (err == EACCES)
                got_eacces = 1;
            else if (err != ENOENT && err != ESTALE && err != ENOTDIR && err != ENODEV &&
                     err != ETIMEDOUT)
                return err;
        }
        if (*subp == '\0')
            break;
        subp++;
    }
    return got_eacces ? EACCES : err;
}

/* ---- the exec family ------------------------------------------------------------------------- */

/* int execve(const char *path, char *const argv[], char *const envp[]); */
__attribute__((visibility("default"))) int execve(const char *path, char *const argv[],
                                                char *const envp[])
{
    eg_init();
    return eg_try(path, argv, envp, 0) < 0 ? -1 : 0;
}

/* int execv(const char *path, char *const argv[]); */
__attribute__((visibility("default"))) int execv(const char *path, char *const argv[])
{
    eg_init();
    return eg_try(path, argv, environ, 0) < 0 ? -1 : 0;
}

/* int execvp(const char *file, char *const argv[]); */
__attribute__((visibility("default"))) int execvp(const char *file, char *const argv[])
{
    eg_init();
    return eg_execvpe_common(file, argv, environ, 1);
}

/* int execvpe(const char *file, char *const argv[], char *const envp[]);  (GNU) */
__attribute__((visibility("default"))) int execvpe(const char *file, char *const argv[],
                                                 char *const envp[])
{
    eg_init();
    return eg_execvpe_common(file, argv, envp, 1);
}

/* Count the variadic arguments of execl/execlp/execle after ARG, up to the NULL. */
#define EG_COUNT_VARARGS(arg, argc)                                                             \
    do {                                                                                        \
        va_list ap_;                                                                            \
        argc = 0;                                                                               \
        if ((arg) != NULL) {                                                                    \
            va_start(ap_, arg);                                                                 \
            for (argc = 1; va_arg(ap_, const char *) != NULL; argc++)                           \
                ;                                                                               \
            va_end(ap_);                                                                        \
        }                                                                                       \
    } while (0)

/* int execl(const char *path, const char *arg0, ... (char *)0); */
__attribute__((visibility("default"))) int execl(const char *path, const char *arg, ...)
{
    size_t argc;
    va_list ap;
    EG_COUNT_VARARGS(arg, argc);
    char *argv[argc + 1];
    va_start(ap, arg);
    for (size_t i = 0; i < argc; i++)
        argv[i] = i == 0 ? (char *)arg : va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    eg_init();
    return eg_try(path, argv, environ, 0) < 0 ? -1 : 0;
}

/* int execlp(const char *file, const char *arg0, ... (char *)0); */
__attribute__((visibility("default"))) int execlp(const char *file, const char *arg, ...)
{
    size_t argc;
    va_list ap;
    EG_COUNT_VARARGS(arg, argc);
    char *argv[argc + 1];
    va_start(ap, arg);
    for (size_t i = 0; i < argc; i++)
        argv[i] = i == 0 ? (char *)arg : va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    eg_init();
    return eg_execvpe_common(file, argv, environ, 1);
}

/* int execle(const char *path, const char *arg0, ... (char *)0, char *const envp[]); */
__attribute__((visibility("default"))) int execle(const char *path, const char *arg, ...)
{
    size_t argc;
    va_list ap;
    char *const *envp;
    EG_COUNT_VARARGS(arg, argc);
    char *argv[argc + 1];
    va_start(ap, arg);
    for (size_t i = 0; i < argc; i++)
        argv[i] = i == 0 ? (char *)arg : va_arg(ap, char *);
    if (argc > 0)
        (void)va_arg(ap, char *); /* the terminating NULL */
    envp = va_arg(ap, char *const *);
    va_end(ap);
    argv[argc] = NULL;
    eg_init();
    return eg_try(path, argv, envp, 0) < 0 ? -1 : 0;
}

/*
 * Path of the file open as FD, if it is a named file that still is FD; else "" (memfd, deleted
 * file, replaced path): such a file has no name a policy could judge.
 */
static void eg_fd_path(int fd, char *out, size_t cap)
{
    char link[64] = "/proc/self/fd/", num[24];
    struct stat a, b;
    ssize_t n;
    out[0] = '\0';
    strcat(link, eg_format_ulong(num, (unsigned long)fd));
    n = readlink(link, out, cap - 1);
    if (n <= 0 || out[0] != '/') {
        out[0] = '\0';
        return;
    }
    out[n] = '\0';
    if (fstat(fd, &a) != 0 || stat(out, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        out[0] = '\0';
}

/* int fexecve(int fd, char *const argv[], char *const envp[]);
 * Gated by the file's path; an unnamed file (memfd, deleted) is refused (EACCES). */
__attribute__((visibility("default"))) int fexecve(int fd, char *const argv[],
                                                 char *const envp[])
{
    char path[PATH_MAX];
    struct stat st;
    eg_init();
    if (eg_passthrough)
        return (int)syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
    if (fd < 0 || argv == NULL || envp == NULL) {
        errno = EINVAL;
        return -1;
    }
    if (fstat(fd, &st) != 0)
        return -1;
    eg_fd_path(fd, path, sizeof path);
    if (path[0] == '\0') {
        eg_complain("cannot gate fexecve of an unnamed file, fd ", "", EACCES);
        errno = EACCES;
        return -1;
    }
    return eg_try(path, argv, envp, 0) < 0 ? -1 : 0;
}

/* int execveat(int dirfd, const char *pathname, char *const argv[], char *const envp[],
 *              int flags);  (Linux) */
__attribute__((visibility("default"))) int execveat(int dirfd, const char *pathname,
                                                  char *const argv[], char *const envp[],
                                                  int flags)
{
    char path[PATH_MAX];
    struct stat st;
    eg_init();
    if (eg_passthrough)
        return (int)syscall(SYS_execveat, dirfd, pathname, argv, envp, flags);
    if ((flags & AT_EMPTY_PATH) && pathname != NULL && pathname[0] == '\0')
        return fexecve(dirfd, argv, envp);
    if (pathname == NULL) {
        errno = EFAULT;
        return -1;
    }
    if (pathname[0] == '/' || dirfd == AT_FDCWD) {
        if (strlen(pathname) >= sizeof path) {
            errno = ENAMETOOLONG;
            return -1;
        }
        strcpy(path, pathname);
    } else {
        size_t n;
        eg_fd_path(dirfd, path, sizeof path);
        n = strlen(path);
        if (n == 0 || n + 1 + strlen(pathname) >= sizeof path) {
            errno = n == 0 ? EBADF : ENAMETOOLONG;
            return -1;
        }
        path[n] = '/';
        strcpy(path + n + 1, pathname);
    }
    if ((flags & AT_SYMLINK_NOFOLLOW) && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        errno = ELOOP;
        return -1;
    }
    return eg_try(path, argv, envp, 0) < 0 ? -1 : 0;
}

/* ---- system() and popen() -------------------------------------------------------------------- */

/*
 * glibc's system() and popen() start "/bin/sh -c CMD" through libc-internal spawn calls that
 * symbol interposition cannot reach, and hand that shell the process's *current* environ, as the
 * caller may have edited it (os.environ["EXECGATE_IN_WRAPPER"] = "1", LD_PRELOAD dropped,
 * EXEC_WRAPPER pointed at a program of the caller's). The shim loaded into that shell would then
 * capture the caller's values. So, before calling the real function, put environ into the state
 * every gated exec gets (eg_env_build: the forced variables exactly as captured, the other
 * captured EXECGATE_* variables put back, LD_PRELOAD naming this library first, the shim's
 * EXECGATE_DEPTH) and drop EXECGATE_IN_WRAPPER. The shell itself still starts ungated (its exec
 * is not decided), but it loads the shim with the session's values, so every exec it makes is.
 * system() and popen() are never called in a vfork child, so setenv/unsetenv (heap, locks) are
 * fine here; like any setenv they race with other threads reading the environment, and the
 * change stays in the caller's environ (it is the state the shim forces anyway).
 */
static void eg_environ_force(void)
{
    size_t envc = eg_count(environ), pcap = eg_preload_cap(environ);
    char *nenv[envc + EG_SAVED_MAX + EG_NFORCED + 4];
    char pbuf[pcap];
    eg_env_build(nenv, environ, pbuf, pcap, 0);
    unsetenv(EG_ENV_IN_WRAPPER);
    for (size_t i = 0; nenv[i] != NULL; i++) {
        const char *e = nenv[i], *eq = strchr(e, '=');
        if (eq == NULL || !(eg_forced_index(e) >= 0 || eg_env_is(e, EG_ENV_DEPTH) ||
                            eg_env_is(e, "LD_PRELOAD") || eg_is_saved_name(e)))
            continue;
        char name[(size_t)(eq - e) + 1];
        char *value = strdup(eq + 1); /* E may be an environ string that unsetenv drops */
        if (value == NULL)
            continue;
        memcpy(name, e, (size_t)(eq - e));
        name[eq - e] = '\0';
        unsetenv(name); /* every duplicate: the loader takes the last LD_PRELOAD it finds */
        setenv(name, value, 1);
        free(value);
    }
    for (int k = 0; k < EG_NFORCED; k++)
        if (eg_forced[k] == NULL)
            unsetenv(eg_forced_names[k]);
}

/* int system(const char *command); */
__attribute__((visibility("default"))) int system(const char *command)
{
    typedef int (*fn)(const char *);
    fn real = (fn)dlsym(RTLD_NEXT, "system");
    eg_init();
    if (real == NULL) {
        errno = ENOSYS;
        return -1;
    }
    if (!eg_passthrough)
        eg_environ_force();
    return real(command);
}

/* FILE *popen(const char *command, const char *mode); */
__attribute__((visibility("default"))) FILE *popen(const char *command, const char *mode)
{
    typedef FILE *(*fn)(const char *, const char *);
    fn real = (fn)dlsym(RTLD_NEXT, "popen");
    eg_init();
    if (real == NULL) {
        errno = ENOSYS;
        return NULL;
    }
    if (!eg_passthrough)
        eg_environ_force();
    return real(command, mode);
}
