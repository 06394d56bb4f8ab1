/*
 * Tests of src/cuda/memory.c (CUDA memory as the core sees it: classification,
 * export, validation, bounds) and of the export table it shares
 * (src/cuda/export.c), against THE CUDA double (tests/fake_cuda.h, installed
 * in drc's one driver table): there is no GPU in CI. Each test states what
 * a user of drc would check: that host memory stays host memory, that CUDA
 * memory is bounded by its allocation (or by its run of VMM chunks), that the
 * export asks the driver for exactly the page-aligned range and keeps the
 * offset, that the caller's context is restored, and that DRC_F_VALIDATE
 * catches a reallocation.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "drc.h"
#include "fake_cuda.h"
#include "core/config.h"
#include "core/mem.h"
#include "core/notify.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul

/* A backend double that records the dmabuf it was handed, while it is open. */
struct seen {
    int calls, deregs;
    struct drc_reg_args a[8];
    int fd_open[8];
};

static int seen_reg(void *ctx, const struct drc_reg_args *a, void **h, uint32_t *lkey, uint32_t *rkey)
{
    struct seen *s = ctx;

    s->a[s->calls] = *a;
    s->fd_open[s->calls] = fd_is_open(a->dmabuf_fd);
    *h = (void *)(uintptr_t)++s->calls;
    *lkey = *rkey = 1;
    return 0;
}

static int seen_dereg(void *ctx, void *h)
{
    (void)h;
    ((struct seen *)ctx)->deregs++;
    return 0;
}

static drc_cache_t *seen_cache(struct seen *s, unsigned flags)
{
    struct drc_backend be = { .reg = seen_reg, .dereg = seen_dereg, .ctx = s };
    struct drc_config cfg = { .flags = flags, .policy = DRC_DMABUF_THEN_PEERMEM };
    drc_cache_t *c;

    memset(s, 0, sizeof(*s));
    assert_int_equal(drc_cache_create(&be, &cfg, &c), 0);
    return c;
}

static int setup(void **state)
{
    (void)state;
    fc_reset();
    return 0;
}

/* With no driver every pointer is host memory, and nothing CUDA is attempted. */
static void no_driver_is_host(void **state)
{
    struct drc__mem m;
    uintptr_t b;
    size_t l;
    uint64_t off;
    int fd = 7;

    (void)state;
    drc__cuda_set_driver(NULL);
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_int_equal(m.type, DRC_MEM_HOST);
    assert_int_equal(m.device, -1);
    assert_true(m.lo == 0 && m.hi == UINTPTR_MAX);
    assert_int_equal(drc__mem_unchanged(&m, GPU, 4096), 1);
    assert_int_equal(drc__cuda_alloc_range(GPU, &b, &l), -ENOENT);
    m.type = DRC_MEM_CUDA;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), -EOPNOTSUPP);
    assert_int_equal(fd, -1);
    assert_null(drc__cuda_driver());
}

/* A process that never initialised CUDA has no CUDA memory: host, no error. */
static void uninitialised_driver_is_host(void **state)
{
    struct drc__mem m;

    (void)state;
    fc_add(GPU, 64 * MiB, 0, 5);
    fc.attr_rc = DRC__CUDA_ERROR_NOT_INITIALIZED;
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_int_equal(m.type, DRC_MEM_HOST);
    fc.attr_rc = 999;   /* any other driver failure is an error, not host memory */
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), -EIO);
}

static void device_memory_bounded_by_allocation(void **state)
{
    struct drc__mem m;

    (void)state;
    fc_add(GPU, 64 * MiB, 1, 42);
    assert_int_equal(drc__mem_classify(GPU + MiB + 3, 100, &m), 0);
    assert_int_equal(m.type, DRC_MEM_CUDA);
    assert_int_equal(m.device, 1);
    assert_true(m.lo == GPU && m.hi == GPU + 64 * MiB);
    assert_int_equal(m.buffer_id, 42);
    assert_int_equal(m.nchunks, 0);
    assert_ptr_equal(m.ctx, FC_CTX(1));   /* the allocation's own context */
    /* a request running past the allocation is refused, never registered across */
    assert_int_equal(drc__mem_classify(GPU + 63 * MiB, 2 * MiB, &m), -EFAULT);
    assert_int_equal(m.type, DRC_MEM_HOST);
}

