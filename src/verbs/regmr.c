/*
 * drc_reg_mr / drc_dereg_mr: ibv_reg_mr and ibv_dereg_mr through a per-PD cache.
 *
 * A transfer engine registers each buffer it will post from, often many
 * overlapping sub-buffers of one big allocation, and deregisters each when
 * done. Here every registration becomes a drc_get() on the cache of its PD
 * (created on the PD's first registration) and every deregistration the
 * matching drc_put(): overlapping registrations share one coalesced MR, a
 * repeated one costs a lockless hit, and GPU memory is registered through
 * dmabuf by the verbs backend. Sharing is among registrations that ask the
 * same access bits (unless the configuration opts into
 * DRC_F_ACCESS_SUPERSET): every caller's keys allow what it asked, no more.
 *
 * The caller gets an ibv_mr of its own, so that its fields read as if
 * ibv_reg_mr had made it: addr and length as asked (the cached MR covers a
 * page-aligned superset, and for dmabuf its addr is an offset into the
 * dmabuf), context, pd, handle, lkey and rkey of the cached MR. The keys are
 * what the caller posts with; any range inside [addr, addr+length) is
 * covered by them.
 *
 * GPU registrations that ask no remote access are widened to their whole
 * allocation (the range cuMemGetAddressRange gives: for VMM memory, one
 * mapped chunk) by the cache's miss, which finds those bounds as it
 * classifies the memory (drc__get_widened); a hit, looked up by the range
 * asked, asks the CUDA driver nothing. (GPU memory only: pinned host and
 * managed memory, registered through their host mapping, are registered as
 * asked, as every host buffer.) An engine registers a KV cache
 * as thousands of tensors packed back to back in one allocation; registered
 * as asked, neighbours that share a page coalesce one by one, and each merge
 * registers the union again — thousands of ever larger registrations.
 * Widened, the first registration covers the allocation and every later one
 * is a hit. Should the whole allocation be larger than the device's
 * max_mr_size (-E2BIG), the range as asked is registered instead.
 *
 * A registration asking REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC or MW_BIND
 * is not widened unless the configuration says DRC_F_WIDEN_REMOTE: its rkey
 * goes to a peer, and a peer holding it may touch everything the MR covers
 * with everything it allows. Widened, a read-only rkey for a 4 KiB tensor
 * would let a peer write the whole allocation. DRC_F_NO_WIDEN turns widening
 * off for local registrations too.
 *
 * Two tables, each under its own lock:
 *   pds  (pds_lock, a rwlock: read on every registration)  PD -> cache
 *   mrs  (mrs_lock)  caller ibv_mr -> the region it holds
 * The MR table is how drc_dereg_mr tells its own MRs from any other: nothing
 * is ever read from an ibv_mr that is not in it (a provider's MR has no room
 * for a mark in front of it). Neither lock is held while calling into the
 * cache or libibverbs, except pds_lock around drc_cache_destroy in
 * drc_pd_release, and no memory is freed under them but uthash's own bucket
 * arrays, so a free hook (munmap, madvise) that runs inside such a call may
 * invalidate and deregister freely. Lock order: pds_lock, then mrs_lock
 * (core/fork.h has the whole order, and what a fork() child does with them).
 * (libibverbs is reached through the verbs ops table, which inside the
 * preload forwards to the next definitions: a dereg of the destroy never
 * comes back to the interposer.)
 *
 * Counters over the process's life (for the interposer's exit summary) are
 * atomics; a PD's cache statistics are added to `retired` when it goes.
 */
#include "verbs/regmr.h"

#include "core/cache.h"
#include "core/config.h"
#include "core/fork.h"
#include "verbs/ops.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* uthash calls exit() on allocation failure unless told otherwise: a library must not. */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (oom_hit = 1)
static __thread int oom_hit __attribute__((tls_model("initial-exec")));
#include <uthash.h>

