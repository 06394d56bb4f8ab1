/*
 * c->lock, and the free events handed to its holder (the hand-off queue):
 * how the lock is taken (try, spin, sleep), what its holder runs before it
 * looks anything up and after it unlocks, and a free event's queued range.
 * The protocol is in cache.c's top comment; the queue's timeline is at
 * queue_invalidation.
 */
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cache_int.h"


/*
 * Is a queued invalidation over [s, last] (or one being written) not done
 * yet? With @s > @last: is any ready? Reads every entry: called only while
 * ninvq says some are queued.
 */
int queued(const drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    unsigned i, st;

    for (i = 0; i < INVQ; i++) {
        st = __atomic_load_n(&c->invq[i].state, __ATOMIC_SEQ_CST);
        if (st == Q_READY && (s > last || (LD(c->invq[i].start) <= last && s <= LD(c->invq[i].last))))
            return 1;
        if (st == Q_CLAIMED && s <= last)
            return 1;   /* its range is being written: assume the worst */
    }
    return 0;
}

/*
 * c->lock is c->lw, a word of drc's own rather than a glibc mutex, so that
 * an announced miss can be entered with no lock section at all (get_slow's
 * announce(): one CAS that finds the lock free, where a section took three
 * locked instructions: the lock, the pending count's increment, the
 * unlock). Taking it is a CAS that sets LW_LOCKED (trylock(), in
 * cache_int.h); letting it go is a CAS that clears LW_LOCKED, LW_WAITERS and
 * the caller's announced bit, if any, and advances the version (the high
 * half), then wakes one sleeper if LW_WAITERS was set. A sleeper sets
 * LW_WAITERS while the lock is taken and sleeps on the low half as it saw
 * it: the low half of a taken lock changes only when a sleeper sets
 * LW_WAITERS or the holder lets it go (no announcement is made while it is
 * taken), so a release between its look and its sleep makes the futex
 * return at once. A woken sleeper takes the lock with LW_WAITERS set, for
 * the sleepers that may remain. Every CAS on the word is SC: the unlock's
 * orders the load of the hand-off queue after it (unlock()), the
 * announcement's the frees' loads after it (notify.c).
 *
 * The version is 32 bits: a CAS that expects a word seen 2^32 unlocks
 * before would succeed (a thread stopped between an announcement's load
 * and its CAS while others took the lock four billion times: the bound a
 * 32-bit seqcount accepts too).
 */
static long futex(void *w, int op, unsigned v)
{
    return syscall(SYS_futex, w, op, v, NULL, NULL, 0);
}

/* The futex word: the low half of c->lw. */
static unsigned *lw_low(drc_cache_t *c)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (unsigned *)&c->lw;
#else
    return (unsigned *)&c->lw + 1;
#endif
}