static void pinned_host_and_managed_take_host_path(void **state)
{
    struct drc__mem m;

    (void)state;
    fc_add(GPU, MiB, 0, 1)->type = DRC__CU_MEMORYTYPE_HOST;
    fc_add(GPU + MiB, MiB, 0, 2)->managed = 1;
    fc.a[1].type = DRC__CU_MEMORYTYPE_UNIFIED;
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_int_equal(m.type, DRC_MEM_HOST);
    assert_int_equal(drc__mem_classify(GPU + MiB, 4096, &m), 0);
    assert_int_equal(m.type, DRC_MEM_HOST);
    fc.a[1].type = DRC__CU_MEMORYTYPE_DEVICE;  /* managed even if reported as device */
    assert_int_equal(drc__mem_classify(GPU + MiB, 4096, &m), 0);
    assert_int_equal(m.type, DRC_MEM_HOST);
}

/* A thread with no current context: the allocation's is made current, then none again. */
static void context_set_and_restored(void **state)
{
    struct drc__mem m;
    uint64_t off;
    int fd;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    fc.range_needs_ctx = 1;
    fc_current = NULL;
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_ptr_equal(fc.range_ctx, FC_CTX0);
    assert_null(fc_current);
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), 0);
    assert_ptr_equal(fc.exports[0].ctx, FC_CTX0);
    assert_null(fc_current);
    close(fd);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);     /* the next export is the driver's again */
    /* a thread in another context gets it back */
    fc_current = (void *)0xbee;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), 0);
    assert_ptr_equal(fc.exports[1].ctx, FC_CTX0);
    assert_ptr_equal(fc_current, (void *)0xbee);
    close(fd);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    /* already current: no switch at all */
    fc_current = FC_CTX0;
    fc.set_calls = 0;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), 0);
    assert_int_equal(fc.set_calls, 0);
    close(fd);
}

/*
 * The driver is asked for the whole allocation, once: every later export of
 * any part of it gets the same dmabuf (a copy of the fd) at offset
 * start - base. A free drops it before the memory goes.
 */
static void export_whole_allocation_shared(void **state)
{
    struct drc__mem m;
    uint64_t off;
    int fd, fd2;
    struct stat a, b;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__mem_classify(GPU + 4096 + 100, 5000, &m), 0);
    assert_int_equal(drc__mem_export(&m, GPU + 4096 + 100, 5000, NULL, &fd, &off), 0);
    assert_int_equal(fc.nexports, 1);
    assert_true(fc.exports[0].ptr == GPU);
    assert_int_equal(fc.exports[0].size, 8 * MiB);
    assert_int_equal(fc.exports[0].flags, 0);
    assert_int_equal(off, 4096 + 100);
    assert_int_not_equal(fd, fc.exports[0].fd);     /* the caller's own copy */
    assert_true(fd_is_open(fd));
    assert_int_equal(drc__mem_classify(GPU + 6 * MiB, 4096, &m), 0);
    assert_int_equal(drc__mem_export(&m, GPU + 6 * MiB, 4096, NULL, &fd2, &off), 0);
    assert_int_equal(fc.nexports, 1);               /* no second export */
    assert_int_equal(off, 6 * MiB);
    assert_int_equal(fstat(fd, &a), 0);
    assert_int_equal(fstat(fd2, &b), 0);
    assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
    close(fd);
    close(fd2);
    assert_int_equal(drc__cuda_exports_live(), 1);
    assert_true(fd_is_open(fc.exports[0].fd));
    /* no fd left to copy it into: the registration fails, nothing leaks, the export stays shared */
    {
        struct rlimit old, low;
        int n = dup(0);

        close(n);       /* n: the lowest free descriptor */
        assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
        low = old;
        low.rlim_cur = (rlim_t)n;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
        fd2 = 7;
        assert_int_equal(drc__mem_export(&m, GPU + 6 * MiB, 4096, NULL, &fd2, &off), -EMFILE);
        assert_int_equal(fd2, -1);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
        assert_int_equal(fc.nexports, 1);
        assert_int_equal(drc__cuda_exports_live(), 1);
    }
    /* the begin-free routine closes it before the real free */
    drc__notify_end(drc__cuda_begin_free(GPU));
    assert_int_equal(drc__cuda_exports_live(), 0);
    assert_false(fd_is_open(fc.exports[0].fd));
    /* drc_notify_free (memory the program frees itself) does the same, cache or not */
    assert_int_equal(drc__mem_export(&m, GPU + 6 * MiB, 4096, NULL, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 2);
    assert_true(fd_is_open(fc.exports[1].fd));
    assert_int_equal(drc_notify_free((void *)(GPU + 4 * MiB), 4096), 0);   /* any part of it */
    assert_int_equal(drc__cuda_exports_live(), 0);
    assert_false(fd_is_open(fc.exports[1].fd));
}

