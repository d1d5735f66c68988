/* Namespace pairs for multi-host scenarios on one machine; see pfnetns.h. */
#include "pfnetns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int pft_netpair_setup(struct pft_netpair *p, const char *prefix, int octet)
{
    int id = (int)(getpid() % 100000);
    for (int i = 0; i < 2; i++) {
        snprintf(p->ns[i], sizeof(p->ns[i]), "%s-%c-%d", prefix, 'a' + i, id);
        snprintf(p->veth[i], sizeof(p->veth[i]), "%.4s%c%d", prefix, 'a' + i, id);
        snprintf(p->ip[i], sizeof(p->ip[i]), "10.%d.%d.%d", octet, id % 250, i + 1);
    }
    p->made = false;
    if (sh("ip netns add %s", p->ns[0]))
        return -1;
    p->made = true;
    if (sh("ip netns add %s", p->ns[1]) ||
        sh("ip link add %s netns %s type veth peer name %s netns %s", p->veth[0], p->ns[0],
           p->veth[1], p->ns[1]))
        goto err;
    for (int i = 0; i < 2; i++)
        if (sh("ip -n %s addr add %s/24 dev %s", p->ns[i], p->ip[i], p->veth[i]) ||
            sh("ip -n %s link set lo up && ip -n %s link set %s up", p->ns[i], p->ns[i],
               p->veth[i]))
            goto err;
    return 0;
err:
    pft_netpair_cleanup(p);
    return -1;
}

void pft_netpair_cleanup(struct pft_netpair *p)
{
    if (!p->made)
        return;
    p->made = false;
    for (int i = 0; i < 2; i++)
        sh("ip netns del %s 2>/dev/null", p->ns[i]);
}

void pft_netpair_cleanup_signal(struct pft_netpair *p)
{
    if (!p->made)
        return;
    p->made = false;
    for (int i = 0; i < 2; i++) {
        pid_t c = fork();
        if (c == 0) {
            execlp("ip", "ip", "netns", "del", p->ns[i], (char *)NULL);
            _exit(127);
        }
        if (c > 0)
            waitpid(c, NULL, 0);
    }
}

int pft_netns_enter(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = setns(fd, CLONE_NEWNET) ? -errno : 0;
    close(fd);
    return rc;
}

int pft_read_full(int fd, void *buf, size_t len)
{
    uint8_t *b = buf;
    while (len) {
        ssize_t n = read(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

int pft_write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *b = buf;
    while (len) {
        ssize_t n = write(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        b += n;
        len -= (size_t)n;
    }
    return 0;
}
