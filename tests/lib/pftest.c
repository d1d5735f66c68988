/* Integration-test helpers (see pftest.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pftest.h"

static pid_t tracked[32];
static size_t ntracked;

void pft_fail_cleanup(void)
{
    for (size_t i = 0; i < ntracked; i++)
        if (tracked[i] > 0)
            kill(tracked[i], SIGKILL);
}

uint64_t pft_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

char *pft_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b) {
        size_t r = fread(b, 1, (size_t)n, f);
        b[r] = '\0';
    }
    fclose(f);
    return b;
}

bool pft_log_contains(const struct pft_proc *p, const char *s)
{
    char *b = pft_read_file(p->log);
    bool r = b && strstr(b, s);
    free(b);
    return r;
}

bool pft_wait_log(const struct pft_proc *p, const char *s, uint64_t timeout_ms)
{
    uint64_t dl = pft_now_ms() + timeout_ms;
    for (;;) {
        if (pft_log_contains(p, s))
            return true;
        if (pft_now_ms() >= dl)
            return false;
        usleep(20000);
    }
}

int pft_port_after(const char *log, const char *marker)
{
    const char *m = strstr(log, marker);
    if (!m)
        return 0;
    const char *p = strstr(m, "(port ");
    return p ? atoi(p + 6) : 0;
}

int pft_start(struct pft_proc *p, const char *bin, const char *host, const char *const *args)
{
    memset(p, 0, sizeof(*p));
    const char *dir = getenv("PF_BIN");
    const char *logdir = getenv("PF_TEST_LOGDIR");
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "build/rel/bin", bin);
    static int seq;
    snprintf(p->log, sizeof(p->log), "%s/%s-%d-%d.log", logdir ? logdir : "/tmp", bin,
             (int)getpid(), seq++);
    const char *argv[64];
    size_t n = 0;
    argv[n++] = path;
    bool has_addr = false, has_http = false, has_faults = false, has_debug = false;
    for (size_t i = 0; args && args[i] && n < 55; i++) {
        has_addr |= strcmp(args[i], "--addr") == 0;
        has_http |= strcmp(args[i], "--http-addr") == 0;
        has_faults |= strcmp(args[i], "--fault-spec") == 0;
        has_debug |= strcmp(args[i], "--enable-debug") == 0;
        argv[n++] = args[i];
    }
    /* a fault plan for every server of the run, as tests/python/conftest.py does
     * (docs/development.md "Finding races") */
    const char *faults = getenv("PF_TEST_SERVER_FAULTS");
    if (faults && *faults && !has_faults && strcmp(bin, "pegaflow-server") == 0) {
        if (!has_debug)
            argv[n++] = "--enable-debug";
        argv[n++] = "--fault-spec";
        argv[n++] = faults;
    }
    char a1[80], a2[80];
    snprintf(a1, sizeof(a1), "%s:0", host);
    snprintf(a2, sizeof(a2), "%s:0", host);
    if (!has_addr) {
        argv[n++] = "--addr";
        argv[n++] = a1;
    }
    if (!has_http) {
        argv[n++] = "--http-addr";
        argv[n++] = a2;
    }
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(p->log, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(path, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    p->pid = pid;
    if (ntracked < 32)
        tracked[ntracked++] = pid;
    snprintf(p->http_host, sizeof(p->http_host), "%s", host);
    uint64_t dl = pft_now_ms() + 30000;
    while (pft_now_ms() < dl) {
        char *log = pft_read_file(p->log);
        if (log) {
            p->grpc_port = pft_port_after(log, "gRPC listening on");
            p->http_port = pft_port_after(log, "HTTP listening on");
            bool ready = strstr(log, ": ready\n") != NULL;
            free(log);
            if (p->grpc_port && p->http_port && ready) {
                snprintf(p->addr, sizeof(p->addr), "%s:%d", host, p->grpc_port);
                return 0;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            break;
        }
        usleep(20000);
    }
    char *log = pft_read_file(p->log);
    fprintf(stderr, "server %s did not start; log:\n%s\n", bin, log ? log : "(none)");
    free(log);
    if (p->pid)
        kill(p->pid, SIGKILL);
    return -1;
}

int pft_wait_exit(struct pft_proc *p, uint64_t timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    uint64_t dl = pft_now_ms() + timeout_ms;
    int st;
    for (;;) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid)
            break;
        if (pft_now_ms() >= dl)
            return -1;
        usleep(10000);
    }
    for (size_t i = 0; i < ntracked; i++)
        if (tracked[i] == p->pid)
            tracked[i] = 0;
    p->pid = 0;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

int pft_stop(struct pft_proc *p, int sig, uint64_t timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, sig);
    int rc = pft_wait_exit(p, timeout_ms);
    if (rc == -1 && p->pid > 0) {
        fprintf(stderr, "process %d did not exit after signal %d; killing\n", (int)p->pid, sig);
        kill(p->pid, SIGKILL);
        pft_wait_exit(p, 5000);
    }
    return rc;
}