static void export_errors_map_and_leave_no_fd(void **state)
{
    struct drc__mem m;
    uint64_t off = 5;
    int fd = 5;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    fc.export_rc = DRC__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), -EINVAL);
    assert_int_equal(fd, -1);
    assert_int_equal(off, 0);
    assert_null(fc_current);
    fc.export_rc = DRC__CUDA_ERROR_NOT_SUPPORTED;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), -EOPNOTSUPP);
    fc.export_rc = DRC__CUDA_ERROR_OUT_OF_MEMORY;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), -ENOMEM);
    m.type = DRC_MEM_HOST;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), -EINVAL);
}

/* DRC_F_DMABUF_PCIE: asked first; on NOT_SUPPORTED the default type, and not asked again. */
static void pcie_flag_falls_back_once(void **state)
{
    struct drc__mem m;
    uint64_t off;
    int fd;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 1);
    assert_int_equal(fc.exports[0].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    fc.pcie_unsupported = 1;
    fc_reset();     /* forgets what cuda.c learnt */
    fc_add(GPU, 8 * MiB, 0, 9);
    fc.pcie_unsupported = 1;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 2);
    assert_int_equal(fc.exports[0].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    assert_int_equal(fc.exports[0].fd, -1);
    assert_int_equal(fc.exports[1].flags, 0);
    /* the default-type export is shared: asked for PCIe again, the device is not asked at all */
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 2);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 3);
    assert_int_equal(fc.exports[2].flags, 0);
    /* without the flag the PCIe type is never asked for */
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    assert_int_equal(drc__mem_export(&m, GPU, 4096, NULL, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.exports[3].flags, 0);
    /* a driver older than the flag (INVALID_VALUE): the default type, and not asked again */
    fc_reset();
    fc_add(GPU, 8 * MiB, 0, 9);
    fc.pcie_rc = DRC__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 2);
    assert_int_equal(fc.exports[1].flags, 0);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 3);
    assert_int_equal(fc.exports[2].flags, 0);
    /* a failure of both types is the export's error, and teaches nothing */
    fc_reset();
    fc_add(GPU, 8 * MiB, 0, 9);
    fc.pcie_rc = DRC__CUDA_ERROR_INVALID_VALUE;
    fc.export_rc = DRC__CUDA_ERROR_OUT_OF_MEMORY;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), -ENOMEM);
    assert_int_equal(fd, -1);
    fc.pcie_rc = fc.export_rc = 0;
    fc.pcie_unsupported = 0;
    assert_int_equal(drc__mem_export(&m, GPU, 4096, &(unsigned){DRC_F_DMABUF_PCIE}, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.exports[fc.nexports - 1].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
}

/* VMM: contiguous compatible chunks form one run; anything else ends it. */
static void vmm_walk_joins_compatible_chunks(void **state)
{
    const size_t g = 2 * MiB;
    struct drc__mem m;
    uint64_t off;
    int fd;

    (void)state;
    fc_add_vmm(GPU, g, 0, 10, 1);
    fc_add_vmm(GPU + g, g, 0, 11, 1);
    fc_add_vmm(GPU + 2 * g, g, 0, 12, 1);
    fc_add_vmm(GPU + 3 * g, g, 1, 13, 1);              /* another device */
    fc_add_vmm(GPU + 4 * g, g, 1, 14, 1)->prop_type = 2;   /* other properties */
    assert_int_equal(drc__mem_classify(GPU + g / 2, g, &m), 0);
    assert_int_equal(m.type, DRC_MEM_CUDA);
    assert_true(m.lo == GPU && m.hi == GPU + 3 * g);
    assert_int_equal(m.buffer_id, 10);
    /* every chunk of the run recorded with its buffer id, by address */
    assert_int_equal(m.nchunks, 3);
    assert_true(m.chunk[0].base == GPU && m.chunk[0].id == 10 && m.chunk[2].end == GPU + 3 * g);
    assert_int_equal(m.chunk[1].id, 11);
    assert_int_equal(m.chunk[2].id, 12);
    assert_ptr_equal(m.ctx, FC_PRIMARY(0));   /* VMM memory has no context: the primary one */
    assert_int_equal(fc.retains, fc.releases);
    /* the export spans the chunks, in the primary context */
    assert_int_equal(drc__mem_export(&m, GPU + g / 2, g, NULL, &fd, &off), 0);
    assert_ptr_equal(fc.exports[0].ctx, FC_PRIMARY(0));
    assert_true(fc.exports[0].ptr == GPU && fc.exports[0].size == 3 * g && off == g / 2);
    close(fd);
    /* another chunk of the same run (another buffer id at the byte asked): the same export */
    assert_int_equal(drc__mem_classify(GPU + 2 * g + 100, 100, &m), 0);
    assert_true(m.lo == GPU && m.hi == GPU + 3 * g && m.buffer_id == 12);
    assert_int_equal(drc__mem_export(&m, GPU + 2 * g + 100, 100, NULL, &fd, &off), 0);
    assert_int_equal(fc.nexports, 1);
    assert_true(off == 2 * g + 100);
    close(fd);
    /* across devices: refused */
    assert_int_equal(drc__mem_classify(GPU + 2 * g, 2 * g, &m), -EFAULT);
    assert_int_equal(drc__mem_classify(GPU + 3 * g, 2 * g, &m), -EFAULT);
    assert_int_equal(drc__mem_classify(GPU + 3 * g, g, &m), 0);
    assert_true(m.lo == GPU + 3 * g && m.hi == GPU + 4 * g);
    assert_int_equal(fc.primary_retains, 2);  /* once per device */
    assert_int_equal(fc.retains, fc.releases);
}

static void vmm_half_mapped_and_not_gdr_capable_refused(void **state)
{
    const size_t g = 2 * MiB;
    struct drc__mem m;

    (void)state;
    fc_add_vmm(GPU, g, 0, 10, 1);   /* GPU+g.. reserved but unmapped */
    assert_int_equal(drc__mem_classify(GPU, 2 * g, &m), -EFAULT);
    assert_int_equal(drc__mem_classify(GPU, g, &m), 0);
    fc_add_vmm(GPU + 4 * g, g, 0, 11, 0);
    assert_int_equal(drc__mem_classify(GPU + 4 * g, 4096, &m), -EACCES);
    assert_int_equal(m.type, DRC_MEM_HOST);
    assert_int_equal(fc.retains, fc.releases);
}

static void unchanged_compares_buffer_ids(void **state)
{
    struct drc__mem m;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__mem_classify(GPU, 4096, &m), 0);
    assert_int_equal(drc__mem_unchanged(&m, GPU + MiB, 4096), 1);
    fc.a[0].buffer_id = 10;     /* freed and reallocated at the same VA */
    assert_int_equal(drc__mem_unchanged(&m, GPU + MiB, 4096), 0);
    fc.n = 0;                   /* freed */
    assert_int_equal(drc__mem_unchanged(&m, GPU, 4096), 0);
}

