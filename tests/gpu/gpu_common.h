/* Helpers shared by the GPU check programs (header-only): seeded byte patterns, a
 * monotonic clock, CUDA call checking that exits with a message. */
#ifndef PF_TESTS_GPU_COMMON_H
#define PF_TESTS_GPU_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

static inline uint64_t gc_splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Fills buf with the pseudo-random bytes of (seed, stream): byte i is a function of the
 * seed, the stream and i only, so any program can regenerate any part. */
static inline void gc_fill(void *buf, uint64_t len, uint64_t seed, uint64_t stream)
{
    uint8_t *p = buf;
    uint64_t key = gc_splitmix(seed ^ gc_splitmix(stream));
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = gc_splitmix(key + i / 8);
        memcpy(p + i, &v, 8);
    }
    if (i < len) {
        uint64_t v = gc_splitmix(key + i / 8);
        memcpy(p + i, &v, (size_t)(len - i));
    }
}

static inline double gc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double gc_gbps(uint64_t bytes, double secs)
{
    return secs > 0 ? (double)bytes / secs / 1e9 : 0.0;
}

#define GC_CUDA(expr)                                                                              \
    do {                                                                                           \
        cudaError_t gc_e_ = (expr);                                                                \
        if (gc_e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "FAIL: %s:%d: %s: %s (CUDA error %d)\n", __FILE__, __LINE__, #expr,    \
                    cudaGetErrorString(gc_e_), (int)gc_e_);                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline void gc_uuid_str(const uint8_t *u, char *out, size_t len)
{
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* Pinned cudaMemcpy of bytes in both directions on the current device: the ceiling the
 * backend's copies are compared with. Best of reps. */
static inline void gc_memcpy_baseline(uint64_t bytes, int reps, double *d2h_p, double *h2d_p)
{
    void *h = NULL, *d = NULL;
    GC_CUDA(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
    GC_CUDA(cudaMalloc(&d, bytes));
    memset(h, 1, bytes);
    GC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice)); /* warm up both ways */
    GC_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    double best_d2h = 0, best_h2d = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = gc_now();
        GC_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
        double t1 = gc_now();
        GC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        double t2 = gc_now();
        if (gc_gbps(bytes, t1 - t0) > best_d2h)
            best_d2h = gc_gbps(bytes, t1 - t0);
        if (gc_gbps(bytes, t2 - t1) > best_h2d)
            best_h2d = gc_gbps(bytes, t2 - t1);
    }
    GC_CUDA(cudaFree(d));
    GC_CUDA(cudaFreeHost(h));
    *d2h_p = best_d2h;
    *h2d_p = best_h2d;
}

#endif
