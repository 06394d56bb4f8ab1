/*
 * The RECORDING BACKEND of the GPU test programs: a double for a NIC (the GPU
 * machine has none). reg() records its arguments, reads the size of the
 * dmabuf fd it was handed from /proc/self/fdinfo (so offsets and lengths are
 * checked against what CUDA really exported) and the CUDA buffer id of the
 * first byte (so a test can tell which allocation a region was made for);
 * it registers nothing. Thread-safe: reg and dereg may run in many threads.
 */
#ifndef DRC_GPU_RECBACKEND_H
#define DRC_GPU_RECBACKEND_H

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drc.h"
#include "gpu.h"

enum { REC_MAX = 256 };

struct rec {
    int calls, deregs;                  /* atomic */
    struct drc_reg_args a[REC_MAX];     /* the first REC_MAX registrations */
    long fd_size[REC_MAX];              /* fdinfo size of the dmabuf fd at reg() time, -1 without fd */
};

struct rec_mr {                         /* what a handle points to */
    unsigned long long buffer_id;
};

static inline long rec_fdinfo_size(int fd)
{
    char path[64], line[256];
    long size = -1;
    FILE *f;

    if (fd < 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
    if (!(f = fopen(path, "r")))
        return -2;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "size: %ld", &size) == 1)
            break;
    fclose(f);
    return size;
}

static inline int rec_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct rec *r = ctx;
    int i = __atomic_fetch_add(&r->calls, 1, __ATOMIC_RELAXED);
    struct rec_mr *mr = calloc(1, sizeof(*mr));

    if (!mr)
        return -12;
    if (i < REC_MAX) {
        r->a[i] = *a;
        r->fd_size[i] = rec_fdinfo_size(a->dmabuf_fd);
    }
    if (a->type == DRC_MEM_CUDA)
        cuPointerGetAttribute(&mr->buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)a->start);
    *handle = mr;
    *lkey = *rkey = (uint32_t)i + 1;
    return 0;
}

static inline int rec_dereg(void *ctx, void *handle)
{
    __atomic_fetch_add(&((struct rec *)ctx)->deregs, 1, __ATOMIC_RELAXED);
    free(handle);
    return 0;
}

/* The buffer id of the memory a region was registered on. */
static inline unsigned long long rec_buffer_id(const drc_region_t *reg)
{
    return ((const struct rec_mr *)drc_region_handle(reg))->buffer_id;
}

static inline drc_cache_t *rec_cache(struct rec *r, unsigned flags)
{
    struct drc_backend be = { .reg = rec_reg, .dereg = rec_dereg, .ctx = r };
    struct drc_config cfg = { .flags = flags, .policy = DRC_DMABUF_THEN_PEERMEM };
    drc_cache_t *c = NULL;

    memset(r, 0, sizeof(*r));
    if (drc_cache_create(&be, &cfg, &c))
        exit(2);
    return c;
}

static inline void rec_done(drc_cache_t *c)
{
    int e = drc_cache_destroy(c);

    CHECK(e == 0, "destroy: %s", drc_strerror(e));
}

#endif