static void alloc_range_for_the_hooks(void **state)
{
    uintptr_t b = 0;
    size_t l = 0;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__cuda_alloc_range(GPU + 5, &b, &l), 0);
    assert_true(b == GPU && l == 8 * MiB);
    assert_int_equal(drc__cuda_alloc_range(0x1000, &b, &l), -ENOENT);
    fc.range_needs_ctx = 1;     /* a freeing thread with no context */
    assert_int_equal(drc__cuda_alloc_range(GPU + 5, &b, &l), 0);
    assert_true(b == GPU && l == 8 * MiB);
    assert_null(fc_current);
}

/* Through the cache: the backend sees the fd open, the cache closes it once after. */
static void cache_hands_fd_and_closes_it(void **state)
{
    struct seen s;
    drc_cache_t *c = seen_cache(&s, 0);
    drc_region_t *r;

    (void)state;
    fc_add(GPU, 8 * MiB, 1, 9);
    assert_int_equal(drc_get(c, (void *)(GPU + 4096 + 1), 100, 1, &r), 0);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.a[0].type, DRC_MEM_CUDA);
    assert_int_equal(s.a[0].device, 1);
    assert_true(s.a[0].start == GPU + 4096 && s.a[0].len == 4096 && s.a[0].dmabuf_offset == 4096);
    assert_int_not_equal(s.a[0].dmabuf_fd, fc.exports[0].fd);  /* a copy of the shared export */
    assert_true(s.fd_open[0]);
    assert_false(fd_is_open(s.a[0].dmabuf_fd));
    assert_true(fd_is_open(fc.exports[0].fd));                  /* shared, until the free */
    assert_int_equal(drc_region_type(r), DRC_MEM_CUDA);
    assert_int_equal(drc_put(c, r), 0);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    assert_false(fd_is_open(fc.exports[0].fd));
    /* no dmabuf for this memory: the backend is still asked, with fd -1 (it may use peermem) */
    fc.export_rc = DRC__CUDA_ERROR_NOT_SUPPORTED;
    assert_int_equal(drc_get(c, (void *)(GPU + MiB), 4096, 1, &r), 0);
    assert_int_equal(s.a[1].dmabuf_fd, -1);
    assert_int_equal(drc_put(c, r), 0);
    /* any other export failure fails the get, nothing registered */
    fc.export_rc = DRC__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(drc_get(c, (void *)(GPU + 2 * MiB), 4096, 1, &r), -EINVAL);
    assert_int_equal(s.calls, 2);
    drc_invalidate(c, (void *)GPU, 8 * MiB);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(s.deregs, 2);
}