struct pd_entry {
    struct ibv_pd *pd;          /* key */
    drc_cache_t *cache;
    int gpu_seen;               /* atomic: a GPU MR was registered on this PD */
    UT_hash_handle hh;
};

struct caller_mr {
    struct ibv_mr mr;           /* what the caller holds; its address is the key */
    struct ibv_mr *key;
    drc_cache_t *cache;
    drc_region_t *region;
    UT_hash_handle hh;
};

static pthread_rwlock_t pds_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct pd_entry *pds;            /* pds_lock */
static pthread_mutex_t mrs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct caller_mr *mrs;           /* mrs_lock */

static struct drc_config config;        /* set before the first registration */
static int configured;

static uint64_t n_gpu, n_host, n_direct;    /* atomic: caller MRs handed out, ever */
static uint64_t n_live, n_peak;             /* atomic: caller MRs held now, and the most at once */
static uint64_t n_pds;                      /* atomic: per-PD caches made, ever */
static uint64_t n_dmabuf, n_peermem;        /* atomic: per-PD caches whose GPU 0 registered that way */
static struct drc_stats retired;            /* pds_lock (write): stats of the caches released */

/*
 * fork() (core/fork.h). mrs_lock is held for hash operations only: the fork
 * waits for it, so the MR table is whole in the child and kept there; it is
 * how the child's drc_dereg_mr of a parent MR knows it for drc's (released
 * on its inert cache, never handed to the provider, which would take it for
 * one of its own). pds_lock is held across drc_cache_destroy, which calls
 * the provider: the fork cannot wait for it (a provider's own fork handler,
 * run before this one, may hold what that call needs; the loopback provider
 * does). So the PD table may be half written in the child: dropped, with the
 * statistics it guards (its entries and their inert caches are left, memory
 * only). A child's registration on a PD then makes a cache of its own, as the
 * provider would be asked without drc.
 */
static void regmr_prepare(void)
{
    pthread_mutex_lock(&mrs_lock);
}

static void regmr_parent(void)
{
    pthread_mutex_unlock(&mrs_lock);
}

static void regmr_child(void)
{
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;

    pds_lock = fresh;
    pds = NULL;
    memset(&retired, 0, sizeof(retired));
    pthread_mutex_init(&mrs_lock, NULL);
}

__attribute__((constructor)) static void regmr_fork_init(void)
{
    drc__fork_register(DRC__FORK_REGMR, regmr_prepare, regmr_parent, regmr_child);
}

void drc__regmr_configure(const struct drc_config *cfg)
{
    if (cfg) {
        config = *cfg;
        configured = 1;
    } else {
        memset(&config, 0, sizeof(config));
        configured = 0;
    }
}

int drc_reg_mr_configure(const struct drc_config *cfg)
{
    if (cfg && ((unsigned)cfg->policy > DRC_PEERMEM_ONLY ||
                (cfg->flags & (DRC_F_WIDEN_REMOTE | DRC_F_NO_WIDEN)) == (DRC_F_WIDEN_REMOTE | DRC_F_NO_WIDEN) ||
                (cfg->flags & (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT)) == (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT)))
        return -EINVAL;
    drc__regmr_configure(cfg);
    return 0;
}

static struct pd_entry *pd_find(struct ibv_pd *pd)
{
    struct pd_entry *e;

    pthread_rwlock_rdlock(&pds_lock);
    HASH_FIND_PTR(pds, &pd, e);
    pthread_rwlock_unlock(&pds_lock);
    return e;
}

/*
 * The PD's cache, made on first use. The cache is created outside the lock
 * (it queries the device); if another thread won the race, ours is dropped.
 */
