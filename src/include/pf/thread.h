/* Threads and queues.
 *
 * pf_thread_start: pthread_create + a visible thread name (<= 15 chars, truncated) and an
 * optional NUMA node binding (-1 = none; binding failures are logged once, not fatal).
 *
 * struct pf_queue: a FIFO of pointers protected by a mutex. Bounded (cap > 0: try_push fails
 * with -EAGAIN when full, never blocks) or unbounded (cap == 0: grows). pop waits with a
 * timeout. After close, pushes fail with -ESHUTDOWN and pops drain what is left, then return
 * -ESHUTDOWN. All functions are thread-safe. */
#ifndef PF_THREAD_H
#define PF_THREAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int pf_thread_start(pthread_t *t_p, const char *name, int numa_node, void *(*fn)(void *),
                    void *arg);
/* Binds the calling thread's CPUs (and preferred memory) to a NUMA node. 0 or -errno. */
int pf_thread_bind_numa(int node);

struct pf_queue {
    pthread_mutex_t mu;
    pthread_cond_t not_empty;
    void **ring;
    size_t cap;  /* bound (0 = unbounded) */
    size_t size; /* ring allocation */
    size_t head, count;
    bool closed;
};

int pf_queue_init(struct pf_queue *q, size_t cap);
void pf_queue_destroy(struct pf_queue *q);
/* 0, -EAGAIN (full), -ESHUTDOWN (closed) or -ENOMEM (unbounded growth failed). */
int pf_queue_push(struct pf_queue *q, void *item);
/* Waits up to timeout_ms (UINT64_MAX = forever). 0, -ETIMEDOUT or -ESHUTDOWN. */
int pf_queue_pop(struct pf_queue *q, void **item_p, uint64_t timeout_ms);
/* Moves up to max items into out without waiting; returns how many. */
size_t pf_queue_drain(struct pf_queue *q, void **out, size_t max);
size_t pf_queue_len(struct pf_queue *q);
void pf_queue_close(struct pf_queue *q);

#endif
