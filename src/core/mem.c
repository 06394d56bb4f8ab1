/*
 * The seam between the core and a device layer (see mem.h): calls that
 * forward to the installed drc__mem_ops, or answer "host memory" when none is.
 */
#include "core/mem.h"

#include <errno.h>

static const struct drc__mem_ops *installed;   /* atomic: NULL until a device layer loads */

void drc__mem_set_ops(const struct drc__mem_ops *ops)
{
    __atomic_store_n(&installed, ops, __ATOMIC_RELEASE);
}

int drc__mem_classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    if (ops)
        return ops->classify(addr, len, m);
    /* every field but chunk[], read only below nchunks (the whole struct is 240 bytes) */
    m->type = DRC_MEM_HOST;
    m->device = -1;
    m->lo = 0;
    m->hi = UINTPTR_MAX;
    m->buffer_id = 0;
    m->ctx = NULL;
    m->nchunks = 0;
    return 0;
}

int drc__mem_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned *flags, int *fd,
                    uint64_t *offset)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
    unsigned none = 0;

    return ops ? ops->export_range(m, start, len, flags ? flags : &none, fd, offset) : -EOPNOTSUPP;
}

int drc__mem_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    return ops ? ops->unchanged(m, addr, len) : 1;
}

void drc__mem_prepare(void)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    if (ops && ops->prepare)
        ops->prepare();
}

void drc__mem_released(uintptr_t addr, size_t len)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    if (ops && ops->released)
        ops->released(addr, len);
}
