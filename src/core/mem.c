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
    *m = (struct drc__mem){ .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };
    return 0;
}

int drc__mem_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned flags, int *fd,
                    uint64_t *offset)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    return ops ? ops->export_range(m, start, len, flags, fd, offset) : -EOPNOTSUPP;
}

int drc__mem_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    return ops ? ops->unchanged(m, addr, len) : 1;
}

void drc__mem_released(uintptr_t addr, size_t len)
{
    const struct drc__mem_ops *ops = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);

    if (ops && ops->released)
        ops->released(addr, len);
}