/*
 * An export made while a free of its allocation is in flight is never kept
 * in the shared table (src/cuda/export.c). The timeline it replays, the
 * two-device stress test's stale regions (tests/cuda/test_multi_device_mt.c):
 *
 *   getter G1 (pending before the free)      freer
 *                                            begin: publish, drop the entry, invalidate
 *   export: no entry, no drop since lookup;
 *   the memory is still there: exported     (G1's registration raced: never inserted)
 *                                            cuMemFree; end
 *   getter G2, classified before the free
 *   (its get began before it), registers     the same VA: freed, or another buffer
 *   after it: a table hit on the kept fd
 *
 * G2 got the dmabuf of the freed memory: its MR maps what the free gave
 * back, not what the VA holds now. Kept, the export must be seen by no
 * later registration; here the table must be empty once the free is over.
 */
static void export_during_free_not_kept(void **state)
{
    struct seen s;
    drc_cache_t *c = seen_cache(&s, 0);     /* a cache: the free is bracketed */
    struct drc__mem m;
    uint64_t off;
    int fd, t;

    (void)state;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc__mem_classify(GPU + MiB, 4096, &m), 0);
    t = drc__cuda_begin_free(GPU);
    assert_true(t >= 0);
    assert_int_equal(drc__mem_export(&m, GPU + MiB, 4096, NULL, &fd, &off), 0);   /* the memory is still there */
    close(fd);
    assert_int_equal(cuMemFree_v2(GPU), 0);
    drc__notify_end(t);
    assert_int_equal(drc__cuda_exports_live(), 0);
    /* a registration classified before the free: the driver is asked, and finds nothing there */
    fd = 7;
    assert_int_equal(drc__mem_export(&m, GPU + MiB, 4096, NULL, &fd, &off), -EINVAL);
    assert_int_equal(fd, -1);
    assert_int_equal(fc.nexports, 2);
    /* other memory at the same VA: the driver exports that */
    fc_add(GPU, 8 * MiB, 0, 10);
    assert_int_equal(drc__mem_export(&m, GPU + MiB, 4096, NULL, &fd, &off), 0);
    close(fd);
    assert_int_equal(fc.nexports, 3);
    drc__cuda_exports_drop(-1, GPU, GPU + 8 * MiB);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(s.calls, 0);
}

