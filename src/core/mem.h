/*
 * What memory a range is: the core's only view of device memory.
 *
 * The core knows no device library. A layer that does (src/cuda/) installs
 * its answers with drc__mem_set_ops() when the library is loaded; until then,
 * and in a program built from the core alone, every pointer is host memory
 * and drc__mem_export() fails with -EOPNOTSUPP.
 *
 * Contract: drc__mem_classify() is called on every miss, before the cache
 * takes its lock, and must be safe from any thread. With no CUDA driver every
 * pointer is host memory and none of these calls touches CUDA. The cache
 * exports CUDA memory itself with drc__mem_export() and hands the fd to the
 * backend in drc_reg_args, closing it after reg() returns.
 */
#ifndef DRC_MEM_H
#define DRC_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "drc.h"

enum { DRC__MEM_CHUNKS = 8 };  /* VMM chunks whose buffer ids a classification records */

/* A mapped VMM chunk [base, end) and its CU_POINTER_ATTRIBUTE_BUFFER_ID at classification. */
struct drc__mem_chunk {
    uintptr_t base, end;
    uint64_t id;
};

struct drc__mem {
    enum drc_mem_type type;
    int device;             /* CUDA ordinal, -1 for host memory */
    uintptr_t lo, hi;       /* a region of this memory stays inside [lo, hi): the allocation, or
                             * the run of contiguous compatible VMM chunks; [0, UINTPTR_MAX] for host */
    uintptr_t alloc_lo, alloc_hi;   /* CUDA: the allocation the range lies in, [alloc_lo, alloc_hi), as
                                     * cuMemGetAddressRange gives it (VMM: the one mapped chunk), when the
                                     * whole range lies in it: what a widened miss registers
                                     * (drc__get_widened); alloc_lo == alloc_hi (0) otherwise, and for host */
    uint64_t buffer_id;     /* CUDA: CU_POINTER_ATTRIBUTE_BUFFER_ID at the first byte asked for */
    void *ctx;              /* CUDA: the allocation's context, made current for the export */
    unsigned nchunks;       /* VMM: the chunks of [lo, hi) recorded below, by address; 0 otherwise */
    struct drc__mem_chunk chunk[DRC__MEM_CHUNKS];
};

/*
 * Classify [addr, addr+len). Returns 0, or a negative errno when the range is
 * memory drc must refuse (e.g. VMM memory without gpuDirectRDMACapable, a range
 * crossing out of its allocation).
 */
int drc__mem_classify(uintptr_t addr, size_t len, struct drc__mem *m);

/*
 * A dmabuf covering [start, start+len) of the CUDA memory @m (inside
 * [m->lo, m->hi)): *fd to close by the caller, *offset = start - export base.
 * The CUDA layer exports each allocation once per mapping type, whole, and
 * shares it among every cache and PD (src/cuda/export.c): *fd is then a dup
 * of the shared export. *@flags: in, DRC_F_DMABUF_PCIE for the PCIe mapping
 * type; out, on success, the flags of the export made: DRC_F_DMABUF_PCIE
 * cleared where the driver has no PCIe type and the default type was given
 * (a downgrade the caller counts). @flags NULL: no flags.
 * Returns 0 or a negative errno.
 */
int drc__mem_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned *flags, int *fd,
                    uint64_t *offset);

/*
 * 1 if [addr, addr+len) is still the CUDA buffer that @m was classified from,
 * 0 if it was freed or replaced: the buffer id at each end equals the one
 * recorded at classification for the allocation, or for a VMM region for the
 * chunk that end falls in (a chunk not recorded fails the check).
 */
int drc__mem_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len);

/*
 * [addr, addr+len) is about to be freed or unmapped: the device layer drops
 * what it keeps for that memory (the shared dmabuf exports: an open dmabuf
 * keeps freed GPU memory taken). Called by drc_notify_free() before it looks
 * for caches, so also when none exists; must not allocate, and is cheap when
 * the layer keeps nothing.
 */
void drc__mem_released(uintptr_t addr, size_t len);

/*
 * A cache is being created (drc_cache_create, no lock held): the device layer
 * loads what drc__mem_classify() needs (the CUDA driver, once per process),
 * so that the first miss does not pay for it. Optional.
 */
void drc__mem_prepare(void);

/*
 * The calls above, as a device layer implements them. Each entry has the
 * contract of the call of the same name. @ops must stay valid for the life of
 * the process; installing is one atomic store, so it may happen at any time
 * (a constructor, in practice).
 */
struct drc__mem_ops {
    int (*classify)(uintptr_t addr, size_t len, struct drc__mem *m);
    int (*export_range)(const struct drc__mem *m, uintptr_t start, size_t len, unsigned *flags, int *fd,
                        uint64_t *offset);
    int (*unchanged)(const struct drc__mem *m, uintptr_t addr, size_t len);
    void (*released)(uintptr_t addr, size_t len);
    void (*prepare)(void);      /* NULL: nothing to load */
};
void drc__mem_set_ops(const struct drc__mem_ops *ops);

#endif
