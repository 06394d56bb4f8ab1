/*
 * The process-wide list of caches that drc_notify_free() invalidates
 * (implemented in notify.c). A cache subscribes in drc_cache_create and
 * unsubscribes in drc_cache_destroy; unsubscribe waits until no
 * drc_notify_free() still uses the cache.
 */
#ifndef DRC_NOTIFY_H
#define DRC_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

#include "drc.h"

int  drc__notify_subscribe(drc_cache_t *c);   /* 0 or -ENOSPC */
void drc__notify_unsubscribe(drc_cache_t *c);

/* 1 while any cache is subscribed: the wrappers skip their driver lookups otherwise. Lock-free. */
int  drc__notify_active(void);

/*
 * Bracket a real free (see notify.c, "Frees in flight"): begin publishes
 * [addr, addr+len) as being freed and invalidates it in every cache (as
 * drc_notify_free); end, called once the memory is really gone, withdraws
 * it. begin returns the ticket for end (-1: nothing was published, end is a
 * no-op). Neither allocates nor takes a lock.
 */
int  drc__notify_begin(const void *addr, size_t len);
void drc__notify_end(int ticket);

/*
 * cache.c, after it made a registration pending and before it exports:
 * wait while a free overlapping [s, last] is in flight. The caller makes
 * the registration known by SC operations before the call (the pending
 * count's increment, the hull's stores): the entries are read by SC loads,
 * with no fence before them.
 */
void drc__notify_wait_frees(uintptr_t s, uintptr_t last);

/*
 * 1 if a free overlapping [s, last] is in flight (published by begin, not yet
 * ended; or claimed, or one that found no entry: those overlap everything).
 * Sequentially consistent loads: the CUDA layer's export table asks it, so
 * that it never keeps an export of memory whose free has begun
 * (src/cuda/export.c). Lock-free.
 */
int  drc__notify_freeing(uintptr_t s, uintptr_t last);

/*
 * The CUDA layer fills in its part of the preload ABI (core/preload_abi.h)
 * from a constructor, before any cache exists.
 */
void drc__notify_set_cuda_hooks(int (*begin_free)(unsigned long long), int (*begin_teardown)(int),
                                int (*ctx_device)(void *), void (*primary_released)(int));

#endif
