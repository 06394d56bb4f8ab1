/*
 * The process-wide dmabuf export table: one export per (allocation, mapping
 * type), shared by every cache and every PD that registers the allocation.
 *
 * Why: a verbs cache is per PD, and a transfer engine registers each buffer
 * on every NIC. Exporting per registration gives N exports of the same
 * memory for N NICs (Mooncake's issue 2177: "massive lock memory"; its PR
 * 2523 exports once per buffer and shares the fd). Here the first
 * registration of an allocation exports the whole allocation (its host-page
 * hull) and every later registration of any part of it, on any PD, gets the
 * same dmabuf at offset start - base.
 *
 * The fd's lifetime (decided, see docs/gpu.md "GPU memory over verbs"): the table
 * keeps one fd per entry for as long as the allocation lives, and hands each
 * registration a dup() of it, which the core closes after reg() returns, as
 * it closed a fresh export before (a custom backend sees no difference). An
 * entry is dropped, its fd closed:
 *   - when the allocation is freed, unmapped or its context torn down:
 *     drc_notify_free() (through core/mem.h's drc__mem_released) and the
 *     begin-free routines of free.c drop it before the real free, because an
 *     open dmabuf fd keeps freed GPU memory taken (tests/gpu: test_cuda_gpu's
 *     "unannounced free" shows it);
 *   - when a classification finds other memory at the same bounds (another
 *     buffer id: a free drc did not see), before that memory is exported;
 *   - when the table is full (EXPORTS entries), least recently used first.
 * So the table holds at most EXPORTS fds, whatever the number of
 * registrations (libfabric PR 12828 exhausted `nofile` with one leaked fd per
 * registration), plus one dup per registration in flight. An MR holds the
 * dmabuf by itself: closing an entry never breaks a registration made from it.
 *
 * Mapping type: a request for the PCIe type that the driver answers with
 * NOT_SUPPORTED (no such path, as on a GPU with no NIC under its switch) or
 * INVALID_VALUE is retried,
 * once, with the default type on the same range. INVALID_VALUE has two
 * causes the driver does not tell apart: a driver older than the flag, or a
 * range it refuses whatever the type (a stream-ordered pool allocation's own
 * pages, see drc__cuda_export). The default type's answer on the same range
 * tells them apart: it exports, and the flag was the trouble; it is refused
 * too, and the range was: the type asked is kept for the next range tried
 * (the pool's mapping base), where the driver is asked for PCIe again. Only
 * where the flag was the trouble is the device never asked for PCIe again
 * (the entry is then a default-type entry), and that downgrade is never
 * silent: each registration given the default type instead of the PCIe type
 * it asked is counted (drc_stats.dmabuf_downgraded), and under DRC_LOG one
 * line on stderr says so, once per device and cause. Only the export's
 * failure falls back: a registration's failure never does.
 *
 * Locks, in this order: `export_lock`, held by a miss from its second
 * lookup to its insertion, so that threads missing on one allocation together
 * (one per NIC) make one export, not one each (exports of different
 * allocations wait for each other, an export being a driver call of tens
 * of microseconds); `lock`, which
 * protects the table and is never held across a driver call or any call but
 * close and dup (so a fork waits for it, and the child closes every export:
 * core/fork.h). Neither is a
 * cache lock (no cache calls this with its lock held), and a free (drop)
 * takes `lock` only, so it never waits for an export. The races that leave
 * open and how they are closed. First, a drop after the lookup:
 *
 *   registering thread                       freeing thread
 *   lookup: no entry; gen = drops
 *   cuMemGetHandleForAddressRange (no lock)
 *                                            drop(range): drops++ (no entry yet)
 *                                            cuMemFree
 *   insert: gen != drops -> not kept
 *
 * Second, a drop before the lookup, the real free after the export (the
 * stale regions of tests/cuda/test_multi_device_mt.c, since this table):
 *
 *   getter G1 (pending before the free)      freeing thread (notify.c's bracket)
 *                                            begin: publish the free in flight,
 *                                            drop(range): drops++, invalidate
 *                                            (G1's registration marked raced)
 *   lookup: no entry; gen = drops
 *   cuMemGetHandleForAddressRange: the memory is still there
 *   insert: gen == drops -> was KEPT         cuMemFree; end
 *   getter G2, classified before the free, registers after it: a table hit,
 *   the dmabuf of the freed memory, no driver call. Its MR maps what the
 *   free gave back, not the VA (freed, or a new buffer at the same address).
 *
 * So the second lookup also reads the frees in flight (notify.c,
 * drc__notify_freeing): a free of the hull published then (before its drop,
 * which this lookup follows under `lock`) and not yet ended means the
 * export may be of memory on its way out: not kept. One that ended before
 * the lookup freed the memory before the export, which then sees the new
 * memory or fails. Third, a free that skips the drop because the table is
 * empty (cuda_released, free.c) while a miss is between its lookup and its
 * insert: it would leave gen == drops. `exporting` is raised before that
 * lookup reads the frees, and a free reads it (drc__cuda_exports_busy)
 * after publishing itself, both sequentially consistent: either the free
 * sees the miss and drops (drops++), or the miss sees the free.
 *
 * An export begun before a drop that completed meanwhile, or while a free
 * of its memory was in flight, is handed out unshared (the caller closes it
 * after its registration), never kept: the table cannot keep an fd of
 * memory whose free it did not see. (The cache's own invalidation protocol
 * then deregisters that registration: its pending registration predates the
 * free's publication, else it would have waited for the free to end.)
 */
