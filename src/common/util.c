/* Randomness (getrandom), UUID v4, errno names, xxh3 hashing and checksums. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pf/util.h"

int pf_random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int pf_uuid_v4(uint8_t out[16])
{
    int rc = pf_random_bytes(out, 16);
    if (rc)
        return rc;
    out[6] = (uint8_t)((out[6] & 0x0f) | 0x40);
    out[8] = (uint8_t)((out[8] & 0x3f) | 0x80);
    return 0;
}

void pf_uuid_format(const uint8_t in[16], char out[PF_UUID_STR_LEN])
{
    static const char hex[] = "0123456789abcdef";
    size_t j = 0;
    for (size_t i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[j++] = '-';
        out[j++] = hex[in[i] >> 4];
        out[j++] = hex[in[i] & 15];
    }
    out[j] = '\0';
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int pf_uuid_parse(const char *s, uint8_t out[16])
{
    size_t len = strlen(s);
    bool hyph = len == 36;
    if (len != 36 && len != 32)
        return -EINVAL;
    uint8_t tmp[16];
    size_t j = 0;
    for (size_t i = 0; i < 16; i++) {
        if (hyph && (i == 4 || i == 6 || i == 8 || i == 10)) {
            if (s[j] != '-')
                return -EINVAL;
            j++;
        }
        int hi = hexval((unsigned char)s[j]), lo = hexval((unsigned char)s[j + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        tmp[i] = (uint8_t)(hi << 4 | lo);
        j += 2;
    }
    memcpy(out, tmp, 16);
    return 0;
}

void pf_hex_encode(const void *in, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[p[i] >> 4];
        out[2 * i + 1] = hex[p[i] & 15];
    }
    out[2 * n] = '\0';
}

#define E(x)                                                                                       \
    {                                                                                              \
#x, x                                                                                      \
    }
static const struct {
    const char *name;
    int val;
} errnames[] = {
    E(EPERM),     E(ENOENT),      E(EINTR),           E(EIO),          E(ENXIO),
    E(E2BIG),     E(EBADF),       E(EAGAIN),          E(ENOMEM),       E(EACCES),
    E(EFAULT),    E(EBUSY),       E(EEXIST),          E(ENODEV),       E(EINVAL),
    E(ENFILE),    E(EMFILE),      E(EFBIG),           E(ENOSPC),       E(ESPIPE),
    E(EROFS),     E(EPIPE),       E(ERANGE),          E(ENOSYS),       E(ENODATA),
    E(ETIME),     E(EPROTO),      E(EBADMSG),         E(EOVERFLOW),    E(EILSEQ),
    E(ENOTSOCK),  E(EMSGSIZE),    E(ENOTSUP),         E(EOPNOTSUPP),   E(EADDRINUSE),
    E(ENETDOWN),  E(ENETUNREACH), E(ECONNABORTED),    E(ECONNRESET),   E(ENOBUFS),
    E(EISCONN),   E(ENOTCONN),    E(ETIMEDOUT),       E(ECONNREFUSED), E(EHOSTUNREACH),
    E(EALREADY),  E(EINPROGRESS), E(ESTALE),          E(ECANCELED),    E(EREMOTEIO),
    E(EHWPOISON), E(ESHUTDOWN),   E(ENOTRECOVERABLE),
};
#undef E

int pf_errno_parse(const char *name, int *err_p)
{
    for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++) {
        if (strcasecmp(name, errnames[i].name) == 0) {
            *err_p = errnames[i].val;
            return 0;
        }
    }
    char *end;
    errno = 0;
    long v = strtol(name, &end, 10);
    if (*name && !*end && errno == 0 && v > 0 && v < 4096) {
        *err_p = (int)v;
        return 0;
    }
    return -EINVAL;
}

const char *pf_errno_name(int err)
{
    if (err < 0)
        err = -err;
    for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
        if (errnames[i].val == err)
            return errnames[i].name;
    return "E?";
}

uint64_t pf_hash64(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

uint64_t pf_hash64_seed(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

int pf_checksum_init(struct pf_checksum *c)
{
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return -ENOMEM;
    XXH3_64bits_reset(s);
    c->state = s;
    return 0;
}

void pf_checksum_update(struct pf_checksum *c, const void *data, size_t len)
{
    XXH3_64bits_update(c->state, data, len);
}

uint64_t pf_checksum_final(struct pf_checksum *c)
{
    return XXH3_64bits_digest(c->state);
}

void pf_checksum_destroy(struct pf_checksum *c)
{
    if (c && c->state) {
        XXH3_freeState(c->state);
        c->state = NULL;
    }
}

char *pf_strtrim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}
