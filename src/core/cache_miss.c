/*
 * The miss: what to register (one overlap walk under the lock: merge or
 * not), the registration without the lock against a pending entry that an
 * invalidation may mark stale, and the publication of the new region in the
 * tree (cache.c's top comment: "Registrations run without the lock").
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core/cache_int.h"
#include "core/notify.h"

const struct region_mem host_mem = { .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };

/*
 * The hull grows to cover a pending registration (c->lock). Its stores are
 * SC: with the freer's SC fence between the publication of its free and
 * its read of the hull (notify.c), either that read sees the hull grown or
 * the getter's SC loads of the frees in flight, after these stores, see
 * the free (drc__notify_wait_frees), with no fence of the getter's. A hull
 * that already covers the range was grown so by an SC store that happened
 * before this section (the lock orders them), which the same argument
 * covers. Most misses grow nothing, and pay no store: a fill in address
 * order grows it at each miss.
 */
static void widen_hull(drc_cache_t *c, uintptr_t start, uintptr_t last)
{
    if (start < c->lo)
        __atomic_store_n(&c->lo, start, __ATOMIC_SEQ_CST);
    if (last > c->hi)
        __atomic_store_n(&c->hi, last, __ATOMIC_SEQ_CST);
}

/* Does a pending registration, on c->pending or announced, overlap [s, last]? (c->lock) */
static int pending_overlaps(const drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    const struct pending *p;
    unsigned bits;

    for (p = c->pending; p; p = p->next)
        if (p->start <= last && s <= p->last)
            return 1;
    for (bits = announced(c); bits; bits &= bits - 1) {
        p = &c->announced[LW_SLOT_OF(bits)];
        if (p->start <= last && s <= p->last)
            return 1;
    }
    return 0;
}

static void pending_unlink(drc_cache_t *c, struct pending *p)
{
    struct pending **pp;

    for (pp = &c->pending; *pp != p; pp = &(*pp)->next)
        ;
    ST(*pp, p->next);
    pending_done(c);
}

/*
 * A test's seam: the window between the look at c->lw and the checks
 * (tests/core/test_cache_mt.c widens it, test_cache_probe.c takes the lock
 * there); nothing in the product.
 */
#ifndef ANNOUNCE_WINDOW
#define ANNOUNCE_WINDOW() ((void)0)
#endif

/*
 * An announced miss: the miss's first lock section, made by one CAS on
 * c->lw instead of a lock, a pending count's increment and an unlock. It
 * is taken where that section would have nothing to decide: the lockless
 * lookup before found no live region over [start, last] (the probe, at a
 * tree count), and the miss registers that range as it is (no merge, no
 * widening). The section's checks are read first, with no lock, after an
 * acquire load of c->lw that found the lock free and no miss announced:
 *   the tree is the probe's (its count has not moved): nothing overlaps;
 *   nothing is on c->pending: no pending registration overlaps;
 *   the hull covers the range (grown by an SC store before a section's
 *     release, as widen_hull requires).
 * Then the record, c->announced[i] of this thread's slot i, is written and
 * a CAS publishes it with bit i, expecting the word the load saw. Every
 * unlock advances the word's version and every lock sets LW_LOCKED, so the
 * CAS succeeds only if no lock section began since the load: each section
 * before it had ended, and its release is what the checks read (they
 * cannot see one half done, as a check read after the CAS could: a
 * section that began after it, tests/bench/RESULTS.md); each section
 * after it sees the bit and the record. So the checks hold at the CAS, as
 * under the lock: every later miss that overlaps waits for this one
 * (pending_overlaps reads the announced records), every invalidation marks
 * the record stale as it marks c->pending's (invalidate_locked), and every
 * lockless probe reads the bit as it reads npending (nothing_there): the
 * CAS is SC, before the frees in flight are read, as the count's increment
 * was. Returns the bit, and the record in *@rec, or 0: not announced (the
 * caller takes the lock).
 */
static uint64_t announce(drc_cache_t *c, const struct probe *pr, uintptr_t start, uintptr_t last,
                         struct pending **rec)
{
    int i = drc__tslot();
    uint64_t w;
    struct pending *a;

