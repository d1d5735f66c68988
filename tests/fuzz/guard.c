/* Linked into every fuzz target (mk/fuzz.mk wraps the calls with -Wl,--wrap=...): fuzzed
 * input must never make the project's code reach outside this machine.
 *   getaddrinfo  only numeric hosts and "localhost" are resolved (a fuzzed host name would
 *                otherwise become a DNS query to the configured resolver)
 *   connect      only loopback destinations (127/8, ::1) and AF_UNIX; anything else fails
 *                with ENETUNREACH
 * The wrap applies to calls from the project's objects only, which is every call a fuzzed
 * input can steer.
 * It also makes LeakSanitizer see pointers the project keeps outside the malloc heap:
 *   mmap         private anonymous mappings (slab chunks, pf_big_calloc, the pool arena) are
 *                registered as LSan root regions. libFuzzer checks for leaks between inputs,
 *                while the engine still caches blocks whose only references live in slab
 *                memory; without this every cached block would be reported as leaked.
 *                Regions are never unregistered: LSan scans only what is still mapped. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sanitizer/lsan_interface.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

int __real_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                       struct addrinfo **res);
int __wrap_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                       struct addrinfo **res);
int __real_connect(int fd, const struct sockaddr *addr, socklen_t len);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len);

int __wrap_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                       struct addrinfo **res)
{
    struct addrinfo h = {0};
    if (hints)
        h = *hints;
    if (node && strcmp(node, "localhost") == 0)
        node = "127.0.0.1";
    h.ai_flags |= AI_NUMERICHOST;
    return __real_getaddrinfo(node, service, &h, res);
}

static int is_loopback(const struct sockaddr *addr, socklen_t len)
{
    if (!addr)
        return 0;
    if (addr->sa_family == AF_UNIX)
        return 1;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
    }
    return 0;
}

int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    if (!is_loopback(addr, len)) {
        errno = ENETUNREACH;
        return -1;
    }
    return __real_connect(fd, addr, len);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    void *p = __real_mmap(addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED && (flags & MAP_ANONYMOUS) && (flags & MAP_PRIVATE) && (prot & PROT_READ))
        __lsan_register_root_region(p, len);
    return p;
}
