/* libpegaflow: C client of the PegaFlow Engine API.
 *
 * Used by the Python connector (through ctypes: plain C types only, no protobuf in the
 * caller), by tests and by tools. Every call takes a deadline in milliseconds (more than a
 * day counts as a day, so UINT64_MAX means "no practical limit"). Functions
 * return 0 or -errno; on failure the gRPC status code and message of the last failed call
 * on this thread are available from pf_last_error_code() / pf_last_error_message().
 *   -ECONNREFUSED  server unreachable (UNAVAILABLE)
 *   -ETIMEDOUT     deadline exceeded
 *   -EINVAL        the server rejected an argument (INVALID_ARGUMENT)
 *   -EPERM         failed precondition (unknown instance, version mismatch, ...)
 *   -EIO           server-side internal error
 * A struct pf_client is thread-safe: calls from several threads run concurrently. */
#ifndef PEGAFLOW_H
#define PEGAFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PF_LEASE_LEN 16

struct pf_client;

/* Library version: the string RegisterContextBatch requires as client_version. */
const char *pf_client_version(void);

/* target: "host:port", "http://host:port" or "unix:PATH" (a server's --local-addr). The
 * connection is made lazily. Security comes from the environment (docs/security.md):
 * PEGAFLOW_TLS_CA (TLS, verify the server with this CA), PEGAFLOW_TLS_CERT + PEGAFLOW_TLS_KEY
 * (client certificate for mutual TLS), PEGAFLOW_TOKEN_FILE (cluster token); an unreadable
 * file fails the connect with INVALID_ARGUMENT. */
int pf_client_connect(const char *target, struct pf_client **c_p);
void pf_client_close(struct pf_client *c);

int pf_client_health(struct pf_client *c, uint64_t timeout_ms);
int pf_client_shutdown(struct pf_client *c, uint64_t timeout_ms);

/* ------------------------------------------------------------------ Engine RPCs */

/* One registered layer of RegisterContextBatch. */
struct pf_layer_desc {
    const char *name;
    const uint8_t *ipc; /* serialized IpcTensor (pf_client_ipc_* / pf_simkv_ipc build it) */
    size_t ipc_len;
    uint64_t num_blocks;
    uint64_t bytes_per_block; /* bytes of ONE segment (K alone when K/V are split) */
    uint64_t kv_stride_bytes; /* distance from a block's K to its V; 0 = one segment */
    uint32_t segments;        /* 1 or 2 */
    uint32_t group_id;        /* storage group (layer_group_ids); 0 */
};

struct pf_register_args {
    const char *instance_id;
    const char *namespace_;
    uint32_t tp_rank, tp_size, world_size, pp_rank;
    int32_t device_id;
    int transfer_mode; /* 0 = TRANSFER_MODE_DIRECT, 1 = TRANSFER_MODE_KERNEL */
    int page_first;
    const char *client_version; /* NULL = pf_client_version() */
    const struct pf_layer_desc *layers;
    size_t nlayers;
};

int pf_client_register(struct pf_client *c, const struct pf_register_args *a, uint64_t timeout_ms);

/* Hash lists are passed as one concatenated buffer: hash i is
 * hashes[off_i .. off_i + len_i) where len_i = hash_lens ? hash_lens[i] : hash_len and
 * off_i is the sum of the previous lengths. */
struct pf_save_layer {
    const char *name;
    const uint32_t *block_ids;
    const uint8_t *hashes;
    const uint32_t *hash_lens; /* NULL: every hash is hash_len bytes */
    uint32_t hash_len;
    size_t n;
};

int pf_client_save(struct pf_client *c, const char *instance_id, uint32_t tp_rank, uint32_t pp_rank,
                   int32_t device_id, const struct pf_save_layer *layers, size_t nlayers,
                   uint64_t timeout_ms);

struct pf_query_result {
    int loading; /* 1: the server is fetching (SSD/peer); ask again */
    uint32_t num_hit_blocks;
    uint32_t lease_len; /* 0 when no lease (0 hits) */
    uint8_t lease[PF_LEASE_LEN];
    uint32_t nhit_positions; /* total reported by the server */
};

/* QueryPrefetch. hit_positions (may be NULL) receives up to hit_cap positions. */
int pf_client_query(struct pf_client *c, const char *instance_id, const char *req_id,
                    const uint8_t *hashes, const uint32_t *hash_lens, uint32_t hash_len, size_t n,
                    int wait_for_full_prefix, uint32_t group_id, struct pf_query_result *out,
                    uint32_t *hit_positions, size_t hit_cap, uint64_t timeout_ms);

int pf_client_release(struct pf_client *c, const uint8_t *lease, uint32_t lease_len,
                      uint64_t timeout_ms);

/* One lease of a Load: destination block ids per layer group, concatenated over groups
 * (group g has group_counts[g] entries); -1 = no destination for that logical block. */
struct pf_load_item {
    const uint8_t *lease;
    uint32_t lease_len;
    const int64_t *targets;
    const size_t *group_counts;
};