#include "core/config.h"
#include "cuda/cuda.h"

#include "core/fork.h"
#include "core/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { EXPORTS = 64 };

static struct entry {
    uintptr_t lo, hi;           /* the exported hull; hi == 0: a free slot */
    uintptr_t alo, ahi;         /* the allocation's bounds as classified (the key) */
    uint64_t ident;             /* the buffer ids at classification, folded */
    int device, pcie;           /* pcie: the mapping type the fd has */
    int fd;
    uint64_t used;              /* LRU tick */
} table[EXPORTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t export_lock = PTHREAD_MUTEX_INITIALIZER;   /* one driver export at a time; before lock */
static uint64_t tick, drops;    /* lock */
static int live;                /* atomic, written under lock: entries in use */
static int exporting;           /* atomic: misses between their second lookup and their decision (export_lock) */
static int pcie_unsupported[DRC__CUDA_MAX_DEVICES];   /* atomic: the driver refused the PCIe type */
static unsigned pcie_logged[DRC__CUDA_MAX_DEVICES];   /* atomic: the causes DRC_LOG was told of, a bit each */

/*
 * fork() (core/fork.h). The fork waits for `lock` (held for no call but close and dup), so the
 * table is whole in the child, which closes every export: an open dmabuf keeps the memory it was
 * exported from taken, and the parent's frees would not give it back while a child holds one.
 * export_lock is held across the driver's export: not waited for, made anew with no export in
 * flight (an export a parent thread was making stays open in the child: at most one fd).
 */
static void exports_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void exports_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void exports_child(void)
{
    struct entry *e;

    pthread_mutex_init(&export_lock, NULL);
    pthread_mutex_init(&lock, NULL);
    for (e = table; e < table + EXPORTS; e++)
        if (e->hi) {
            close(e->fd);
            e->hi = 0;
        }
    drops++;
    __atomic_store_n(&live, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&exporting, 0, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void exports_fork_init(void)
{
    drc__fork_register(DRC__FORK_EXPORTS, exports_prepare, exports_parent, exports_child);
}

/*
 * What memory @m is: the allocation's buffer id, or for VMM memory the ids of
 * its chunks (recorded by address), not the id at the byte asked, which
 * differs from chunk to chunk of one run.
 */
static uint64_t ident_of(const struct drc__mem *m)
{
    uint64_t h = m->nchunks ? 0xcbf29ce484222325ull : m->buffer_id;
    unsigned i;

    for (i = 0; i < m->nchunks; i++)
        h = (h ^ m->chunk[i].id) * 0x100000001b3ull;
    return h;
}

static void drop_locked(struct entry *e)
{
    close(e->fd);
    e->hi = 0;
    __atomic_store_n(&live, live - 1, __ATOMIC_RELAXED);
}

/* The entry for this key, with a stale entry at the same bounds dropped on the way (lock held). */
static struct entry *find_locked(int dev, uintptr_t alo, uintptr_t ahi, uint64_t ident, int pcie)
{
    struct entry *e, *hit = NULL;

    for (e = table; e < table + EXPORTS; e++) {
        if (!e->hi || e->device != dev || e->alo != alo || e->ahi != ahi)
            continue;
        if (e->ident != ident)
            drop_locked(e);     /* freed and allocated again behind drc's back */
        else if (e->pcie == pcie)
            hit = e;
    }
    return hit;
}

/* A dup of the entry's fd for the caller (lock held). */
static int hand_out(struct entry *e, uintptr_t start, int *fd, uint64_t *offset)
{
    int d = fcntl(e->fd, F_DUPFD_CLOEXEC, 0);

    if (d < 0)
        return -errno;
    e->used = ++tick;
    *fd = d;
    *offset = start - e->lo;
    return 0;
}

/*
 * The device refuses the PCIe type (@rc: the driver's answer to the flag on a range the default
 * type exported): not asked again; with DRC_LOG at warn or above, one line per device and cause.
 */
static void pcie_refused(int dev, int rc)
{
    unsigned bit = rc == DRC__CUDA_ERROR_NOT_SUPPORTED ? 1u : 2u;
    __atomic_store_n(&pcie_unsupported[dev], 1, __ATOMIC_RELAXED);
    if (drc__env(DRC__ENV_LOG) >= DRC__LOG_WARN && !(__atomic_fetch_or(&pcie_logged[dev], bit, __ATOMIC_RELAXED) & bit))
        fprintf(stderr,
                "drc: GPU %d: no PCIe dmabuf mapping type (%s): its memory is registered with the default "
                "type, which a NIC under the GPU's PCIe switch may not reach\n",
                dev, rc == DRC__CUDA_ERROR_NOT_SUPPORTED
                         ? "the driver answers CUDA_ERROR_NOT_SUPPORTED: no such path"
                         : "the driver refuses the flag with CUDA_ERROR_INVALID_VALUE where it exports the "
                           "range without it: a driver older than the flag");
}

/*
 * The driver's export of [base, end), the PCIe type first if *pcie. *pcie: in, the type asked;
 * out, the type of the export made (0: the default), left as asked when the export fails. Where
 * the driver refuses the PCIe type (NOT_SUPPORTED or INVALID_VALUE), the default type on the same
 * range says why: it exports, and the flag was refused (pcie_refused); it is refused too, and the
 * range was: -EINVAL, the type asked kept for another range.
 */
static int export_range(const struct drc__cuda_driver *d, const struct drc__mem *m, uintptr_t base,
                        uintptr_t end, int *pcie, int *fd)
{
    int dev = m->device, rc = DRC__CUDA_ERROR_NOT_SUPPORTED, flag_rc = 0, err, switched, out = -1;
    void *saved;

    err = drc__cuda_ctx_push(d, m->ctx, &saved, &switched);
    if (err)
        return err;
    if (*pcie) {
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                              DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
        if (rc == DRC__CUDA_ERROR_NOT_SUPPORTED || rc == DRC__CUDA_ERROR_INVALID_VALUE)
            flag_rc = rc;
    }
    if (!*pcie || flag_rc) {
        out = -1;
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (!rc && flag_rc) {
            *pcie = 0;
            pcie_refused(dev, flag_rc);     /* the default type exported the same range: the flag was the trouble */
        }
    }
    drc__cuda_ctx_pop(d, saved, switched);
    if (rc)
        return drc__cuda_errno(rc);
    *fd = out;
    return 0;
}

int drc__cuda_export(const struct drc__mem *m, uintptr_t start, size_t len, int *pcie_io, int *fd, uint64_t *offset)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
    struct entry *e, *slot = NULL;
    uint64_t ident, gen;
    int err, out = -1, busy, pcie = *pcie_io;

    *fd = -1;
    *offset = 0;
    if (!m || m->type != DRC_MEM_CUDA || !len || start + len < start)
        return -EINVAL;
    if (!drc__cuda_can_export(d))
        return -EOPNOTSUPP;
    /* The export must be host-page aligned at both ends (else CUDA_ERROR_INVALID_VALUE): the page hull of
     * the allocation, which a region (itself a page hull) may reach past the allocation's last byte (a
     * 1000-byte cuMemAlloc registers one 4 KiB page; the driver exports it). */
    lo = m->lo & ~(page - 1);
    hi = (m->hi + page - 1) & ~(page - 1);
    if (m->device < 0 || m->device >= DRC__CUDA_MAX_DEVICES || start < lo || start + len > hi)
        return -EINVAL;
    pcie = pcie && !__atomic_load_n(&pcie_unsupported[m->device], __ATOMIC_RELAXED);
    ident = ident_of(m);

    pthread_mutex_lock(&lock);
    e = find_locked(m->device, m->lo, m->hi, ident, pcie);
    if (e) {
        err = hand_out(e, start, fd, offset);
        pthread_mutex_unlock(&lock);
        if (!err)
            *pcie_io = pcie;
        return err;
    }
    pthread_mutex_unlock(&lock);

    /*
     * A miss: one export at a time (export_lock), looked up again first, so
     * that registrations of one allocation on N NICs at once (drc_reg_mr_multi)
     * export it once, not once per thread that missed together.
     */
    pthread_mutex_lock(&export_lock);
    __atomic_fetch_add(&exporting, 1, __ATOMIC_SEQ_CST);   /* before the frees are read: see the timeline above */
    pcie = pcie && !__atomic_load_n(&pcie_unsupported[m->device], __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    e = find_locked(m->device, m->lo, m->hi, ident, pcie);
    if (e) {
        err = hand_out(e, start, fd, offset);
        pthread_mutex_unlock(&lock);
        __atomic_fetch_sub(&exporting, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&export_lock);
        if (!err)
            *pcie_io = pcie;
        return err;
    }
    gen = drops;
    busy = drc__notify_freeing(lo, hi - 1);     /* a free of this memory has begun and not ended */
    pthread_mutex_unlock(&lock);

    err = export_range(d, m, lo, hi, &pcie, &out);
    if (err == -EINVAL) {
        /*
         * A stream-ordered pool (cudaMallocAsync) packs allocations into one mapping, so
         * an allocation's pages may start inside another allocation; the driver refuses
         * such a range (INVALID_VALUE, seen with CUDA 13: tests/gpu) but exports one
         * that starts at the mapping's base, across the allocations. The region's offset
         * is then counted from there. The type asked is asked again there: the range was
         * refused, not the type (export_range).
         */
        drc__cuptr mbase = 0;

        if (d->cuPointerGetAttribute &&
            d->cuPointerGetAttribute(&mbase, DRC__CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, m->lo) == 0 &&
            mbase < lo && !(mbase & (page - 1)) && !(err = export_range(d, m, (uintptr_t)mbase, hi, &pcie, &out)))
            lo = (uintptr_t)mbase;
        else
            err = -EINVAL;
    }
    if (err) {
        __atomic_fetch_sub(&exporting, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&export_lock);
        return err;
    }

    pthread_mutex_lock(&lock);
    if (gen != drops || busy) {
        /* a free ran since the lookup, or was running at it (the timeline above): hand this export out, unshared */
        pthread_mutex_unlock(&lock);
        __atomic_fetch_sub(&exporting, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&export_lock);
        *fd = out;
        *offset = start - lo;
        *pcie_io = pcie;
        return 0;
    }
    e = find_locked(m->device, m->lo, m->hi, ident, pcie);
    if (e) {
        close(out);     /* the PCIe type fell back to a default-type entry that exists: share it */
    } else {
        for (e = table; e < table + EXPORTS; e++) {
            if (!e->hi) {
                slot = e;
                break;
            }
            if (!slot || e->used < slot->used)
                slot = e;
        }
        e = slot;
        if (e->hi)
            drop_locked(e);     /* full: the least recently used entry goes */
        *e = (struct entry){ .lo = lo, .hi = hi, .alo = m->lo, .ahi = m->hi, .ident = ident,
                             .device = m->device, .pcie = pcie, .fd = out };
        __atomic_store_n(&live, live + 1, __ATOMIC_RELAXED);
    }
    err = hand_out(e, start, fd, offset);
    pthread_mutex_unlock(&lock);
    __atomic_fetch_sub(&exporting, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&export_lock);
    if (!err)
        *pcie_io = pcie;
    return err;
}

void drc__cuda_exports_drop(int device, uintptr_t lo, uintptr_t hi)
{
    struct entry *e;

    pthread_mutex_lock(&lock);
    drops++;
    for (e = table; e < table + EXPORTS; e++)
        if (e->hi && (device < 0 || e->device == device) && e->lo < hi && lo < e->hi)
            drop_locked(e);
    pthread_mutex_unlock(&lock);
}

int drc__cuda_exports_live(void)
{
    return __atomic_load_n(&live, __ATOMIC_RELAXED);
}

int drc__cuda_exports_busy(void)
{
    return __atomic_load_n(&live, __ATOMIC_SEQ_CST) || __atomic_load_n(&exporting, __ATOMIC_SEQ_CST);
}

/* memory.c's drc__cuda_forget (a new driver installed): every export closed, nothing learnt kept. */
void drc__cuda_exports_forget(void);

void drc__cuda_exports_forget(void)
{
    drc__cuda_exports_drop(-1, 0, UINTPTR_MAX);
    memset(pcie_unsupported, 0, sizeof(pcie_unsupported));
    memset(pcie_logged, 0, sizeof(pcie_logged));
}
