/*
 * fork(): every lock of libdrc is safe in the child.
 *
 * The child of fork() has one thread, the one that forked, and a copy of
 * every lock as it was: a lock another parent thread held at the fork stays
 * held for ever in the child, and the child's first call that takes it hangs
 * (a child's drc_reg_mr hung in a third of the forks made while parent
 * threads registered). Each layer hands this registry its handlers, one set
 * per layer; the registry's one pthread_atfork handler runs them in the lock
 * order below, whatever order the layers registered in (pthread_atfork alone
 * runs prepare handlers in the reverse order of registration, which here
 * would depend on which layer a program used first):
 *
 *   prepare (parent, before the fork), outermost rank first: take the locks
 *     that guard state the child keeps, in the order every other path takes
 *     them, so that the fork falls between two critical sections and that
 *     state is whole in the child. Only locks whose holders wait for nothing
 *     taken earlier here and call no other library are taken: the prepare
 *     handlers of a library loaded after drc's registration (a verbs
 *     provider, the CUDA driver at cuInit) run before drc's and may hold
 *     the locks such a call needs;
 *   parent (after the fork), innermost first: release them;
 *   child, innermost first: make every lock of the layer anew, and make the
 *     state it guards whole or drop it. Inherited caches become inert.
 *
 * The lock order of libdrc (outermost first); a thread holding one may take
 * only those below it. "prepare" says whether the fork waits for the lock,
 * "child" what the child does with the lock and its state.
 *
 *  rank      lock (file)                      held across             prepare  child
 *  REGMR     pds_lock, rw (verbs/regmr.c)     drc_cache_destroy in    no       anew; the PD table dropped: a
 *                                             drc_pd_release (the              registration makes a cache of
 *                                             provider's dereg)                the child's own
 *            slab_lock (verbs/regmr.c)        the mprotect of a chunk no       anew; the slab of caller MRs
 *                                             of caller MRs                    kept (atomic words): the child's
 *                                                                              drc_dereg_mr of a parent MR
 *                                                                              frees it, calls no provider
 *            counts_lock (verbs/regmr.c)      the list of threads'    taken    anew; the counts of the parent's
 *                                             counts                           other threads folded into the
 *                                                                              process's
 *  (VERBS)   a verbs cache's lock             the NIC's dmabuf probe   no       anew, through the cache's forked
 *            (verbs/verbs.c)                  (the provider)                   callback (drc__cache_opts)
 *  (preload) resolve_lock                     dlopen, dlsym           no       anew (its own pthread_atfork:
 *            (preload/preload_verbs.c)                                         another library); entries atomic
 *  CACHES    a cache's lock, its arena's      nothing outside drc     no       anew; the cache inert
 *            (core/cache.c, core/arena.c)                                      (notify.c, cache.c)
 *  EXPORTS   export_lock (cuda/export.c)      the driver's export     no       anew; no export in flight
 *            lock (cuda/export.c)             close, dup              taken    anew; every export closed (an
 *                                                                              open dmabuf keeps the parent's
 *                                                                              freed GPU memory taken)
 *  DRIVER    primary_lock (cuda/driver.c)     cuDevicePrimaryCtxRetain no      anew; the contexts (atomic) kept
 *  TRACK     track_lock (cuda/memory.c)       nothing                 no       anew; the record dropped
 *
 * A program that forks from inside a drc callback (a backend's reg or
 * dereg, a free hook) while drc holds one of the "taken" locks deadlocks in
 * prepare, as it would with any library that protects its state this way.
 */
#ifndef DRC_FORK_H
#define DRC_FORK_H

enum drc__fork_rank {
    DRC__FORK_REGMR,
    DRC__FORK_CACHES,
    DRC__FORK_EXPORTS,
    DRC__FORK_DRIVER,
    DRC__FORK_TRACK,
    DRC__FORK_RANKS
};

/*
 * The handlers of the layer at @rank (any may be NULL), once per rank: a
 * second call for the same rank replaces nothing. Safe from any thread and
 * from a constructor; the layers register from their constructors, before
 * any of their locks can be taken.
 */
void drc__fork_register(enum drc__fork_rank rank, void (*prepare)(void), void (*parent)(void),
                        void (*child)(void));

#endif
