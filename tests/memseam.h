/*
 * A stand-in for a device layer at the core's own seam (src/core/mem.h), for
 * core tests that need memory other than host memory without the CUDA layer:
 * the test writes its classifier; these answer the rest as a GPU without
 * dmabuf would: no export (the miss registers with fd -1), and memory that
 * never changes under a region (DRC_F_VALIDATE finds nothing stale).
 */
#ifndef DRC_TEST_MEMSEAM_H
#define DRC_TEST_MEMSEAM_H

#include <errno.h>

#include "core/mem.h"

static inline int seam_no_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned *flags, int *fd,
                                 uint64_t *offset)
{
    (void)m, (void)start, (void)len, (void)flags, (void)fd, (void)offset;
    return -EOPNOTSUPP;
}

static inline int seam_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    (void)m, (void)addr, (void)len;
    return 1;
}

#endif
