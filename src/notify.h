/*
 * The process-wide list of caches that drc_notify_free() invalidates
 * (implemented in notify.c). A cache subscribes in drc_cache_create and
 * unsubscribes in drc_cache_destroy; unsubscribe waits until no
 * drc_notify_free() still uses the cache.
 */
#ifndef DRC_NOTIFY_H
#define DRC_NOTIFY_H

#include "drc.h"

int  drc__notify_subscribe(drc_cache_t *c);   /* 0 or -ENOSPC */
void drc__notify_unsubscribe(drc_cache_t *c);

/* 1 while any cache is subscribed: the wrappers skip their driver lookups otherwise. Lock-free. */
int  drc__notify_active(void);

#endif