/* DRC_F_VALIDATE: a hit on a reallocated buffer is an invalidation, then a new registration. */
static void validate_catches_realloc(void **state)
{
    struct seen s, s2;
    drc_cache_t *c = seen_cache(&s, DRC_F_VALIDATE), *plain;
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *r;

    (void)state;
    plain = NULL;
    fc_add(GPU, 8 * MiB, 0, 9);
    assert_int_equal(drc_get(c, (void *)GPU, 8 * MiB, 1, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_get(c, (void *)(GPU + MiB), 4096, 1, &r), 0);   /* same buffer: a hit */
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(s.calls, 1);
    fc.a[0].buffer_id = 77;     /* cuMemFree + cuMemAlloc, no hook saw it */
    assert_int_equal(drc_get(c, (void *)(GPU + MiB), 4096, 1, &r), 0);
    assert_int_equal(s.calls, 2);
    assert_int_equal(s.deregs, 1);
    drc_cache_stats(c, &st);
    assert_int_equal(st.invalidated, 1);
    assert_int_equal(drc_put(c, r), 0);
    /* without the flag the stale region is returned: what the flag is for */
    {
        struct drc_backend be = { .reg = seen_reg, .dereg = seen_dereg, .ctx = &s2 };
        memset(&s2, 0, sizeof(s2));
        assert_int_equal(drc_cache_create(&be, NULL, &plain), 0);
    }
    assert_int_equal(drc_get(plain, (void *)GPU, 4096, 1, &r), 0);
    assert_int_equal(drc_put(plain, r), 0);
    fc.a[0].buffer_id = 78;
    assert_int_equal(drc_get(plain, (void *)GPU, 4096, 1, &r), 0);
    assert_int_equal(s2.calls, 1);
    assert_int_equal(drc_put(plain, r), 0);
    drc_invalidate(c, (void *)GPU, 8 * MiB);
    drc_invalidate(plain, (void *)GPU, 8 * MiB);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(drc_cache_destroy(plain), 0);
}

/* A coalesced CUDA region stays inside its allocation: two neighbours never merge. */
static void no_coalescing_across_allocations(void **state)
{
    struct seen s;
    drc_cache_t *c = seen_cache(&s, 0);
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *r;

    (void)state;
    fc_add(GPU, 4 * MiB, 0, 1);
    fc_add(GPU + 4 * MiB, 4 * MiB, 0, 2);
    assert_int_equal(drc_get(c, (void *)(GPU + 3 * MiB), MiB, 1, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_get(c, (void *)(GPU + 4 * MiB), MiB, 1, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_get(c, (void *)(GPU + 2 * MiB), 2 * MiB, 1, &r), 0);   /* overlaps the first */
    assert_int_equal(drc_put(c, r), 0);
    assert_true(s.a[1].start == GPU + 4 * MiB && s.a[1].len == MiB);
    assert_true(s.a[2].start == GPU + 2 * MiB && s.a[2].len == 2 * MiB);
    drc_cache_stats(c, &st);
    assert_int_equal(st.merges, 1);
    assert_int_equal(st.regions, 2);
    assert_int_equal(drc_get(c, (void *)(GPU + 3 * MiB), 2 * MiB, 1, &r), -EFAULT);
    drc_invalidate(c, (void *)GPU, 8 * MiB);
    assert_int_equal(drc_cache_destroy(c), 0);
}

/*
 * PyTorch's cudaMallocAsync backend packs tensors into a pool's mapping, so a tensor's pages start
 * inside its neighbour. The driver refuses to export such a range (the double as the H200 does:
 * INVALID_VALUE, the control below), and exports from the mapping's base: the registration gets
 * that export, its offset counted from the mapping, and every other tensor still registers.
 */
static void pool_allocations_export_from_their_mapping(void **state)
{
    struct seen s;
    drc_cache_t *c = seen_cache(&s, 0);
    struct fc_alloc *a[3];
    drc_region_t *r[3];
    int fd = -1, i;

    (void)state;
    a[0] = fc_add(GPU, 1000, 0, 1);
    a[1] = fc_add(GPU + 1024, 4096, 0, 2);
    a[2] = fc_add(GPU + 5120, 5000, 0, 3);
    for (i = 0; i < 3; i++) {
        a[i]->map_base = GPU;
        a[i]->map_size = 2 * MiB;
    }
    /* the control: the third tensor's own pages do not export */
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU + 4096, 8192, 1, 0), DRC__CUDA_ERROR_INVALID_VALUE);
    for (i = 0; i < 3; i++)
        assert_int_equal(drc_get(c, (void *)a[i]->base, a[i]->size, 3, &r[i]), 0);
    assert_int_equal(s.calls, 3);
    /* the third: its pages [GPU+4K, GPU+12K) at offset 4K of an export from the mapping's base */
    assert_true(s.a[2].start == GPU + 4096 && s.a[2].len == 8192);
    assert_int_equal(s.a[2].dmabuf_offset, 4096);
    assert_true(fc.exports[fc.nexports - 1].ptr == GPU && fc.exports[fc.nexports - 1].size >= 12288);
    assert_true(s.fd_open[2]);
    for (i = 0; i < 3; i++)
        assert_int_equal(drc_put(c, r[i]), 0);
    drc_invalidate(c, (void *)GPU, 2 * MiB);
    assert_int_equal(drc_cache_destroy(c), 0);
}

/* Three tensors packed into a pool's 2 MiB mapping at GPU, the third's pages starting inside the second. */
static void add_pool(void)
{
    struct fc_alloc *a[3];
    int i;

    a[0] = fc_add(GPU, 1000, 0, 1);
    a[1] = fc_add(GPU + 1024, 4096, 0, 2);
    a[2] = fc_add(GPU + 5120, 5000, 0, 3);
    for (i = 0; i < 3; i++) {
        a[i]->map_base = GPU;
        a[i]->map_size = 2 * MiB;
    }
}

/* What drc wrote on stderr while @fn ran under DRC_LOG=info, in @buf. */
static void logged(void (*fn)(void *), void *arg, char *buf, size_t size)
{
    int saved = dup(2), mem = memfd_create("stderr", 0);
    ssize_t n;

    assert_true(saved >= 0 && mem >= 0);
    fflush(stderr);
    dup2(mem, 2);
    setenv("DRC_LOG", "info", 1);
    drc__env_reset();   /* drc reads its environment once: read it again */
    fn(arg);
    unsetenv("DRC_LOG");
    drc__env_reset();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(mem, buf, size - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(mem);
}

/* Register the third pool tensor twice (two misses: the second after a drop of the export). */
static void register_pool_tensor(void *arg)
{
    drc_cache_t *c = arg;
    drc_region_t *r;
    int i;

    for (i = 0; i < 2; i++) {
        assert_int_equal(drc_get(c, (void *)(GPU + 5120), 5000, 3, &r), 0);
        assert_int_equal(drc_put(c, r), 0);
        drc_invalidate(c, (void *)GPU, 2 * MiB);
        drc__cuda_exports_drop(-1, GPU, GPU + 2 * MiB);
    }
}

static unsigned long long downgraded(drc_cache_t *c)
{
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };

    drc_cache_stats(c, &st);
    assert_true(st.comp_mask & DRC_STATS_DMABUF_DOWNGRADED);
    return (unsigned long long)st.dmabuf_downgraded;
}

/*
 * A pool tensor (cudaMallocAsync) registered with the PCIe mapping type asked gets it. The driver
 * refuses the tensor's own pages whatever the type (INVALID_VALUE, the control below), which is not
 * a refusal of the PCIe flag: the export from the mapping's base asks for PCIe again, and gets it.
 * Nothing is counted or logged as a downgrade.
 */
static void pool_allocations_keep_the_pcie_type(void **state)
{
    struct seen s;
    drc_cache_t *c = seen_cache(&s, DRC_F_DMABUF_PCIE);
    char log[1024];
    int fd = -1;

    (void)state;
    add_pool();
    /* the controls: the double refuses the tensor's pages with either type, and takes PCIe from the base */
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU + 4096, 8192, 1, 0), DRC__CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU + 4096, 8192, 1,
                                                   DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE),
                     DRC__CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU, 12288, 1, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE),
                     0);
    close(fd);
    fc.nexports = 0;
    logged(register_pool_tensor, c, log, sizeof(log));
    assert_int_equal(s.calls, 2);
    assert_true(s.a[1].start == GPU + 4096 && s.a[1].dmabuf_offset == 4096 && s.fd_open[1]);
    /* every export the double made: from the mapping's base, PCIe */
    assert_true(fc.nexports >= 2);
    assert_true(fc.exports[fc.nexports - 1].ptr == GPU && fc.exports[fc.nexports - 1].fd >= 0);
    assert_int_equal(fc.exports[fc.nexports - 1].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    for (int i = 0; i < fc.nexports; i++)
        if (fc.exports[i].fd >= 0)
            assert_int_equal(fc.exports[i].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    assert_int_equal(downgraded(c), 0);
    assert_null(strstr(log, "PCIe"));
    assert_int_equal(drc_cache_destroy(c), 0);
}

/*
 * The control: where the driver really has no PCIe type for the pool (NOT_SUPPORTED, as the H200;
 * or a driver older than the flag, INVALID_VALUE where the default type exports the same range), the
 * tensor registers with the default type, each such registration is counted, and DRC_LOG says why
 * once per device and cause.
 */
static void pool_allocations_report_a_downgrade(void **state)
{
    static const struct {
        int pcie_unsupported, pcie_rc;
        const char *cause;
    } drivers[] = {
        { 1, 0, "CUDA_ERROR_NOT_SUPPORTED" },
        { 0, DRC__CUDA_ERROR_INVALID_VALUE, "older than the flag" },
    };
    struct seen s;
    drc_cache_t *c;
    char log[1024];
    const char *line;
    unsigned i;

    (void)state;
    for (i = 0; i < 2; i++) {
        fc_reset();
        add_pool();
        fc.pcie_unsupported = drivers[i].pcie_unsupported;
        fc.pcie_rc = drivers[i].pcie_rc;
        c = seen_cache(&s, DRC_F_DMABUF_PCIE);
        logged(register_pool_tensor, c, log, sizeof(log));
        assert_int_equal(s.calls, 2);
        assert_int_equal(fc.exports[fc.nexports - 1].flags, 0);
        assert_true(fc.exports[fc.nexports - 1].ptr == GPU && fc.exports[fc.nexports - 1].fd >= 0);
        assert_int_equal(downgraded(c), 2);     /* both registrations */
        line = strstr(log, "drc: GPU 0: no PCIe dmabuf mapping type");
        assert_non_null(line);
        assert_null(strstr(line + 1, "drc: GPU 0: no PCIe"));  /* once */
        assert_non_null(strstr(log, drivers[i].cause));
        assert_int_equal(drc_cache_destroy(c), 0);
    }
    /* without DRC_LOG nothing is written; the count is there all the same */
    fc_reset();
    add_pool();
    fc.pcie_unsupported = 1;
    c = seen_cache(&s, DRC_F_DMABUF_PCIE);
    register_pool_tensor(c);
    assert_int_equal(downgraded(c), 2);
    assert_int_equal(drc_cache_destroy(c), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(no_driver_is_host, setup),
        cmocka_unit_test_setup(uninitialised_driver_is_host, setup),
        cmocka_unit_test_setup(device_memory_bounded_by_allocation, setup),
        cmocka_unit_test_setup(pinned_host_and_managed_take_host_path, setup),
        cmocka_unit_test_setup(context_set_and_restored, setup),
        cmocka_unit_test_setup(export_whole_allocation_shared, setup),
        cmocka_unit_test_setup(export_errors_map_and_leave_no_fd, setup),
        cmocka_unit_test_setup(pcie_flag_falls_back_once, setup),
        cmocka_unit_test_setup(vmm_walk_joins_compatible_chunks, setup),
        cmocka_unit_test_setup(vmm_half_mapped_and_not_gdr_capable_refused, setup),
        cmocka_unit_test_setup(unchanged_compares_buffer_ids, setup),
        cmocka_unit_test_setup(alloc_range_for_the_hooks, setup),
        cmocka_unit_test_setup(cache_hands_fd_and_closes_it, setup),
        cmocka_unit_test_setup(export_during_free_not_kept, setup),
        cmocka_unit_test_setup(validate_catches_realloc, setup),
        cmocka_unit_test_setup(no_coalescing_across_allocations, setup),
        cmocka_unit_test_setup(pool_allocations_export_from_their_mapping, setup),
        cmocka_unit_test_setup(pool_allocations_keep_the_pcie_type, setup),
        cmocka_unit_test_setup(pool_allocations_report_a_downgrade, setup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