static int pd_get(struct ibv_pd *pd, struct pd_entry **out)
{
    struct pd_entry *e, *other;
    drc_cache_t *c;
    int err;

    if ((*out = pd_find(pd)))
        return 0;
    e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    err = drc_cache_create_verbs(pd, configured ? &config : NULL, &c);
    if (err)
        goto err_free;
    e->pd = pd;
    e->cache = c;
    pthread_rwlock_wrlock(&pds_lock);
    HASH_FIND_PTR(pds, &pd, other);
    if (!other) {
        oom_hit = 0;
        HASH_ADD_PTR(pds, pd, e);
        if (oom_hit) {
            pthread_rwlock_unlock(&pds_lock);
            err = -ENOMEM;
            goto err_destroy;
        }
        __atomic_fetch_add(&n_pds, 1, __ATOMIC_RELAXED);
    }
    pthread_rwlock_unlock(&pds_lock);
    if (other) {
        drc_cache_destroy(c);   /* never used: nothing to deregister */
        free(e);
        e = other;
    }
    *out = e;
    return 0;

err_destroy:
    drc_cache_destroy(c);
err_free:
    free(e);
    return err;
}

/* Access bits that change what a registration means cannot share a cached MR. */
static int cacheable(int access)
{
    return access >= 0 && !((unsigned)access & ~DRC_ACCESS_MASK);
}

#define REMOTE_ACCESS \
    (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND)

/* May a registration asking @access be widened to its allocation? (See the opening comment.) */
static int may_widen(unsigned access)
{
    unsigned flags = configured ? config.flags : 0;

    if (flags & DRC_F_NO_WIDEN)
        return 0;
    return !(access & REMOTE_ACCESS) || (flags & DRC_F_WIDEN_REMOTE);
}

/*
 * drc_get on [addr, addr+len), whose miss registers the GPU allocation around it if widening is
 * allowed (core/cache.h). The bounds are the miss's to find: a hit asks the driver nothing.
 */
static int get_widened(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **r)
{
    return may_widen(access) ? drc__get_widened(c, addr, len, access, r) : drc_get(c, addr, len, access, r);
}

