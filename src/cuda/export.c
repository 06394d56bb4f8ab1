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
 * The fd's lifetime (decided, see README "GPU memory over verbs"): the table
 * keeps one fd per entry for as long as the allocation lives, and hands each
 * registration a dup() of it, which the core closes after reg() returns, as
 * it closed a fresh export before (a custom backend sees no difference). An
 * entry is dropped, its fd closed:
 *   - when the allocation is freed, unmapped or its context torn down:
 *     drc_notify_free() (through core/mem.h's drc__mem_released) and the
 *     begin-free routines of free.c drop it before the real free, because an
 *     open dmabuf fd keeps freed GPU memory taken (measured on the H200);
 *   - when a classification finds other memory at the same bounds (another
 *     buffer id: a free drc did not see), before that memory is exported;
 *   - when the table is full (EXPORTS entries), least recently used first.
 * So the table holds at most EXPORTS fds, whatever the number of
 * registrations (libfabric PR 12828 exhausted `nofile` with one leaked fd per
 * registration), plus one dup per registration in flight. An MR holds the
 * dmabuf by itself: closing an entry never breaks a registration made from it.
 *
 * Mapping type: a request for the PCIe type that the driver answers with
 * NOT_SUPPORTED (no such path: the H200 tested) or INVALID_VALUE (a driver
 * older than the flag) is retried, once, with the default type; where that
 * export succeeds the device is never asked for PCIe again (the entry is then
 * a default-type entry). Only the export's failure falls back: a
 * registration's failure never does.
 *
 * Locks, in this order: `export_lock`, held by a miss from its second
 * lookup to its insertion, so that threads missing on one allocation together
 * (one per NIC) make one export, not one each (exports of different
 * allocations wait for each other: 20-35 us each on the H200); `lock`, which
 * protects the table and is never held across a driver call. Neither is a
 * cache lock (no cache calls this with its lock held), and a free (drop)
 * takes `lock` only, so it never waits for an export. The race that leaves
 * open and how it is closed:
 *
 *   registering thread                       freeing thread
 *   lookup: no entry; gen = drops
 *   cuMemGetHandleForAddressRange (no lock)
 *                                            drop(range): drops++ (no entry yet)
 *                                            cuMemFree
 *   insert: gen != drops -> not kept
 *
 * An export begun before any drop that completed meanwhile is handed out
 * unshared (the caller closes it after its registration), never kept: the
 * table cannot keep an fd of memory whose free it did not see. (The cache's
 * own invalidation protocol then deregisters that registration.)
 */
#include "cuda/cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
static int pcie_unsupported[DRC__CUDA_MAX_DEVICES];   /* atomic: the driver refused the PCIe type */

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

/* The driver's export of [base, end), PCIe type first if asked and not known unsupported. */
static int export_range(const struct drc__cuda_driver *d, const struct drc__mem *m, uintptr_t base,
                        uintptr_t end, int *pcie, int *fd)
{
    int dev = m->device, rc = DRC__CUDA_ERROR_NOT_SUPPORTED, err, switched, out = -1, wanted = *pcie;
    void *saved;

    err = drc__cuda_ctx_push(d, m->ctx, &saved, &switched);
    if (err)
        return err;
    if (*pcie) {
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                              DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
        /* NOT_SUPPORTED: no PCIe type here (the H200 tested); INVALID_VALUE: a driver older than the flag */
        if (rc == DRC__CUDA_ERROR_NOT_SUPPORTED || rc == DRC__CUDA_ERROR_INVALID_VALUE)
            *pcie = 0;
    }
    if (!*pcie) {
        out = -1;
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        /* the flag was the trouble (the default type exported the same range): not worth asking again */
        if (!rc && wanted)
            __atomic_store_n(&pcie_unsupported[dev], 1, __ATOMIC_RELAXED);
    }
    drc__cuda_ctx_pop(d, saved, switched);
    if (rc)
        return drc__cuda_errno(rc);
    *fd = out;
    return 0;
}

int drc__cuda_export(const struct drc__mem *m, uintptr_t start, size_t len, int pcie, int *fd, uint64_t *offset)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
    struct entry *e, *slot = NULL;
    uint64_t ident, gen;
    int err, out = -1;

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
        return err;
    }
    pthread_mutex_unlock(&lock);

    /*
     * A miss: one export at a time (export_lock), looked up again first, so
     * that registrations of one allocation on N NICs at once (drc_reg_mr_multi)
     * export it once, not once per thread that missed together.
     */
    pthread_mutex_lock(&export_lock);
    pcie = pcie && !__atomic_load_n(&pcie_unsupported[m->device], __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    e = find_locked(m->device, m->lo, m->hi, ident, pcie);
    if (e) {
        err = hand_out(e, start, fd, offset);
        pthread_mutex_unlock(&lock);
        pthread_mutex_unlock(&export_lock);
        return err;
    }
    gen = drops;
    pthread_mutex_unlock(&lock);

    err = export_range(d, m, lo, hi, &pcie, &out);
    if (err) {
        pthread_mutex_unlock(&export_lock);
        return err;
    }

    pthread_mutex_lock(&lock);
    if (gen != drops) {
        /* a free ran since the lookup (the timeline above): hand this export out, unshared */
        pthread_mutex_unlock(&lock);
        pthread_mutex_unlock(&export_lock);
        *fd = out;
        *offset = start - lo;
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
    pthread_mutex_unlock(&export_lock);
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

/* memory.c's drc__cuda_forget (a new driver installed): every export closed, nothing learnt kept. */
void drc__cuda_exports_forget(void);

void drc__cuda_exports_forget(void)
{
    drc__cuda_exports_drop(-1, 0, UINTPTR_MAX);
    memset(pcie_unsupported, 0, sizeof(pcie_unsupported));
}