    if (!pr || !pr->none || pr->start != start || pr->last != last || i >= LW_SLOTS ||
        (c->max_len && last - start >= c->max_len))
        return 0;
    w = __atomic_load_n(&c->lw, __ATOMIC_ACQUIRE);
    if (w & (LW_LOCKED | LW_ANNOUNCED))
        return 0;
    ANNOUNCE_WINDOW();
    if (!drc__itree_unchanged(&c->tree, &pr->path) || LD(c->pending) || LD(c->lo) > start || LD(c->hi) < last)
        return 0;
    a = &c->announced[i];
    ST(a->start, start);
    ST(a->last, last);
    ST(a->stale, 0);
    if (!__atomic_compare_exchange_n(&c->lw, &w, w | LW_SLOT(i), 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        return 0;
    *rec = a;
    return LW_SLOT(i);
}

/* A miss: what to register, given the overlapping live regions (c->lock). */
struct plan {
    struct drc__itree_path *path;   /* of the overlap walk: where the insert goes if nothing changed */
    struct drc__itree_path own;     /* the walk's own, or the probe's (struct probe) */
    uintptr_t start, last;
    unsigned access;
    int merging;
    int overlaps;       /* a live region overlapping it stays: set c->overlapping */
};

/*
 * May r be joined into a registration of @m with @access? Same memory, and
 * the same bits (with DRC_F_ACCESS_SUPERSET: the same remote bits; the merge
 * takes the union of the local ones): a merge never grants what was not asked.
 */
static int joinable(const drc_cache_t *c, const struct drc_region *r, const struct drc__mem *m, unsigned access)
{
    unsigned same = c->flags & DRC_F_ACCESS_SUPERSET ? DRC_ACCESS_REMOTE : ~0u;

    return region_type(r) == m->type && region_mem(r)->device == m->device && LD(r->node.start) >= m->lo &&
           LD(r->node.last) < m->hi &&  /* hi is exclusive (mem.h) */
           (r->access & same) == (access & same);
}

/*
 * A plan that registers [start, last] with @access as it is, its insert
 * where @path leads (p->own: a walk of its own). Field by field: the plan's
 * own path (most of its bytes) is written only by a walk that uses it, not
 * zeroed in every miss.
 */
static void plan_init(struct plan *p, struct drc__itree_path *path, uintptr_t start, uintptr_t last,
                      unsigned access)
{
    p->path = path;
    p->own.depth = 0;
    p->start = start;
    p->last = last;
    p->access = access;
    p->merging = 0;
    p->overlaps = 0;
}

/*
 * One overlap walk under the lock: a live region that serves [s, last]
 * (returned in *hit), else the plan of the miss, which registers [ws, wlast]
 * (the range asked, or the allocation around it when widened: see
 * get_slow). A miss is coalesced with every overlapping joinable region,
 * unless the union would be more than twice the request's own page range:
 * then it is registered alone, overlapping its neighbours, so that buffers
 * packed next to each other (sharing their boundary pages) never
 * re-register a growing union.
 */
static int plan_region(drc_cache_t *c, uintptr_t s, uintptr_t last, uintptr_t ws, uintptr_t wlast,
                       unsigned access, const struct drc__mem *m, struct probe *pr, struct plan *p,
                       struct drc_region **hit)
{
    struct drc__itree_node *n;
    uintptr_t start = ws & ~(uintptr_t)(c->page - 1), end = wlast | (c->page - 1);
    int budget = DRC__ITREE_UNBOUNDED;

    ASSERT_LOCKED(c);
    *hit = NULL;
    plan_init(p, &p->own, start, end, access);
    /*
     * No live region touches a grain of the pages (the filter is exact
     * enough under the lock), or the lookup before found none there and
     * the tree has not changed since (struct probe): no walk.
     */
    if (pr && pr->none && pr->start == start && pr->last == end && drc__itree_unchanged(&c->tree, &pr->path)) {
        p->path = &pr->path;
        n = NULL;
    } else {
        n = used_none(c->hint, start, end) ? NULL : drc__itree_first_at(&c->tree, start, end, &budget, p->path);
    }
    for (; n; n = drc__itree_next(&c->tree, n, start, end, &budget)) {
        struct drc_region *r = region_of(n);

        if (n->start <= s && n->last >= last && serves(c, r->access, access)) {
            *hit = r;
            return 0;
        }
        if ((c->flags & DRC_F_NO_MERGE) || !joinable(c, r, m, access)) {
            p->overlaps = 1;
            continue;
        }
        if (n->start < p->start)
            p->start = n->start;
        if (n->last > p->last)
            p->last = n->last;
        p->access |= r->access;
        p->merging = 1;
    }
    if (c->max_len && end - start >= c->max_len)
        return -E2BIG;
    if (p->merging && ((c->max_len && p->last - p->start >= c->max_len) || p->last - p->start == UINTPTR_MAX ||
                       (p->last - p->start) / 2 > end - start)) {
        p->start = start;       /* too large for the device, for a size_t, or for what was asked */
        p->last = end;
        p->access = access;
        p->merging = 0;
        p->overlaps = 1;
    }
    return 0;
}

/* Move every live region the new one joins out of the tree (c->lock, seq odd). */
static void supersede(drc_cache_t *c, const struct plan *p, const struct drc__mem *m, struct drc_region **dead)
{
    struct drc__itree_node *n, *next;
    int budget = DRC__ITREE_UNBOUNDED;

    ASSERT_WRITING(c);
    for (n = drc__itree_first(&c->tree, p->start, p->last, &budget); n; n = next) {
        struct drc_region *r = region_of(n);

        next = drc__itree_next(&c->tree, n, p->start, p->last, &budget);
        if (joinable(c, r, m, p->access) && n->start >= p->start && n->last <= p->last)
            retire(c, r, dead);
    }
    INC(c->merges, 1);
}

static int register_plan(drc_cache_t *c, const struct plan *p, const struct drc__mem *m, void **handle,
                         uint32_t *lkey, uint32_t *rkey)
{
    struct drc_reg_args a = {
        .start = p->start, .len = p->last - p->start + 1, .type = m->type, .device = m->device,
        .dmabuf_fd = -1, .dmabuf_offset = 0, .access = p->access,
    };
    int err = 0;
    unsigned asked, flags;

    if (m->type == DRC_MEM_CUDA) {
        asked = flags = (c->export_flags ? c->export_flags(c->be.ctx, m->device) : c->flags) & DRC_F_DMABUF_PCIE;
        err = (DRC_ASSERT_NO_LOCK(), drc__mem_export(m, a.start, a.len, &flags, &a.dmabuf_fd, &a.dmabuf_offset));
        if (!err && asked && !flags)
            __atomic_fetch_add(&c->downgraded, 1, __ATOMIC_RELAXED);    /* the default type instead of PCIe */
    }
    if (err == -EOPNOTSUPP)
        err = 0;    /* no dmabuf here (proprietary GPU module): the backend gets fd -1 and may use peermem */
    if (!err)
        err = be_reg(c, &a, handle, lkey, rkey);
    if (a.dmabuf_fd >= 0)
        close(a.dmabuf_fd);     /* the MR holds the buffer now */
    return err;
}

/* Fill a pooled region and put it in the tree (c->lock, seq odd). */
static void publish(drc_cache_t *c, struct drc_region *r, const struct plan *p, const struct drc__mem *m,
                    void *handle, uint32_t lkey, uint32_t rkey)
{
    /* the slot's own chunk records (get_slow attached one if m has chunks) */
    struct region_chunks *chunks = region_chunks(r);
    struct region_ext *e;

    ASSERT_WRITING(c);
    DRC_ASSERT(LD(r->word) == 0 && region_cache(r) == c);
    ST(r->node.start, p->start);
    ST(r->node.last, p->last);
    ST(r->access, p->access);
    ST(r->valid, 1);
    ST(r->detached, 0);
    DRC_ASSERT(!m->nchunks || chunks);
    if (m->type == DRC_MEM_HOST) {
        /* host_mem, which region_mem() hands out: the ext is not written (cache_int.h) */
        DRC_ASSERT(m->device == host_mem.device && m->lo == host_mem.lo && m->hi == host_mem.hi &&
                   m->buffer_id == 0 && !m->ctx && !m->nchunks);
        r->kind = (uint8_t)((r->kind & KIND_EXT) | DRC_MEM_HOST);
    } else {
        e = region_ext(r);
        e->mem = (struct region_mem){ .type = m->type, .device = m->device, .lo = m->lo, .hi = m->hi,
                                      .buffer_id = m->buffer_id, .ctx = m->ctx, .chunks = chunks };
        if (chunks) {
            chunks->n = m->nchunks;
            memcpy(chunks->chunk, m->chunk, m->nchunks * sizeof(m->chunk[0]));
        }
        r->kind = (uint8_t)(KIND_EXT | m->type);
    }
    r->handle = handle;
    r->lkey = lkey;
    r->rkey = rkey;
    __atomic_store_n(&r->word, HELD + 1, __ATOMIC_RELEASE);   /* the fields above, then the count */
    used_set(c->hint, p->start, p->last);       /* seq is odd: a probe that read the bits before retries */
    r->leaf = drc__itree_insert_at(&c->tree, &r->node, p->path);     /* no descent if the tree is as planned */
    if (c->limited)
        lru_append(c, r);
    INC(c->regions, 1);
    INC(c->bytes, region_len(r));
    tally(c, ST_USED);      /* HELD + 1 */
}

/*
 * Widening (drc__get_widened, which drc_reg_mr calls for the registrations
 * its rule allows): a miss on CUDA memory registers the whole allocation
 * around the range, as the classification found it, so that the tensors
 * packed in one allocation cost one registration and every later one is a
 * hit. The miss is the one place that knows the bounds: a hit is looked up
 * by the range asked, which the widened region contains, and asks no one.
 * An allocation larger than the backend's max_len is not widened (the range
 * as asked is registered, as drc_get would).
 */
static void widen_to(const drc_cache_t *c, const struct drc__mem *m, uintptr_t *ws, uintptr_t *wlast)
{
    uintptr_t lo = m->alloc_lo & ~(uintptr_t)(c->page - 1), last = (m->alloc_hi - 1) | (c->page - 1);

    if (m->type != DRC_MEM_CUDA || m->alloc_lo >= m->alloc_hi || (c->max_len && last - lo >= c->max_len))
        return;
    *ws = m->alloc_lo;
    *wlast = m->alloc_hi - 1;
}

/*
 * Index nodes to ask for beyond what the next insert needs: a growing
 * cache takes one trip out of the lock per batch, not per leaf split.
 */
static unsigned tree_batch(const drc_cache_t *c)
{
    uint64_t n = c->regions / (DRC__ITREE_FAN * 8);

    return n < 8 ? 8 : n > 256 ? 256 : (unsigned)n;
}

/*
 * The locked path: a hit the lockless walk could not take, or a miss
 * (widened to the allocation if @widen: see widen_to).
 * Returns 0 with a cached *out, 1 with a region registered just now, RACED
 * if an invalidation raced the registration, or an error.
 */
int get_slow(drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access, int widen, struct probe *pr,
             struct drc_region **out)
{
    struct drc_region *r, *dead = NULL;
    struct chunk *spare = NULL;
    struct region_chunks *ext = NULL;     /* chunk records for r, if m has them and r has none */
    struct drc__mem m;
    struct pending own, *pend;      /* on c->pending, or this thread's announced record */
    struct plan p;
    void *handle = NULL;
    uint32_t lkey = 0, rkey = 0;
    uintptr_t ws = s, wlast = last;     /* what a miss registers: the range, or its allocation */
    int err, registered;
    unsigned grow, need;
    uint64_t bit;       /* the miss is announced (announce()): its LW_SLOT */
    void *nodes;

    DRC_ASSERT_NO_LOCK();
    if ((last | (c->page - 1)) - (s & ~(uintptr_t)(c->page - 1)) == UINTPTR_MAX)
        return -EINVAL;     /* page-rounded, it is the whole address space: its length does not fit (no
                             * region can contain it, so a lookup has missed it already) */
    err = drc__mem_classify(s, last - s + 1, &m);   /* a driver call: before the lock */
    if (err)
        return err;
    if (widen)
        widen_to(c, &m, &ws, &wlast);
    bit = announce(c, pr, ws & ~(uintptr_t)(c->page - 1), wlast | (c->page - 1), &pend);
    if (bit) {
        plan_init(&p, &pr->path, pend->start, pend->last, access);     /* the probe's walk: no overlap */
        goto registration;
    }
    lock(c);
    for (;;) {
        err = plan_region(c, s, last, ws, wlast, access, &m, pr, &p, &r);
        if (r) {
            if (!USERS(__atomic_fetch_add(&r->word, 1, __ATOMIC_SEQ_CST)))
                tally(c, ST_USED);
            __atomic_store_n(hint_slot(c, s), r, __ATOMIC_RELEASE);
            unlock(c);
            count_hit(c);
            *out = r;
            return 0;
        }
        if (!pending_overlaps(c, ws, wlast))
            break;
        wait_pending(c);
    }
    INC(c->misses, 1);
    if (err) {
        unlock(c);
        return err;
    }
    own = (struct pending){ .start = p.start, .last = p.last, .stale = 0, .next = c->pending };
    pend = &own;
    ST(c->pending, pend);
    __atomic_fetch_add(&c->npending, 1, __ATOMIC_SEQ_CST);    /* before the frees are read (notify.c) */
    widen_hull(c, p.start, p.last);
    unlock(c);

registration:
    drc__notify_wait_frees(p.start, p.last);    /* never export memory a hook is freeing (notify.c) */
    err = register_plan(c, &p, &m, &handle, &lkey, &rkey);
    registered = !err;
    if (!err && m.nchunks && !(ext = mem_alloc(sizeof(*ext))))     /* multi-chunk VMM memory only */
        err = -ENOMEM;

    lock(c);
    if (bit)
        INC(c->misses, 1);
    r = NULL;
    while (!err && !pend->stale) {
        /*
         * The index's nodes for the insert, then a region. Either may need
         * memory: it is allocated without the lock (an allocator may
         * re-enter drc), still pending, and the checks start again.
         */
        if ((need = drc__itree_need(&c->tree))) {
            need += tree_batch(c);     /* c->regions: under the lock */
            unlock(c);
            nodes = drc__arena_alloc(&c->arena, need * (size_t)DRC__ITREE_NODE);
            lock(c);
            if (!nodes)
                err = -ENOMEM;
            else
                drc__itree_give(&c->tree, nodes, need * (size_t)DRC__ITREE_NODE);
            continue;
        }
        if ((r = pool_get(c, &spare)))
            break;
        unlock(c);
        spare = chunk_new(c);
        lock(c);
        if (!spare)
            err = -ENOMEM;
    }
    if (bit)
        pending_done(c);    /* its bit goes with the unlock below */
    else
        pending_unlink(c, pend);
    INC(c->regs, (uint64_t)registered);
    if (!err && pend->stale)
        err = RACED;        /* it may map memory that is being freed: never insert it */
    if (err) {
        if (!bit)
            __atomic_fetch_sub(&c->npending, 1, __ATOMIC_SEQ_CST);
        unlock_announced(c, bit);
        chunk_drop(c, spare);
        mem_free(ext);
        if (registered)
            be_dereg(c, handle);
        return err;
    }
    if (m.nchunks && !region_chunks(r)) {
        region_ext(r)->mem.chunks = ext;    /* the slot keeps it until drc_cache_destroy() */
        r->kind |= KIND_EXT;
        ext = NULL;
    }
    seq_begin(c);
    if (p.merging)
        supersede(c, &p, &m, &dead);
    if (p.overlaps && !c->overlapping) {
        drc__itree_set_disjoint(&c->tree, 0);  /* before the insert that overlaps */
        ST_SC(c->overlapping, 1);
    }
    publish(c, r, &p, &m, handle, lkey, rkey);
    __atomic_store_n(hint_slot(c, s), r, __ATOMIC_RELEASE);
    if (c->limited)
        evict(c, &dead);
    seq_end(c);
    /*
     * Inserted: a probe that reads the count now finds the region (see
     * drc_invalidate). Changed only under the lock, so a store; a release,
     * not an exchange: nothing this thread loads after it must wait for it,
     * and a probe's SC load that reads it also sees the insert before it.
     */
    if (!bit)
        __atomic_store_n(&c->npending, c->npending - 1, __ATOMIC_RELEASE);
    grow = hint_want(c);
    unlock_announced(c, bit);   /* an announced miss ends here: its bit is cleared as the lock is let go */
    release_list(c, dead);
    chunk_drop(c, spare);   /* a chunk another thread's made unneeded */
    mem_free(ext);          /* r had chunk records of its own */
    if (grow)
        hint_grow(c, grow);
    *out = r;
    return 1;
}