/* Load. Layer groups: group g holds group_sizes[g] names of layer_names (concatenated).
 * Returns once the copies are submitted; completion is reported in the load-state record
 * named load_state_shm (pf_loadstate_*). */
int pf_client_load(struct pf_client *c, const char *instance_id, uint32_t tp_rank,
                   int32_t device_id, const char *load_state_shm, const char *const *layer_names,
                   const size_t *group_sizes, size_t ngroups, const struct pf_load_item *items,
                   size_t nitems, uint64_t timeout_ms);

int pf_client_unregister(struct pf_client *c, const char *instance_id, uint64_t timeout_ms);

/* Liveness Session stream: held open until pf_client_session_close; when this process
 * dies the server cleans the instance up. */
struct pf_session;
int pf_client_session_open(struct pf_client *c, const char *instance_id, const char *namespace_,
                           uint32_t tp_size, uint32_t world_size, uint64_t timeout_ms,
                           struct pf_session **s_p);
/* A watch Session (a vLLM worker's): the same stream, but it owns no instance; it ends when
 * the server process does (kill, restart), which tells the worker to register again and
 * that no load of that process can still copy. instance_id is only logged (may be NULL).
 * Close it with pf_client_session_close. */
int pf_client_watch_open(struct pf_client *c, const char *instance_id, uint64_t timeout_ms,
                         struct pf_session **s_p);
/* Forgets the connection's reconnect backoff (gRPC's grows to seconds while a server is
 * down): the next call connects at once. A worker polling for its restarted server calls
 * it before each attempt. */
void pf_client_reconnect(struct pf_client *c);
/* 1 while the server keeps the stream open, 0 once it ended it. */
int pf_client_session_alive(struct pf_session *s);
void pf_client_session_close(struct pf_session *s);

/* ------------------------------------------------------------------ load state */

/* The load_state_shm record: POSIX shm "/pega_load_<32 hex>", 8-byte offset prefix, then
 * {u32 magic 'PFLD', u32 version 1, i64 state}; state 0 pending, 1 success, -1 error,
 * 2 cancel asked (the client's pf_loadstate_cancel), -2 cancelled (the server's
 * confirmation: it stopped before a copy chunk). 1, -1 and -2 are final: after one of them
 * no byte of the load reaches the GPU. */
struct pf_loadstate;
int pf_loadstate_create(struct pf_loadstate **ls_p);
/* Name to pass as load_state_shm (without the leading '/'; the server accepts both). */
const char *pf_loadstate_name(const struct pf_loadstate *ls);
int64_t pf_loadstate_get(const struct pf_loadstate *ls);
/* Waits until the state is final: returns it (1, -1 or -2), or the pending value (0 or 2)
 * on timeout. */
int64_t pf_loadstate_wait(const struct pf_loadstate *ls, uint64_t timeout_ms);
/* Asks the server to stop the load (0 -> 2, atomically). Returns 2 when asked (now or
 * before), or the final value it found. Only a final value read afterwards (wait) says
 * the server stopped copying. */
int64_t pf_loadstate_cancel(struct pf_loadstate *ls);
/* Unmaps and unlinks. Accepts NULL. */
void pf_loadstate_destroy(struct pf_loadstate *ls);

/* ------------------------------------------------------------------ IpcTensor builders */

/* Serialized IpcTensor for a CUDA allocation (16-byte device UUID, 64-byte IPC handle).
 * Returns 0, or -ENOSPC when cap is too small (*len_p = needed). */
int pf_client_ipc_cuda(const uint8_t uuid[16], const uint8_t handle[64], uint64_t offset,
                       uint64_t size, uint8_t *buf, size_t cap, size_t *len_p);
/* Serialized IpcTensor for sim GPU memory: a POSIX shm object name ("/..."). */
int pf_client_ipc_sim(const char *shm_name, int sim_device, uint64_t offset, uint64_t size,
                      uint8_t *buf, size_t cap, size_t *len_p);

/* Sim "GPU" KV memory for tests and the Python sim adapter: a POSIX shm object of `bytes`
 * bytes mapped into this process (the client writes and reads it as if it were the GPU). */
struct pf_simkv;
int pf_simkv_create(uint64_t bytes, int sim_device, struct pf_simkv **kv_p);
void *pf_simkv_ptr(const struct pf_simkv *kv);
uint64_t pf_simkv_size(const struct pf_simkv *kv);
const char *pf_simkv_name(const struct pf_simkv *kv);
int pf_simkv_ipc(const struct pf_simkv *kv, uint64_t offset, uint64_t size, uint8_t *buf,
                 size_t cap, size_t *len_p);
/* Unmaps and unlinks (a server that mapped it keeps its mapping). Accepts NULL. */
void pf_simkv_destroy(struct pf_simkv *kv);

/* gRPC status code (0 = OK) and message of this thread's last failed call. */
int pf_last_error_code(void);
const char *pf_last_error_message(void);

#ifdef __cplusplus
}
#endif

#endif
