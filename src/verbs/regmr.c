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
 * Two tables:
 *   pds  (pds_lock, a rwlock)  PD -> cache. Each thread keeps the last PD
 *        it found, valid while pds_gen (bumped whenever an entry leaves the
 *        table) has not moved: a registration on that PD takes no lock
 *   the slab  caller MR -> the region it holds (no lock on a registration
 *        or a deregistration; see "The slab" below)
 * The slab is how drc_dereg_mr tells its own MRs from any other: an ibv_mr
 * outside drc's reserved range is never read (a provider's MR has no room
 * for a mark in front of it). No lock is held while calling into the cache
 * or libibverbs, except pds_lock around drc_cache_destroy in
 * drc_pd_release, and no memory is freed under pds_lock but uthash's own
 * bucket arrays, so a free hook (munmap, madvise) that runs inside such a
 * call may invalidate and deregister freely. Lock order: pds_lock, then
 * slab_lock (core/fork.h has the whole order, and what a fork() child does
 * with them). (libibverbs is reached through the verbs ops table, which
 * inside the preload forwards to the next definitions: a dereg of the
 * destroy never comes back to the interposer.)
 *
 * Counters over the process's life (for the interposer's exit summary) are
 * per thread where a registration or a deregistration bumps them, atomics
 * elsewhere; a PD's cache statistics are added to `retired` when it goes.
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
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

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

/*
 * The slab. Every caller MR is a slot of one range of address space,
 * reserved (PROT_NONE) at the first registration, made writable a chunk at a
 * time as the number of MRs held at once grows, and never unmapped: a
 * pointer is drc's if it falls in the range, and a slot's `live` word says
 * whether it is handed out now. A registration takes a slot from its
 * thread's free list, a deregistration gives it back to the deregistering
 * thread's list: no lock, no allocation. A list counted longer than
 * LOCAL_MAX (every LOCAL_MAX pushes) gives half to the shared free stack (a Treiber stack whose head carries a tag
 * against ABA; a slot's memory stays mapped, so a pop that read a stale
 * `next` only fails its CAS); an empty list takes LOCAL_MAX / 2 from it, or
 * a fresh slot. A thread's list goes to the shared stack when the thread
 * exits. Should the slab be full (SLAB_SLOTS, 16M MRs held at once), a
 * registration goes to the provider as asked, as one with access bits drc
 * cannot cache. The slab's address space is the process's for its life, as
 * a static table would be; its pages are committed as MRs are held.
 *
 * A stale pointer (an MR already deregistered) is a slot: while the slot is
 * free, its dereg is refused (-EINVAL) and touches nothing, and it is never
 * handed to the provider, which would take drc's memory for one of its MRs.
 * Once a registration reuses the slot, the pointer is that registration's
 * (as a calloc'ed MR's address would be after free and calloc).
 */
struct caller_mr {
    struct ibv_mr mr;           /* first: the caller's pointer is the slot's address */
    union {
        drc_region_t *region;   /* live: the reference this MR holds (and through it, its cache) */
        struct caller_mr *local;/* on a thread's free list: the next one there */
    };
    uint32_t live;              /* atomic: 1 while handed out (two deregs of one MR at once: the caller's race) */
    uint32_t next;              /* atomic: on the shared free stack: the next slot's index + 1, or 0 */
};

enum {
    SLOT = 64,
    SLAB_SLOTS = 1 << 24,       /* 1 GiB of address space, reserved, not committed */
    CHUNK_SLOTS = 1024,         /* made writable at a time */
    LOCAL_MAX = 64,
};

_Static_assert(sizeof(struct caller_mr) == SLOT, "a slot is one cache line");

static char *slab;                      /* atomic (set once): the range, NULL before the first registration */
static uintptr_t slab_ready_bytes;      /* atomic: the slab's writable part (slab_lock to grow) */
static uint32_t slab_used;              /* slab_lock to write, atomic to read: slots handed out fresh, ever */
static uint32_t slab_cap = SLAB_SLOTS;  /* slab_lock: drc__regmr_slab_cap (tests) */
static uint64_t slab_free;              /* atomic: the shared free stack: tag << 32 | (index + 1) */
static pthread_mutex_t slab_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t slab_once = PTHREAD_ONCE_INIT;
static pthread_key_t slab_key;          /* its destructor returns an exiting thread's list */
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct regmr_tls *counted;       /* counts_lock: the threads whose counts are their own */
static int slab_key_ok;

