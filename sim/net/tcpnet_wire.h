/* TCP fabric wire format (private to sim/net; tests include it to play a misbehaving peer).
 *
 * Every integer is little-endian, encoded and decoded field by field (no struct casts), and
 * every message starts with a 32-bit magic so a stray or corrupted stream is detected at the
 * first message and the connection dropped.
 *
 * Endpoint blob (qp_local_endpoint, exchanged out of band, 28 bytes):
 *   u32 magic 'PFTE' | u16 version | u16 0 | u8 ipv4[4] (network order) | u16 port | u16 0 |
 *   u64 qp token (random, identifies the QP on its NIC)
 * Connection (one TCP connection per connected QP, opened by the requester's qp_connect):
 *   requester -> server  HELLO      u32 'PFTH' | u32 version | u64 target token | u64 own token
 *   server -> requester  HELLO_ACK  u32 'PFTA' | u32 status (0 or TCPNET_ST_*)
 *   requester -> server  READ       u32 'PFTR' | u32 rkey | u64 seq | u64 raddr | u64 len
 *   server -> requester  RESP       u32 'PFTD' | u32 status | u64 seq | u64 len, then len bytes
 *                                   (len is 0 unless status is 0)
 * The server answers READs in the order it received them. */
#ifndef PF_SIM_NET_TCPNET_WIRE_H
#define PF_SIM_NET_TCPNET_WIRE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TCPNET_VERSION     1u
#define TCPNET_EP_MAGIC    0x45544650u /* "PFTE" */
#define TCPNET_HELLO_MAGIC 0x48544650u /* "PFTH" */
#define TCPNET_ACK_MAGIC   0x41544650u /* "PFTA" */
#define TCPNET_READ_MAGIC  0x52544650u /* "PFTR" */
#define TCPNET_RESP_MAGIC  0x44544650u /* "PFTD" */

#define TCPNET_EP_LEN    28
#define TCPNET_HELLO_LEN 24
#define TCPNET_ACK_LEN   8
#define TCPNET_READ_LEN  32
#define TCPNET_RESP_LEN  24

/* Largest single READ (RDMA's message limit is 2^31 bytes). */
#define TCPNET_MAX_READ (1ull << 31)

/* Response / ack status codes (wire values). */
enum tcpnet_status {
    TCPNET_ST_OK = 0,
    TCPNET_ST_RKEY = 1,    /* no live region with that rkey on this NIC */
    TCPNET_ST_ACCESS = 2,  /* region not registered for remote read */
    TCPNET_ST_BOUNDS = 3,  /* [raddr, raddr+len) not inside the region, or bad length */
    TCPNET_ST_NOQP = 4,    /* HELLO: no such QP on this NIC */
    TCPNET_ST_QPSTATE = 5, /* HELLO: QP in error, or paired with another peer */
    TCPNET_ST_VERSION = 6, /* HELLO: unsupported version */
};

static inline void tcpnet_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void tcpnet_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void tcpnet_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t tcpnet_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static inline uint32_t tcpnet_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t tcpnet_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

struct tcpnet_ep {
    uint8_t ip[4]; /* network order */
    uint16_t port;
    uint64_t token;
};

static inline void tcpnet_ep_encode(uint8_t out[TCPNET_EP_LEN], const struct tcpnet_ep *ep)
{
    memset(out, 0, TCPNET_EP_LEN);
    tcpnet_put32(out, TCPNET_EP_MAGIC);
    tcpnet_put16(out + 4, TCPNET_VERSION);
    memcpy(out + 8, ep->ip, 4);
    tcpnet_put16(out + 12, ep->port);
    tcpnet_put64(out + 16, ep->token);
}

/* 0 or -EINVAL (wrong length, magic or version). */
static inline int tcpnet_ep_decode(const void *buf, size_t len, struct tcpnet_ep *ep_p)
{
    const uint8_t *p = buf;
    if (!buf || len != TCPNET_EP_LEN || tcpnet_get32(p) != TCPNET_EP_MAGIC ||
        tcpnet_get16(p + 4) != TCPNET_VERSION)
        return -EINVAL;
    memcpy(ep_p->ip, p + 8, 4);
    ep_p->port = tcpnet_get16(p + 12);
    ep_p->token = tcpnet_get64(p + 16);
    return 0;
}

#endif