/* Let c->lock go, and clear @clear (an announced bit) with it. */
static void release(drc_cache_t *c, uint64_t clear)
{
    uint64_t w = __atomic_load_n(&c->lw, __ATOMIC_RELAXED);

    while (!__atomic_compare_exchange_n(&c->lw, &w, (w & ~(LW_LOCKED | LW_WAITERS | clear)) + LW_VERSION, 1,
                                        __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        ;
    if (w & LW_WAITERS)
        futex(lw_low(c), FUTEX_WAKE_PRIVATE, 1);
}

/*
 * Take c->lock: try, spin, then sleep. A section under c->lock is short (no
 * call out of drc, nothing allocated), so a thread that finds it taken spins
 * with a pause instruction (lock_contended), looking at the lock word every
 * SPIN_CHECK pauses, and sleeps on it only after SPIN_MAX.
 * On the 2-vCPU development machine (a PVM guest) a system call costs 0.1 to
 * 1.2 us, depending on the host, so a contended lock that
 * sleeps, and the unlock that must then wake it, cost as much as the section
 * they wait for or more. The sparse checks matter as much as the spin
 * (tests/bench/RESULTS.md, "Two threads on two vCPUs"): a waiter that checks after every
 * pause (or every 16) takes the lock the moment it is released, so the
 * cache's lines cross between the cores on every section; one that checks
 * every 512 pauses lets the holder run several sections back to back, which
 * made two threads missing together faster than either the plain mutex or a
 * check after every pause (the figures: tests/bench/RESULTS.md). Every way in goes through lock() or a trylock; the
 * hand-offs of unlock() and queue_invalidation() do not change.
 */
__attribute__((noinline)) void lock_contended(drc_cache_t *c)
{
    unsigned spins;
    uint64_t w;

    for (spins = 1; spins < SPIN_MAX; spins++) {
        cpu_relax();
        if (spins % SPIN_CHECK)
            continue;
        if (!(__atomic_load_n(&c->lw, __ATOMIC_RELAXED) & LW_LOCKED) && trylock(c))
            return;
    }
    for (;;) {
        w = __atomic_load_n(&c->lw, __ATOMIC_RELAXED);
        if (!(w & LW_LOCKED)) {
            if (__atomic_compare_exchange_n(&c->lw, &w, w | LW_LOCKED | LW_WAITERS, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_RELAXED))
                return;
            continue;
        }
        if (!(w & LW_WAITERS) &&
            !__atomic_compare_exchange_n(&c->lw, &w, w | LW_WAITERS, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            continue;
        futex(lw_low(c), FUTEX_WAIT_PRIVATE, (unsigned)(w | LW_WAITERS));
    }
}

static void unlock_once(drc_cache_t *c, uint64_t clear)
{
    struct drc_region *dead;

    if (LD_SC(c->ninvq))
        invq_run(c);    /* what was handed to this holder */
    dead = c->qdead;
    c->qdead = NULL;
#ifdef DRC_DEBUG
    ASSERT_LOCKED(c);
    DRC_ASSERT(!(c->seq & 1));
    check_trees(c);
    ST(c->owner, (pthread_t)0);
    drc__lock_depth--;
#endif
    release(c, clear);
    release_list(c, dead);
}

/*
 * Unlock, then look at the queue again: a free event that found the lock
 * taken queued its range and then tried the lock; if that try failed, this
 * holder had not unlocked yet, so its load below (after the unlock) sees the
 * range. One of the two runs it.
 */
void unlock(drc_cache_t *c)
{
    unlock_announced(c, 0);
}

/* Unlock, and end this thread's announced miss (@bit, its LW_SLOT) with it. */
void unlock_announced(drc_cache_t *c, uint64_t bit)
{
    unlock_once(c, bit);
    while (LD_SC(c->ninvq) && queued(c, 1, 0) && trylock(c)) {
        locked(c);
        unlock_once(c, 0);
    }
}

/* A pending registration has ended (c->lock): wake the getters that wait for one. */
void pending_done(drc_cache_t *c)
{
    if (!c->pending_waiters)
        return;
    __atomic_store_n(&c->pending_gen, c->pending_gen + 1, __ATOMIC_SEQ_CST);
    futex(&c->pending_gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
}

/*
 * Sleep until a pending registration ends (c->lock held; the lock is not
 * ours while we sleep). The count is read under the lock, and bumped under
 * it (pending_done): one bumped after our unlock makes the futex return.
 */
void wait_pending(drc_cache_t *c)
{
    unsigned gen = LD(c->pending_gen);

    c->pending_waiters++;
    unlock(c);      /* runs what was handed to this holder first */
    futex(&c->pending_gen, FUTEX_WAIT_PRIVATE, gen);
    lock(c);
    c->pending_waiters--;
}

/*
 * A free event that finds c->lock taken hands its range to the holder
 * instead of sleeping on the lock (as UCX's rcache queues unmap events),
 * and drc_invalidate's guarantee still holds when it returns:
 *   free event (lock taken)            holder                 later drc_get
 *   claim an entry, write the range    ...                    takes r (hint or walk)
 *   ninvq++ (SC); entry READY (SC)     (lock(): run queue)    ninvq != 0 and an entry
 *   trylock: taken? return             unlock(): run queue,     over r READY or CLAIMED?
 *                                        unlock, one READY ?    drop r, take the lock,
 *                                        trylock and run it     whose lock() runs the
 *                                                               queue; else r detached?
 * A get that begins after the event returned reads ninvq after the
 * increment and the entry after READY, so until the range is done it drops
 * every region over it (the region, not the request: a region is
 * invalidated whole) and goes to the lock, and every lock() runs the queue
 * before looking anything up.
 * The queue is run (regions retired inside the writer's window, pending
 * registrations made stale) before the entry is emptied and ninvq
 * decremented, so a get that reads either sees them
 * retired. The holder's unlock and the event's trylock are ordered: if the
 * try fails, the holder's load after its unlock sees the READY entry (or
 * the event's own retry runs it). Idle regions are deregistered by the
 * thread that ran the queue, after its unlock. Returns 0 if the queue was
 * full (the caller takes the lock).
 */
int queue_invalidation(drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    unsigned i, st;

    for (i = 0; i < INVQ; i++) {
        st = Q_EMPTY;
        if (__atomic_load_n(&c->invq[i].state, __ATOMIC_RELAXED) != Q_EMPTY ||
            !__atomic_compare_exchange_n(&c->invq[i].state, &st, Q_CLAIMED, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        ST(c->invq[i].start, s);
        ST(c->invq[i].last, last);
        __atomic_fetch_add(&c->ninvq, 1, __ATOMIC_SEQ_CST);   /* before we return: gets go to the lock */
        __atomic_store_n(&c->invq[i].state, Q_READY, __ATOMIC_SEQ_CST);
        if (trylock(c)) {
            locked(c);      /* runs it */
            unlock(c);
        }
        return 1;
    }
    return 0;
}

/* Run every READY queued invalidation (c->lock held); their idle regions go to c->qdead. */
void invq_run(drc_cache_t *c)
{
    unsigned i;

    ASSERT_LOCKED(c);
    for (i = 0; i < INVQ; i++) {
        if (__atomic_load_n(&c->invq[i].state, __ATOMIC_ACQUIRE) != Q_READY)
            continue;
        invalidate_locked(c, LD(c->invq[i].start), LD(c->invq[i].last), &c->qdead, NULL, NULL, NULL);
        __atomic_store_n(&c->invq[i].state, Q_EMPTY, __ATOMIC_RELEASE);
        __atomic_fetch_sub(&c->ninvq, 1, __ATOMIC_SEQ_CST);   /* after the regions left: see above */
    }
}