/*
 * Per thread: its free slots (linked by `local`) and the PD it found last.
 * `e` is valid while pds_gen equals `gen`: drc_pd_release bumps pds_gen
 * before it frees an entry, so a thread never uses an entry that left the
 * table (a registration on the very PD being released is the caller's race,
 * as with ibv_dealloc_pd).
 */
struct regmr_tls {
    struct caller_mr *free;
    int room;                   /* pushes on the list before it is counted again (0 until exit_set) */
    unsigned gen;
    struct ibv_pd *pd;
    struct pd_entry *e;
    drc_cache_t *cache;         /* e->cache */
    int exit_set;               /* slab_key's value is set: the list is returned, the counts kept, at exit */
    uint64_t n_host, n_gpu;     /* atomic, written by this thread only: caller MRs it handed out (exit_set) */
    uint64_t n_back;            /* the same: caller MRs it took back (drc_dereg_mr), whichever thread
                                 * handed them out */
    struct regmr_tls *next, **pprev;    /* counts_lock: on `counted` while exit_set */
};
static __thread struct regmr_tls tls __attribute__((tls_model("initial-exec")));

static pthread_rwlock_t pds_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct pd_entry *pds;            /* pds_lock */
static unsigned pds_gen = 1;            /* atomic; bumped under pds_lock (write), or in a fork child; never 0 */

static struct drc_config config;        /* set before the first registration */
static int configured;

/*
 * Counts bumped on every registration or deregistration are kept per thread
 * (a locked add on a shared word costs a hit as much as the rest of its
 * bookkeeping, here more than drc_get's whole hit): a thread's own counts,
 * read by drc__regmr_totals through `counted`, and folded into n_host / n_gpu
 * / n_back when the thread exits (or, for a thread of the parent, in a fork
 * child). The number held now is those handed out less those taken back,
 * each summed over the fold and every thread: exact whenever no registration
 * or deregistration runs beside the sum (an MR registered on one thread and
 * deregistered on another may be seen taken back and not yet handed out).
 * The most held at once cannot be had from per-thread counts without
 * ordering every event, so it is the slab's: slab_used, the slots ever made
 * (see drc__regmr_totals for why that is the bound it is).
 */
static uint64_t n_gpu, n_host, n_direct;    /* atomic: caller MRs handed out, ever (and threads' counts) */
static uint64_t n_back;                     /* atomic: caller MRs taken back, ever (and threads' counts) */
static uint64_t n_pds;                      /* atomic: per-PD caches made, ever */
static uint64_t n_dmabuf, n_peermem;        /* atomic: per-PD caches whose GPU 0 registered that way */
static struct drc_stats retired;            /* pds_lock (write): stats of the caches released */

/* No thread's last PD is valid any more. */
static void gen_bump(void)
{
    if (!__atomic_add_fetch(&pds_gen, 1, __ATOMIC_RELEASE))
        __atomic_add_fetch(&pds_gen, 1, __ATOMIC_RELEASE);     /* 0 is a thread's "none yet" */
}

static struct caller_mr *slot_at(uint32_t idx1)
{
    return idx1 ? (struct caller_mr *)(void *)(slab + (size_t)(idx1 - 1) * SLOT) : NULL;
}

static uint32_t idx1_of(const struct caller_mr *m)
{
    return m ? (uint32_t)(((const char *)m - slab) / SLOT) + 1 : 0;
}

