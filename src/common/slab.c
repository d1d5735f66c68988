/* Huge-page backed size classes for blocks (see pf/slab.h). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pf/slab.h"

#define CHUNK   (2u << 20)
#define GRAIN   PF_SLAB_GRAIN
#define NCLASS  (PF_SLAB_MAX / GRAIN)
#define BIG_MIN (1u << 20)

struct free_obj {
    struct free_obj *next;
};

struct klass {
    pthread_mutex_t mu;
    struct free_obj *free;
    char *cur, *end; /* bump region of the current chunk */
};

static struct klass classes[NCLASS];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (size_t i = 0; i < NCLASS; i++)
        pthread_mutex_init(&classes[i].mu, NULL);
}

static void *chunk_new(void)
{
    /* 2 MiB aligned so the kernel can back it with one huge page */
    char *p = mmap(NULL, 2 * CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    munmap(a + CHUNK, (size_t)(p + 2 * CHUNK - (a + CHUNK)));
    madvise(a, CHUNK, MADV_HUGEPAGE);
    return a;
}

/* Under AddressSanitizer objects go through malloc so use-after-free stays detectable. */
#if defined(__SANITIZE_ADDRESS__)
#define SLAB_BYPASS 1
#else
#define SLAB_BYPASS 0
#endif

void *pf_slab_alloc(size_t size)
{
    if (size > SIZE_MAX - (GRAIN - 1))
        return NULL; /* would round up to 0 */
    size_t r = (size + GRAIN - 1) & ~(size_t)(GRAIN - 1);
    if (SLAB_BYPASS || r == 0 || r > PF_SLAB_MAX) {
        void *p = aligned_alloc(GRAIN, r ? r : GRAIN);
        if (p)
            memset(p, 0, r ? r : GRAIN);
        return p;
    }
    pthread_once(&once, init);
    struct klass *k = &classes[r / GRAIN - 1];
    void *p = NULL;
    pthread_mutex_lock(&k->mu);
    if (k->free) {
        p = k->free;
        k->free = k->free->next;
    } else {
        if (!k->cur || (size_t)(k->end - k->cur) < r) {
            char *c = chunk_new();
            if (c) {
                k->cur = c;
                k->end = c + CHUNK;
            }
        }
        if (k->cur && (size_t)(k->end - k->cur) >= r) {
            p = k->cur;
            k->cur += r;
        }
    }
    pthread_mutex_unlock(&k->mu);
    if (p)
        memset(p, 0, r);
    return p;
}

void pf_slab_free(void *p, size_t size)
{
    if (!p)
        return;
    size_t r = (size + GRAIN - 1) & ~(size_t)(GRAIN - 1);
    if (SLAB_BYPASS || r == 0 || r > PF_SLAB_MAX) {
        free(p);
        return;
    }
    struct klass *k = &classes[r / GRAIN - 1];
    struct free_obj *o = p;
    pthread_mutex_lock(&k->mu);
    o->next = k->free;
    k->free = o;
    pthread_mutex_unlock(&k->mu);
}

void *pf_big_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    size_t bytes = n * size;
    if (bytes < BIG_MIN)
        return calloc(n, size);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void pf_big_free(void *p, size_t n, size_t size)
{
    if (!p)
        return;
    size_t bytes = n * size;
    if (bytes < BIG_MIN)
        free(p);
    else
        munmap(p, bytes);
}