int pft_http(const char *host, int port, const char *method, const char *path, char **body_p)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return -1;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        freeaddrinfo(res);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    freeaddrinfo(res);
    /* PF_ADMIN_TOKEN_FILE (lib.sh's pf_cluster_token): sent as the admin bearer token; a
     * server without --admin-token-file ignores the header */
    char auth[200] = "";
    char *tok = getenv("PF_ADMIN_TOKEN_FILE") ? pft_read_file(getenv("PF_ADMIN_TOKEN_FILE")) : NULL;
    if (tok) {
        tok[strcspn(tok, "\r\n")] = '\0';
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", tok);
        free(tok);
    }
    char req[768];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: %s\r\n%sContent-Length: 0\r\n\r\n",
                     method, path, host, auth);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1)
        status = -1;
    char *body = strstr(buf, "\r\n\r\n");
    if (body_p)
        *body_p = strdup(body ? body + 4 : "");
    free(buf);
    return status;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pft_fill(void *buf, size_t len, uint64_t seed, uint64_t stream)
{
    uint64_t s = seed ^ (stream * 0xd1342543de82ef95ull);
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = splitmix(&s);
        memcpy(p + i, &v, 8);
    }
    if (i < len) {
        uint64_t v = splitmix(&s);
        memcpy(p + i, &v, len - i);
    }
}

uint64_t pft_seed(void)
{
    const char *e = getenv("PF_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    fprintf(stderr, "test seed: %llu (replay with PF_TEST_SEED=%llu)\n", (unsigned long long)s,
            (unsigned long long)s);
    return s;
}

int pft_run_scenarios(const struct pft_scenario *sc, size_t n, char *const *names, int nnames)
{
    for (int k = 0; k < nnames; k++) {
        bool known = false;
        for (size_t i = 0; i < n; i++)
            known |= strcmp(names[k], sc[i].name) == 0;
        if (!known) {
            fprintf(stderr, "unknown scenario %s; known:", names[k]);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %s", sc[i].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    for (size_t i = 0; i < n; i++) {
        bool run = nnames == 0;
        for (int k = 0; k < nnames; k++)
            run |= strcmp(names[k], sc[i].name) == 0;
        if (!run)
            continue;
        uint64_t t0 = pft_now_ms();
        fprintf(stderr, "scenario %s\n", sc[i].name);
        sc[i].fn();
        fprintf(stderr, "  %s passed in %.1f s\n", sc[i].name, (double)(pft_now_ms() - t0) / 1000);
    }
    fprintf(stderr, "all scenarios passed\n");
    return 0;
}

int pft_cluster_token(const char *dir, char *path, size_t len)
{
    unsigned char raw[32];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, raw, sizeof(raw));
    close(fd);
    if (n != (ssize_t)sizeof(raw))
        return -EIO;
    if ((size_t)snprintf(path, len, "%s/cluster-token", dir) >= len)
        return -ENAMETOOLONG;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    char hex[2 * sizeof(raw) + 1];
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[2 * sizeof(raw)] = '\n';
    bool ok = write(fd, hex, sizeof(hex)) == (ssize_t)sizeof(hex);
    close(fd);
    if (!ok)
        return -EIO;
    setenv("PF_CLUSTER_TOKEN_FILE", path, 1);
    setenv("PEGAFLOW_TOKEN_FILE", path, 1);
    return 0;
}
