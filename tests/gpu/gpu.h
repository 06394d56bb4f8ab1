/*
 * Shared helpers of the GPU test programs (real CUDA, no cmocka): CHECK
 * records a failure and goes on, each program ends with gpu_summary(), which
 * prints "name: N checks, M failed" for run.sh to add up.
 */
#ifndef DRC_GPU_H
#define DRC_GPU_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int gpu_checks, gpu_failed;

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        gpu_checks++;                                                                \
        if (!(cond)) {                                                               \
            gpu_failed++;                                                            \
            printf("  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                 \
            printf(__VA_ARGS__);                                                     \
            printf("\n");                                                            \
        }                                                                            \
    } while (0)

#define CU(call)                                                                     \
    do {                                                                             \
        CUresult cu_rc_ = (call);                                                    \
        if (cu_rc_ != CUDA_SUCCESS) {                                                \
            const char *cu_s_ = "?";                                                 \
            cuGetErrorName(cu_rc_, &cu_s_);                                          \
            printf("  FATAL %s:%d: %s = %s\n", __FILE__, __LINE__, #call, cu_s_);    \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static inline double gpu_now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline int gpu_summary(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, gpu_checks, gpu_failed);
    return gpu_failed != 0;
}

#endif
