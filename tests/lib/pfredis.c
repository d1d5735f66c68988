/* Throw-away redis-server processes for tests (see pfredis.h). A free port is found by
 * binding port 0 and releasing it; if redis-server then fails to bind (another process took
 * the port in between) the start is retried on a new port. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "pfredis.h"

static const char *redis_bin(void)
{
    static const char *const c[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server"};
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
        if (access(c[i], X_OK) == 0)
            return c[i];
    return NULL;
}

bool pft_redis_available(void)
{
    return redis_bin() != NULL;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port == 6379 ? -1 : port;
}

int pft_redis_cmd(const struct pft_redis *r, const char *cmd)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    redisReply *rep = redisCommand(c, cmd);
    int rc = rep && rep->type != REDIS_REPLY_ERROR ? 0 : -1;
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return rc;
}

/* Answers at all (an error such as NOAUTH counts: it is up). */
static bool alive(const struct pft_redis *r)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep = c && !c->err ? redisCommand(c, "PING") : NULL;
    bool ok = rep != NULL;
    if (rep)
        freeReplyObject(rep);
    if (c)
        redisFree(c);
    return ok;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int pft_redis_start(struct pft_redis *r, const char *const *extra_args)
{
    const char *bin = redis_bin();
    if (!bin) {
        fprintf(stderr, "redis-server not found\n");
        return -1;
    }
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "/tmp/pft-redis-XXXXXX");
    if (!mkdtemp(r->dir)) {
        perror("mkdtemp");
        return -1;
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        if (port < 0)
            continue;
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *argv[64] = {
            bin,         "--port",           ports, "--bind", "127.0.0.1", "--save",
            "",          "--appendonly",     "no",  "--dir",  r->dir,      "--logfile",
            "redis.log", "--protected-mode", "no"};
        int ac = 15;
        for (int i = 0; extra_args && extra_args[i] && ac < 62; i++)
            argv[ac++] = extra_args[i];
        argv[ac] = NULL;
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with a crashed test, never left behind */
            if (chdir(r->dir) != 0)
                _exit(127);
            execv(bin, (char *const *)argv);
            _exit(127);
        }
        r->pid = pid;
        r->port = port;
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d", port);
        uint64_t deadline = now_ms() + 10000;
        while (now_ms() < deadline) {
            if (alive(r))
                return 0;
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                r->pid = 0;
                break; /* exited: port taken meanwhile? retry */
            }
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
        }
        if (r->pid) {
            fprintf(stderr, "redis-server on port %d did not answer PING within 10 s\n", port);
            pft_redis_stop(r);
            return -1;
        }
    }
    fprintf(stderr, "redis-server did not start (see %s/redis.log)\n", r->dir);
    return -1;
}

int pft_redis_kill(struct pft_redis *r)
{
    if (r->pid <= 0)
        return -1;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
    return 0;
}

int pft_redis_restart(struct pft_redis *r, const char *const *extra_args)
{
    const char *bin = redis_bin();
    pft_redis_kill(r);
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", r->port);
    const char *argv[64] = {
        bin,  "--port", ports,  "--bind",    "127.0.0.1", "--save",           "",  "--appendonly",
        "no", "--dir",  r->dir, "--logfile", "redis.log", "--protected-mode", "no"};
    int ac = 15;
    for (int i = 0; extra_args && extra_args[i] && ac < 62; i++)
        argv[ac++] = extra_args[i];
    argv[ac] = NULL;
    uint64_t deadline = now_ms() + 10000;
    /* the old socket may linger for a moment: retry the bind until the deadline */
    while (now_ms() < deadline) {
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with a crashed test, never left behind */
            if (chdir(r->dir) != 0)
                _exit(127);
            execv(bin, (char *const *)argv);
            _exit(127);
        }
        r->pid = pid;
        while (now_ms() < deadline) {
            if (alive(r))
                return 0;
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                r->pid = 0;
                break;
            }
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    fprintf(stderr, "redis-server did not restart on port %d\n", r->port);
    return -1;
}

void pft_redis_stop(struct pft_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
    if (r->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", r->dir);
        r->dir[0] = 0;
    }
}
