/* The load_state_shm record (reference §3.6): a POSIX shm object created by the client;
 * bytes 0..8 hold the native-endian offset of an 8-byte aligned record
 * {u32 magic 'PFLD', u32 version 1, i64 state}. The server attaches by name, validates
 * everything before trusting it, and stores the final state with release semantics. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/loadstate.h"

#define PFLD_MAGIC 0x50464C44u

int pf_loadstate_attach(const char *name, struct pf_loadstate_map *m, char *err, size_t errlen)
{
    char path[256];
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > 200) {
        snprintf(err, errlen, "load_state_shm name is empty or too long");
        return -EINVAL;
    }
    const char *base = name[0] == '/' ? name + 1 : name;
    for (const char *p = base; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.')) {
            snprintf(err, errlen, "load_state_shm name '%s' has invalid characters", name);
            return -EINVAL;
        }
    }
    snprintf(path, sizeof(path), "/%s", base);
    int fd = shm_open(path, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open load_state_shm %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || st.st_size < 24 || st.st_size > (1 << 20)) {
        snprintf(err, errlen, "load_state_shm %s has a wrong size (%lld bytes)", path,
                 (long long)st.st_size);
        rc = -EINVAL;
        goto out;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        snprintf(err, errlen, "cannot map load_state_shm %s: %s", path, strerror(-rc));
        goto out;
    }
    uint64_t off;
    memcpy(&off, p, sizeof(off));
    if (off < 8 || off % 8 != 0 || off > (uint64_t)st.st_size - 16) {
        snprintf(err, errlen, "load_state_shm %s: bad record offset %llu", path,
                 (unsigned long long)off);
        munmap(p, (size_t)st.st_size);
        rc = -EINVAL;
        goto out;
    }
    uint32_t hdr[2];
    memcpy(hdr, (char *)p + off, sizeof(hdr));
    if (hdr[0] != PFLD_MAGIC || hdr[1] != 1) {
        snprintf(err, errlen, "load_state_shm %s: bad magic/version (0x%08x/%u)", path, hdr[0],
                 hdr[1]);
        munmap(p, (size_t)st.st_size);
        rc = -EINVAL;
        goto out;
    }
    m->base = p;
    m->len = (size_t)st.st_size;
    m->state = (_Atomic int64_t *)((char *)p + off + 8);
out:
    close(fd);
    return rc;
}

void pf_loadstate_set(struct pf_loadstate_map *m, int64_t v)
{
    if (m->state)
        atomic_store_explicit(m->state, v, memory_order_release);
}

void pf_loadstate_detach(struct pf_loadstate_map *m)
{
    if (m->base)
        munmap(m->base, m->len);
    m->base = NULL;
    m->state = NULL;
}