struct ibv_mr *drc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    struct caller_mr *m;
    struct pd_entry *e;
    drc_region_t *r;
    struct ibv_mr *cached;
    uint64_t live, peak;
    int err;

    if (!pd || !len) {
        errno = EINVAL;
        return NULL;
    }
    if (!cacheable(access)) {
        /* ON_DEMAND, ZERO_BASED, HUGETLB...: register as asked; drc_dereg_mr passes it through */
        const struct drc__verbs_ops *ops = drc__verbs();

        __atomic_fetch_add(&n_direct, 1, __ATOMIC_RELAXED);
        if (!ops->reg_mr_iova2) {
            errno = ENOSYS;
            return NULL;
        }
        return ops->reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    err = pd_get(pd, &e);
    if (err)
        goto err_free;
    err = get_widened(e->cache, addr, len, (unsigned)access, &r);
    if (err)
        goto err_free;
    cached = drc_region_mr(r);
    m->mr = (struct ibv_mr){
        .context = cached ? cached->context : pd->context,
        .pd = pd,
        .addr = addr,
        .length = len,
        .handle = cached ? cached->handle : 0,
        .lkey = drc_region_lkey(r),
        .rkey = drc_region_rkey(r),
    };
    m->key = &m->mr;
    m->cache = e->cache;
    m->region = r;
    pthread_mutex_lock(&mrs_lock);
    oom_hit = 0;
    HASH_ADD_PTR(mrs, key, m);
    pthread_mutex_unlock(&mrs_lock);
    if (oom_hit) {
        err = -ENOMEM;
        goto err_put;
    }
    if (drc_region_type(r) == DRC_MEM_CUDA) {
        __atomic_fetch_add(&n_gpu, 1, __ATOMIC_RELAXED);
        if (!__atomic_exchange_n(&e->gpu_seen, 1, __ATOMIC_RELAXED)) {
            int method = drc_cache_verbs_method(e->cache, 0);

            if (method == DRC_METHOD_DMABUF)
                __atomic_fetch_add(&n_dmabuf, 1, __ATOMIC_RELAXED);
            else if (method == DRC_METHOD_PEERMEM)
                __atomic_fetch_add(&n_peermem, 1, __ATOMIC_RELAXED);
        }
    } else {
        __atomic_fetch_add(&n_host, 1, __ATOMIC_RELAXED);
    }
    live = __atomic_add_fetch(&n_live, 1, __ATOMIC_RELAXED);
    peak = __atomic_load_n(&n_peak, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&n_peak, &peak, live, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return &m->mr;

err_put:
    drc_put(e->cache, r);
err_free:
    free(m);
    errno = -err;
    return NULL;
}

int drc__regmr_owns(const struct ibv_mr *mr)
{
    struct caller_mr *m;

    pthread_mutex_lock(&mrs_lock);
    HASH_FIND_PTR(mrs, &mr, m);
    pthread_mutex_unlock(&mrs_lock);
    return m != NULL;
}

int drc__regmr_dereg(struct ibv_mr *mr)
{
    struct caller_mr *m;
    int err;

    if (!mr)
        return -EINVAL;
    pthread_mutex_lock(&mrs_lock);
    HASH_FIND_PTR(mrs, &mr, m);
    if (m)
        HASH_DEL(mrs, m);
    pthread_mutex_unlock(&mrs_lock);
    if (!m)
        return -ENOENT;
    __atomic_fetch_sub(&n_live, 1, __ATOMIC_RELAXED);
    err = drc_put(m->cache, m->region);
    free(m);
    return err;
}

int drc_dereg_mr(struct ibv_mr *mr)
{
    int err = drc__regmr_dereg(mr);

    if (err != -ENOENT)
        return err;
    if (!drc__verbs()->dereg_mr)
        return -ENOSYS;
    err = drc__verbs()->dereg_mr(mr);   /* not ours: an MR drc_reg_mr passed through, or any other */
    return err > 0 ? -err : err;
}

static void add_stats(struct drc_stats *to, const struct drc_stats *s)
{
    to->hits += s->hits;
    to->misses += s->misses;
    to->merges += s->merges;
    to->invalidated += s->invalidated;
    to->evicted += s->evicted;
    to->regs += s->regs;
    to->deregs += s->deregs;
    to->regions += s->regions;
    to->bytes += s->bytes;
    to->in_use += s->in_use;
    to->dmabuf_downgraded += s->dmabuf_downgraded;
}

int drc_pd_release(struct ibv_pd *pd)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };     /* drc.h's ABI rule, as for any caller */
    struct pd_entry *e;
    int err;

    if (!pd)
        return -EINVAL;
    pthread_rwlock_wrlock(&pds_lock);
    HASH_FIND_PTR(pds, &pd, e);
    if (!e) {
        pthread_rwlock_unlock(&pds_lock);
        return 0;
    }
    drc_cache_stats(e->cache, &s);
    err = drc_cache_destroy(e->cache);
    if (!err) {
        HASH_DEL(pds, e);
        /* the destroy deregistered every region a lookup could still find (nothing was referenced) */
        s.deregs += s.regions;
        s.regions = s.bytes = s.in_use = 0;
        add_stats(&retired, &s);
    }
    pthread_rwlock_unlock(&pds_lock);
    if (!err)
        free(e);
    return err;
}

