/* The load_state_shm record (reference §3.6): a POSIX shm object created by the client;
 * bytes 0..8 hold the native-endian offset of an 8-byte aligned record
 * {u32 magic 'PFLD', u32 version 1, i64 state}. The server opens it by name, validates
 * everything before trusting it, and stores the final state with one pwrite after the
 * copies completed (the copies are ordered before it by the completion path). The client
 * may ask to cancel by storing CANCEL_REQ (2) over PENDING; the load thread reads the state
 * before each chunk of copies and stops there, confirming with CANCELLED (-2). The object
 * is never mapped: a client that shrinks it cannot fault the server. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h> /* shm_open */
#include <sys/stat.h>
#include <unistd.h>

#define PF_LOG_MOD "load"
#include "engine/loadstate.h"
#include "pf/log.h"

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
        goto err_close;
    }
    /* read with pread, never mmap: the client owns the object and may shrink it at any
     * time; a mapping would turn that into SIGBUS in the server */
    uint64_t off;
    if (pread(fd, &off, sizeof(off), 0) != (ssize_t)sizeof(off)) {
        snprintf(err, errlen, "load_state_shm %s: cannot read the record offset", path);
        rc = -EINVAL;
        goto err_close;
    }
    if (off < 8 || off % 8 != 0 || off > (uint64_t)st.st_size - 16) {
        snprintf(err, errlen, "load_state_shm %s: bad record offset %llu", path,
                 (unsigned long long)off);
        rc = -EINVAL;
        goto err_close;
    }
    uint32_t hdr[2];
    if (pread(fd, hdr, sizeof(hdr), (off_t)off) != (ssize_t)sizeof(hdr) || hdr[0] != PFLD_MAGIC ||
        hdr[1] != 1) {
        snprintf(err, errlen, "load_state_shm %s: bad magic/version (0x%08x/%u)", path, hdr[0],
                 hdr[1]);
        rc = -EINVAL;
        goto err_close;
    }
    m->fd = fd;
    m->state_off = (off_t)off + 8;
    return 0;
err_close:
    close(fd);
    return rc;
}

void pf_loadstate_set(struct pf_loadstate_map *m, int64_t v)
{
    if (m->fd < 0)
        return;
    /* one aligned 8-byte write into the object's page: the client polling its mapping sees
     * either the old or the new value. A client that truncated the object meanwhile gets
     * a hole or nothing; pwrite cannot fault the server. */
    if (pwrite(m->fd, &v, sizeof(v), m->state_off) != (ssize_t)sizeof(v))
        pf_log_ratelimited(PF_LOG_WARN, 1000, "cannot write load_state_shm: %s", strerror(errno));
}

bool pf_loadstate_cancel_requested(const struct pf_loadstate_map *m)
{
    int64_t v;
    if (m->fd < 0)
        return false;
    /* an aligned 8-byte read of the page the client stores into atomically: old or new */
    if (pread(m->fd, &v, sizeof(v), m->state_off) != (ssize_t)sizeof(v))
        return false;
    return v == PF_LOADSTATE_CANCEL_REQ;
}

void pf_loadstate_init(struct pf_loadstate_map *m)
{
    m->fd = -1;
    m->state_off = 0;
}

void pf_loadstate_detach(struct pf_loadstate_map *m)
{
    if (m->fd >= 0)
        close(m->fd);
    m->fd = -1;
}