static void push_shared(struct caller_mr *m)
{
    uint64_t old = __atomic_load_n(&slab_free, __ATOMIC_RELAXED), new;

    do {
        __atomic_store_n(&m->next, (uint32_t)old, __ATOMIC_RELAXED);
        new = ((old >> 32) + 1) << 32 | idx1_of(m);
    } while (!__atomic_compare_exchange_n(&slab_free, &old, new, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
}

static struct caller_mr *pop_shared(void)
{
    uint64_t old = __atomic_load_n(&slab_free, __ATOMIC_ACQUIRE), new;
    struct caller_mr *m;

    do {
        m = slot_at((uint32_t)old);
        if (!m)
            return NULL;
        new = ((old >> 32) + 1) << 32 | __atomic_load_n(&m->next, __ATOMIC_RELAXED);
    } while (!__atomic_compare_exchange_n(&slab_free, &old, new, 1, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE));
    return m;
}

static struct caller_mr *pop_local(void)
{
    struct caller_mr *m = tls.free;

    if (m)
        tls.free = m->local;
    return m;
}

static void push_local(struct caller_mr *m)
{
    m->local = tls.free;
    tls.free = m;
    tls.room--;
}

/* Slots on this thread's list (at most about 2 * LOCAL_MAX: it is counted every LOCAL_MAX pushes). */
static int local_count(void)
{
    struct caller_mr *m;
    int n = 0;

    for (m = tls.free; m; m = m->local)
        n++;
    return n;
}

/* Under counts_lock: @t's counts to the process's, and @t off `counted`. */
static void fold_counts(struct regmr_tls *t)
{
    __atomic_fetch_add(&n_host, __atomic_load_n(&t->n_host, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_fetch_add(&n_gpu, __atomic_load_n(&t->n_gpu, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_fetch_add(&n_back, __atomic_load_n(&t->n_back, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    if (t->next)
        t->next->pprev = t->pprev;
    *t->pprev = t->next;
}

/* pthread key destructor: the exiting thread's free slots to the shared stack, its counts to the process's. */
static void slab_thread_exit(void *arg)
{
    struct caller_mr *m;

    (void)arg;
    while ((m = pop_local()))
        push_shared(m);
    pthread_mutex_lock(&counts_lock);
    fold_counts(&tls);
    pthread_mutex_unlock(&counts_lock);
    tls.n_host = tls.n_gpu = tls.n_back = 0;
    tls.exit_set = 0;
    tls.room = 0;
}

/* Have this thread's list returned and its counts kept at its exit; until then it keeps neither. */
static void exit_set_up(void)
{
    if (!tls.exit_set && slab_key_ok && pthread_setspecific(slab_key, &tls) == 0) {
        pthread_mutex_lock(&counts_lock);
        tls.next = counted;
        tls.pprev = &counted;
        if (counted)
            counted->pprev = &tls.next;
        counted = &tls;
        pthread_mutex_unlock(&counts_lock);
        tls.exit_set = 1;
        tls.room = LOCAL_MAX;
    }
}

/*
 * One more event for a count of this thread's: its own once exit_set (no locked instruction: only
 * this thread writes it), else the process's, since nothing would fold its own at its exit. A
 * thread with slots on its list, or room left on it, has exit_set (without it, room stays 0 and
 * slot_put keeps no slot): drc_reg_mr's hit and slot_release say @own_only.
 */
static inline void count(uint64_t *own, uint64_t *shared, int own_only)
{
    if (own_only || tls.exit_set)
        __atomic_store_n(own, __atomic_load_n(own, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(shared, 1, __ATOMIC_RELAXED);
}

static void slab_reserve(void)
{
    void *p = mmap(NULL, (size_t)SLAB_SLOTS * SLOT, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (p != MAP_FAILED)
        __atomic_store_n(&slab, (char *)p, __ATOMIC_RELEASE);
    slab_key_ok = pthread_key_create(&slab_key, slab_thread_exit) == 0;
}

/* A slot for a new caller MR: the shared stack, else a fresh one; NULL if the slab is full. */
static __attribute__((noinline)) struct caller_mr *slot_get_slow(void)
{
    struct caller_mr *m;
    uint32_t i;

    pthread_once(&slab_once, slab_reserve);
    if (!__atomic_load_n(&slab, __ATOMIC_ACQUIRE))
        return NULL;
    exit_set_up();
    if ((m = pop_shared())) {
        struct caller_mr *more;
        int n = local_count();

        while (tls.exit_set && n++ < LOCAL_MAX / 2 && (more = pop_shared()))
            push_local(more);
        tls.room = tls.exit_set ? LOCAL_MAX : 0;
        return m;
    }
    pthread_mutex_lock(&slab_lock);
    i = slab_used;
    if (i < slab_cap && (uintptr_t)i * SLOT >= __atomic_load_n(&slab_ready_bytes, __ATOMIC_RELAXED)) {
        /* the next chunk; a failure leaves the slab as it was (ENOMEM: the caller goes to the provider) */
        if (mprotect(slab + (size_t)i * SLOT, (size_t)CHUNK_SLOTS * SLOT, PROT_READ | PROT_WRITE) == 0)
            __atomic_store_n(&slab_ready_bytes, ((uintptr_t)i + CHUNK_SLOTS) * SLOT, __ATOMIC_RELEASE);
    }
    m = i < slab_cap && (uintptr_t)i * SLOT < __atomic_load_n(&slab_ready_bytes, __ATOMIC_RELAXED) ? slot_at(i + 1)
                                                                                                  : NULL;
    if (m)
        __atomic_store_n(&slab_used, i + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&slab_lock);
    return m;
}

static struct caller_mr *slot_get(void)
{
    struct caller_mr *m = pop_local();

    if (!m)
        m = slot_get_slow();
    if (m)
        UNPOISON(&m->mr, sizeof(m->mr));
    return m;
}

/*
 * LOCAL_MAX pushes since the list was counted: count it; past LOCAL_MAX, half of it to the shared
 * stack. All of it for a thread without exit handling.
 */
static __attribute__((noinline)) void slot_put_slow(void)
{
    int n;

    exit_set_up();
    if (!tls.exit_set) {
        while (tls.free)
            push_shared(pop_local());
        tls.room = 0;
        return;
    }
    n = local_count();
    if (n > LOCAL_MAX)
        for (; n > LOCAL_MAX / 2; n--)
            push_shared(pop_local());
    tls.room = LOCAL_MAX;
}

/* A slot back on this thread's list; 1 if that took the slow path (which sets exit_set if it can). */
static inline __attribute__((always_inline)) int slot_put(struct caller_mr *m)
{
    POISON(&m->mr, sizeof(m->mr));
    push_local(m);
    if (tls.room >= 0)
        return 0;
    slot_put_slow();
    return 1;
}

/* A deregistered MR's slot back on this thread's list, and one more MR taken back (this thread's count). */
static inline __attribute__((always_inline)) void slot_release(struct caller_mr *m)
{
    /* room was left on the list: exit_set (see count()); else ask after the slow path */
    count(&tls.n_back, &n_back, !slot_put(m));
}

/*
 * The slot @mr is, if it is a slot's start in the slab's writable part
 * (live or not: the caller checks); else NULL with -ENOENT outside the slab
 * (never read: another's MR) or -EINVAL inside it (drc's memory, never a
 * provider's MR).
 */
static inline __attribute__((always_inline)) struct caller_mr *slot_in(const struct ibv_mr *mr, int *err)
{
    uintptr_t ready = __atomic_load_n(&slab_ready_bytes, __ATOMIC_ACQUIRE);
    uintptr_t off = (uintptr_t)mr - (uintptr_t)__atomic_load_n(&slab, __ATOMIC_RELAXED);   /* set before ready */
    const char *base;

    if (off < ready && !(off % SLOT))
        return (struct caller_mr *)(uintptr_t)mr;
    base = __atomic_load_n(&slab, __ATOMIC_ACQUIRE);
    off = (uintptr_t)mr - (uintptr_t)base;
    *err = !mr || (base && off < (uintptr_t)SLAB_SLOTS * SLOT) ? -EINVAL : -ENOENT;
    return NULL;
}

void drc__regmr_slab_cap(uint32_t more)
{
    pthread_mutex_lock(&slab_lock);
    slab_cap = more == UINT32_MAX || more > SLAB_SLOTS - slab_used ? SLAB_SLOTS : slab_used + more;
    pthread_mutex_unlock(&slab_lock);
}

/*
 * fork() (core/fork.h). pds_lock is held across drc_cache_destroy, which
 * calls the provider: the fork cannot wait for it (a provider's own fork
 * handler, run before this one, may hold what that call needs; the loopback
 * provider does). So the PD table may be half written in the child:
 * dropped, with the statistics it guards (its entries and their inert
 * caches are left, memory only), and pds_gen bumped so that no thread's
 * last PD points into it. A child's registration on a PD then makes a cache
 * of its own, as the provider would be asked without drc. The slab is kept
 * whole: each slot's `live` word is atomic, so the child's drc_dereg_mr of a
 * parent MR knows it for drc's (released on its inert cache, never handed
 * to the provider, which would take it for one of its own). The free lists
 * of the parent's other threads are lost to the child (slab memory only);
 * slab_lock, held only across the mprotect of a chunk, is made anew: a
 * chunk being made at the fork is made again. counts_lock, held for list
 * operations only, is taken by the fork, so the list of threads' counts is
 * whole in the child: the parent's other threads' counts (their memory is
 * still mapped) are folded into the process's, and the lock made anew.
 */
static void regmr_prepare(void)
{
    pthread_mutex_lock(&counts_lock);
}

static void regmr_parent(void)
{
    pthread_mutex_unlock(&counts_lock);
}

static void regmr_child(void)
{
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;
    struct regmr_tls *t, *next;

    for (t = counted; t; t = next) {
        next = t->next;
        if (t != &tls)
            fold_counts(t);     /* the parent's other threads: their memory is still there, they are not */
    }
    pthread_mutex_init(&counts_lock, NULL);
    pds_lock = fresh;
    pds = NULL;
    gen_bump();
    memset(&retired, 0, sizeof(retired));
    pthread_mutex_init(&slab_lock, NULL);
}

__attribute__((constructor)) static void regmr_fork_init(void)
{
    drc__fork_register(DRC__FORK_REGMR, regmr_prepare, regmr_parent, regmr_child);
}

#define REMOTE_ACCESS \
    (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND)

/*
 * configure()'s answer to "may a registration asking @access be widened to
 * its allocation?" (see the opening comment), as drc__get_view takes it: the
 * access bits that forbid it (DRC__NO_WIDEN_EVER: never; 0: always).
 */
static unsigned no_widen = REMOTE_ACCESS;

static void set_widening(void)
{
    unsigned flags = configured ? config.flags : 0;

    no_widen = flags & DRC_F_NO_WIDEN ? DRC__NO_WIDEN_EVER : flags & DRC_F_WIDEN_REMOTE ? 0 : REMOTE_ACCESS;
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
    set_widening();
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

/* Under pds_lock: the entry of @pd, remembered as this thread's last PD. */
static struct pd_entry *pd_find_locked(struct ibv_pd *pd)
{
    struct pd_entry *e;

    HASH_FIND_PTR(pds, &pd, e);
    if (e) {
        tls.gen = __atomic_load_n(&pds_gen, __ATOMIC_RELAXED);
        tls.pd = pd;
        tls.e = e;
        tls.cache = e->cache;
    }
    return e;
}

static struct pd_entry *pd_find(struct ibv_pd *pd)
{
    struct pd_entry *e;

    pthread_rwlock_rdlock(&pds_lock);
    e = pd_find_locked(pd);
    pthread_rwlock_unlock(&pds_lock);
    return e;
}

/*
 * The PD's cache, made on first use. The cache is created outside the lock
 * (it queries the device); if another thread won the race, ours is dropped.
 */
static int pd_get_slow(struct ibv_pd *pd, struct pd_entry **out)
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
    other = pd_find_locked(pd);
    if (!other) {
        oom_hit = 0;
        HASH_ADD_PTR(pds, pd, e);
        if (oom_hit) {
            pthread_rwlock_unlock(&pds_lock);
            err = -ENOMEM;
            goto err_destroy;
        }
        pd_find_locked(pd);
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

/* This thread's last PD if it is @pd and no entry left the table since; else the table. */
static int pd_get(struct ibv_pd *pd, struct pd_entry **out)
{
    if (tls.pd == pd && tls.gen == __atomic_load_n(&pds_gen, __ATOMIC_ACQUIRE)) {
        *out = tls.e;
        return 0;
    }
    return pd_get_slow(pd, out);
}

/* Access bits that change what a registration means cannot share a cached MR. */
static int cacheable(int access)
{
    return access >= 0 && !((unsigned)access & ~DRC_ACCESS_MASK);
}

/*
 * drc_get on [addr, addr+len), whose miss registers the GPU allocation around it if widening is
 * allowed (core/cache.h), with what the caller's MR copies from the region. The bounds are the
 * miss's to find: a hit asks the driver nothing.
 */
static int get_view(drc_cache_t *c, const void *addr, size_t len, unsigned access, struct drc__region_view *v)
{
    return drc__get_view(c, addr, len, access, no_widen, v);
}

/* ON_DEMAND, ZERO_BASED, HUGETLB... (or a full slab): register as asked; drc_dereg_mr passes it through. */
static struct ibv_mr *reg_direct(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    const struct drc__verbs_ops *ops = drc__verbs();

    __atomic_fetch_add(&n_direct, 1, __ATOMIC_RELAXED);
    if (!ops->reg_mr_iova2) {
        errno = ENOSYS;
        return NULL;
    }
    return ops->reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
}

/*
 * A GPU registration's counts: the first on its PD (this thread's last, pd_get's answer) says how
 * the PD's cache registers GPU memory.
 */
static __attribute__((noinline)) void count_gpu(void)
{
    struct pd_entry *e = tls.e;

    count(&tls.n_gpu, &n_gpu, 0);
    /* a load first: the exchange is a locked instruction, and every GPU registration comes here */
    if (!__atomic_load_n(&e->gpu_seen, __ATOMIC_RELAXED) && !__atomic_exchange_n(&e->gpu_seen, 1, __ATOMIC_RELAXED)) {
        int method = drc_cache_verbs_method(e->cache, 0);

        if (method == DRC_METHOD_DMABUF)
            __atomic_fetch_add(&n_dmabuf, 1, __ATOMIC_RELAXED);
        else if (method == DRC_METHOD_PEERMEM)
            __atomic_fetch_add(&n_peermem, 1, __ATOMIC_RELAXED);
    }
}

/*
 * Slot @m (context, pd, addr and length set) holds region v->region of the
 * cache of this thread's last PD now: the caller's fields, as if ibv_reg_mr
 * had made it, and the counts (@hit: drc_reg_mr's, from the thread's list).
 */
static inline struct ibv_mr *publish(struct caller_mr *m, const struct drc__region_view *v, int hit)
{
    struct ibv_mr *cached = v->handle;  /* the verbs backend's handle is the cached ibv_mr (drc_region_mr) */

    m->mr.handle = cached ? cached->handle : 0;
    m->mr.lkey = v->lkey;
    m->mr.rkey = v->rkey;
    m->region = v->region;
    __atomic_store_n(&m->live, 1, __ATOMIC_RELEASE);
    if (v->type == DRC_MEM_CUDA)
        count_gpu();
    else
        count(&tls.n_host, &n_host, hit);
    return &m->mr;
}

/* drc_reg_mr, all cases: a PD not this thread's last, no slot on the thread's list, errors. */
static __attribute__((noinline)) struct ibv_mr *reg_slow(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    struct drc__region_view v;
    struct caller_mr *m;
    struct pd_entry *e;
    int err;

    if (!pd || !len) {
        errno = EINVAL;
        return NULL;
    }
    if (!cacheable(access))
        return reg_direct(pd, addr, len, access);
    err = pd_get(pd, &e);
    if (err) {
        errno = -err;
        return NULL;
    }
    m = slot_get();
    if (!m)
        return reg_direct(pd, addr, len, access);
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    err = get_view(e->cache, addr, len, (unsigned)access, &v);
    if (err) {
        slot_put(m);
        errno = -err;
        return NULL;
    }
    return publish(m, &v, 0);
}

static __attribute__((noinline)) struct ibv_mr *reg_failed(struct caller_mr *m, int err)
{
    slot_put(m);
    errno = -err;
    return NULL;
}

/*
 * The hit this file is shaped for: a registration on the PD this thread
 * used last, with a slot on its list, costs drc_get and a few stores. The
 * slot's fields are written before the drc_get, so that little but the
 * slot lives across the call.
 */
struct ibv_mr *drc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    struct caller_mr *m = tls.free;
    struct drc__region_view v;
    int err;

    /* (a NULL pd: tls.pd is NULL only while tls.gen is 0, which pds_gen never is; len 0: drc_get's EINVAL) */
    if (!m || ((unsigned)access & ~DRC_ACCESS_MASK) || tls.pd != pd ||
        tls.gen != __atomic_load_n(&pds_gen, __ATOMIC_ACQUIRE))
        return reg_slow(pd, addr, len, access);
    tls.free = m->local;
    UNPOISON(&m->mr, sizeof(m->mr));
    m->mr.context = pd->context;    /* the cached MR's: it was registered on this PD */
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    err = get_view(tls.cache, addr, len, (unsigned)access, &v);
    if (err)
        return reg_failed(m, err);
    return publish(m, &v, 1);
}

int drc__regmr_owns(const struct ibv_mr *mr)
{
    struct caller_mr *m;
    int err = 0;

    m = slot_in(mr, &err);
    return m && __atomic_load_n(&m->live, __ATOMIC_ACQUIRE);
}

/* drc__regmr_dereg's body, in each of its callers. */
static inline __attribute__((always_inline)) int dereg(struct ibv_mr *mr)
{
    struct caller_mr *m;
    drc_region_t *r;
    int err = 0;

    m = slot_in(mr, &err);
    if (!m)
        return err;
    if (!__atomic_load_n(&m->live, __ATOMIC_ACQUIRE))
        return -EINVAL;     /* a free slot: refused, and it stays free */
    __atomic_store_n(&m->live, 0, __ATOMIC_RELAXED);
    r = m->region;
    slot_release(m);
    return drc__region_put(r);
}

int drc__regmr_dereg(struct ibv_mr *mr)
{
    return dereg(mr);
}

/* drc__regmr_dereg_verbs of anything but a live slot. */
static __attribute__((noinline)) int dereg_verbs_other(struct ibv_mr *mr)
{
    int err = 0;

    if (slot_in(mr, &err))
        return EINVAL;      /* a free slot */
    if (err != -ENOENT)
        return -err;
    /* not ours: the provider's answer as it gives it */
    return drc__verbs()->dereg_mr ? drc__verbs()->dereg_mr(mr) : ENOSYS;
}

int drc__regmr_dereg_verbs(struct ibv_mr *mr)
{
    uintptr_t ready = __atomic_load_n(&slab_ready_bytes, __ATOMIC_ACQUIRE);
    uintptr_t off = (uintptr_t)mr - (uintptr_t)__atomic_load_n(&slab, __ATOMIC_RELAXED);   /* slot_in's test */
    struct caller_mr *m = (struct caller_mr *)(uintptr_t)mr;
    drc_region_t *r;

    if (off >= ready || off % SLOT || !__atomic_load_n(&m->live, __ATOMIC_ACQUIRE))
        return dereg_verbs_other(mr);
    __atomic_store_n(&m->live, 0, __ATOMIC_RELAXED);
    r = m->region;
    slot_release(m);
    return -drc__region_put(r);
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
        gen_bump();     /* before free(e): no thread's last PD is e */
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

/*
 * The peak is the slab's slots made, ever. Every caller MR held occupies a
 * slot of its own, so no more were ever held at once: an upper bound. A slot
 * is made only when the registering thread's list and the shared stack are
 * both empty, that is when every slot made before is held or on another
 * thread's list (a list holds at most 2 * LOCAL_MAX + 1 slots, being counted
 * every LOCAL_MAX pushes; an exiting thread gives its list back). So with
 * one thread registering and deregistering the bound is the most held at
 * once, and with several it is over by at most the free slots the other
 * threads' lists held when the last slot was made; also over by a slot whose
 * registration then failed, and in a fork child by the lists of the parent's
 * other threads, lost there. (A shared count of MRs held would make it
 * exact, at two locked instructions per registration and deregistration.)
 */
void drc__regmr_totals(struct drc__regmr_totals *t)
{
    struct regmr_tls *th;
    struct pd_entry *e, *tmp;
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    uint64_t live, back;

    memset(t, 0, sizeof(*t));
    t->pds = __atomic_load_n(&n_pds, __ATOMIC_RELAXED);
    pthread_mutex_lock(&counts_lock);
    t->mrs_gpu = __atomic_load_n(&n_gpu, __ATOMIC_RELAXED);
    t->mrs_host = __atomic_load_n(&n_host, __ATOMIC_RELAXED);
    back = __atomic_load_n(&n_back, __ATOMIC_RELAXED);
    for (th = counted; th; th = th->next) {
        t->mrs_gpu += __atomic_load_n(&th->n_gpu, __ATOMIC_RELAXED);
        t->mrs_host += __atomic_load_n(&th->n_host, __ATOMIC_RELAXED);
        back += __atomic_load_n(&th->n_back, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&counts_lock);
    t->mrs_direct = __atomic_load_n(&n_direct, __ATOMIC_RELAXED);
    t->peak = __atomic_load_n(&slab_used, __ATOMIC_RELAXED);
    /* a sum beside registrations may see an MR's dereg and not its reg: kept within [0, peak] */
    live = t->mrs_gpu + t->mrs_host - back;
    t->live = (int64_t)live < 0 ? 0 : live > t->peak ? t->peak : live;
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