void drc__regmr_totals(struct drc__regmr_totals *t)
{
    struct pd_entry *e, *tmp;
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

    memset(t, 0, sizeof(*t));
    t->pds = __atomic_load_n(&n_pds, __ATOMIC_RELAXED);
    t->mrs_gpu = __atomic_load_n(&n_gpu, __ATOMIC_RELAXED);
    t->mrs_host = __atomic_load_n(&n_host, __ATOMIC_RELAXED);
    t->mrs_direct = __atomic_load_n(&n_direct, __ATOMIC_RELAXED);
    t->live = __atomic_load_n(&n_live, __ATOMIC_RELAXED);
    t->peak = __atomic_load_n(&n_peak, __ATOMIC_RELAXED);
    t->dmabuf = __atomic_load_n(&n_dmabuf, __ATOMIC_RELAXED);
    t->peermem = __atomic_load_n(&n_peermem, __ATOMIC_RELAXED);
    pthread_rwlock_rdlock(&pds_lock);
    t->cache = retired;
    HASH_ITER(hh, pds, e, tmp) {
        t->pds_now++;
        drc_cache_stats(e->cache, &s);
        add_stats(&t->cache, &s);
    }
    pthread_rwlock_unlock(&pds_lock);
}

/*
 * drc_reg_mr_multi: drc_reg_mr on each of n PDs, from up to MULTI_THREADS
 * threads (the caller's among them). Each worker takes the next index from
 * `next` (an atomic); the registrations share nothing but the export table
 * (one export of the allocation for every PD) and each PD's cache, both
 * thread-safe. mrs[i] and errs[i] are written by the one worker that took i,
 * and read by the caller after pthread_join.
 */
enum { MULTI_THREADS = 8, MULTI_MAX = 1024 };

struct multi {
    struct ibv_pd **pds;
    int n, next;                /* next: atomic */
    void *addr;
    size_t len;
    int access;
    struct ibv_mr **mrs;
    int *errs;
};

static void *multi_worker(void *arg)
{
    struct multi *w = arg;
    int i;

    while ((i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->n) {
        w->mrs[i] = drc_reg_mr(w->pds[i], w->addr, w->len, w->access);
        w->errs[i] = w->mrs[i] ? 0 : -(errno ? errno : EIO);
    }
    return NULL;
}

int drc_reg_mr_multi(struct ibv_pd **pdv, int n, void *addr, size_t len, int access, struct ibv_mr **out)
{
    pthread_t tid[MULTI_THREADS - 1];
    struct multi w = { pdv, n, 0, addr, len, access, out, NULL };
    int i, started = 0, err = 0, threads;

    if (!pdv || !out || n <= 0 || n > MULTI_MAX || !len)
        return -EINVAL;
    for (i = 0; i < n; i++)
        if (!pdv[i])
            return -EINVAL;
    w.errs = calloc((size_t)n, sizeof(*w.errs));
    if (!w.errs)
        return -ENOMEM;
    memset(out, 0, (size_t)n * sizeof(*out));
    /*
     * One thread per PD beyond the caller's, at most `threads` in all
     * (MULTI_THREADS, or DRC_REG_THREADS for a provider that registers
     * serially anyway: 1 = the caller alone; config.c bounds it by MULTI_THREADS);
     * none started: the caller does all.
     */
    threads = (int)drc__env(DRC__ENV_REG_THREADS);
    if (threads < 1 || threads > MULTI_THREADS)
        threads = MULTI_THREADS;
    while (started < n - 1 && started < threads - 1 && pthread_create(&tid[started], NULL, multi_worker, &w) == 0)
        started++;
    multi_worker(&w);
    for (i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    for (i = 0; i < n && !err; i++)
        err = w.errs[i];
    if (err) {
        /*
         * Roll back what this call took, nothing else: one reference per MR
         * it handed out. A registration of this call may have been a hit on
         * a region another caller holds; invalidating the range would revoke
         * that caller's keys (DRC_F_REVOKE) or retire its region and close
         * the shared export (without), making every caller of that memory
         * register again, though nothing was freed. The NIC MRs this call
         * registered stay cached, idle, as after any drc_dereg_mr: the free
         * of the memory or drc_pd_release deregisters them.
         */
        for (i = 0; i < n; i++) {
            if (!out[i])
                continue;
            drc_dereg_mr(out[i]);
            out[i] = NULL;
        }
    }
    free(w.errs);
    return err;
}
