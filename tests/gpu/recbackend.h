/*
 * The RECORDING BACKEND of the GPU test programs: a double for a NIC (the GPU
 * machine has none). reg() records its arguments, reads the size of the
 * dmabuf fd it was handed from /proc/self/fdinfo (so offsets and lengths are
 * checked against what CUDA really exported) and the CUDA buffer id of the
 * first byte (so a test can tell which allocation a region was made for);
 * it registers nothing. Each registration has a number (rec_id: 1, 2, ...,
 * never reused). Made with rec_cache_hold(), it also keeps a copy of each
 * dmabuf fd until the deregistration, as an MR holds the buffer (the freed
 * memory then stays taken, as with a NIC). Like ibv_reg_mr, it refuses host
 * memory it cannot read (-EFAULT): a get that classifies device memory
 * between its free and its reallocation asks for a host registration of the
 * freed VA, which a NIC would refuse too. Thread-safe: reg and dereg may run
 * in many threads.
 */
#ifndef DRC_GPU_RECBACKEND_H
#define DRC_GPU_RECBACKEND_H

#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "drc.h"
#include "gpu.h"

enum { REC_MAX = 256 };

struct rec {
    int calls, deregs, exported;        /* atomic; exported: registrations handed a dmabuf fd */
    int hold;                           /* keep a copy of each dmabuf fd while registered */
    struct drc_reg_args a[REC_MAX];     /* the first REC_MAX registrations */
    long fd_size[REC_MAX];              /* fdinfo size of the dmabuf fd at reg() time, -1 without fd */
};

struct rec_mr {                         /* what a handle points to */
    unsigned long long buffer_id;
    int id;                             /* 1 + the registration's number */
    int fd;                             /* the held copy of the dmabuf fd, or -1 */
};

/* What ibv_reg_mr does with host memory: pinning fails where the process cannot read. */
static inline int rec_readable(uintptr_t p)
{
    char b;
    struct iovec local = { &b, 1 }, remote = { (void *)p, 1 };

    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1;
}

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
    struct rec_mr *mr;
    int i;

    if (a->type == DRC_MEM_HOST && !rec_readable(a->start))
        return -EFAULT;
    if (!(mr = calloc(1, sizeof(*mr))))
        return -ENOMEM;
    i = __atomic_fetch_add(&r->calls, 1, __ATOMIC_RELAXED);
    mr->id = i + 1;
    mr->fd = r->hold && a->dmabuf_fd >= 0 ? dup(a->dmabuf_fd) : -1;
    if (a->dmabuf_fd >= 0)
        __atomic_fetch_add(&r->exported, 1, __ATOMIC_RELAXED);
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
    struct rec_mr *mr = handle;

    if (mr->fd >= 0)
        close(mr->fd);
    __atomic_fetch_add(&((struct rec *)ctx)->deregs, 1, __ATOMIC_RELAXED);
    free(mr);
    return 0;
}

/* The buffer id of the memory a region was registered on. */
static inline unsigned long long rec_buffer_id(const drc_region_t *reg)
{
    return ((const struct rec_mr *)drc_region_handle(reg))->buffer_id;
}

/* The registration's number (1, 2, ...: never reused, unlike a handle's address). */
static inline int rec_id(const drc_region_t *reg)
{
    return ((const struct rec_mr *)drc_region_handle(reg))->id;
}

/* The dmabuf fd the backend holds for the region (rec_cache_hold), or -1. */
static inline int rec_fd(const drc_region_t *reg)
{
    return ((const struct rec_mr *)drc_region_handle(reg))->fd;
}

static inline drc_cache_t *rec_cache_opts(struct rec *r, unsigned flags, int hold)
{
    struct drc_backend be = { .reg = rec_reg, .dereg = rec_dereg, .ctx = r };
    struct drc_config cfg = { .flags = flags, .policy = DRC_DMABUF_THEN_PEERMEM };
    drc_cache_t *c = NULL;

    memset(r, 0, sizeof(*r));
    r->hold = hold;
    if (drc_cache_create(&be, &cfg, &c))
        exit(2);
    return c;
}

static inline drc_cache_t *rec_cache(struct rec *r, unsigned flags)
{
    return rec_cache_opts(r, flags, 0);
}

static inline drc_cache_t *rec_cache_hold(struct rec *r, unsigned flags)
{
    return rec_cache_opts(r, flags, 1);
}

static inline void rec_done(drc_cache_t *c)
{
    int e = drc_cache_destroy(c);

    CHECK(e == 0, "destroy: %s", drc_strerror(e));
}

#endif
