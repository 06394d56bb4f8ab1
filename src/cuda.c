/*
 * Memory classification. PLACEHOLDER for the core issue: everything is host
 * memory. The CUDA issue replaces this file with the dlopen'ed driver layer.
 */
#include "mem.h"

#include <errno.h>

int drc__mem_classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    (void)addr;
    (void)len;
    *m = (struct drc__mem){ .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };
    return 0;
}

int drc__mem_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned flags, int *fd,
                    uint64_t *offset)
{
    (void)m; (void)start; (void)len; (void)flags; (void)fd; (void)offset;
    return -EOPNOTSUPP;
}

int drc__mem_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    (void)m; (void)addr; (void)len;
    return 1;
}
