/*
 * What tests and benchmarks may ask of host_alloc.c beyond drc_host_alloc / drc_host_free.
 */
#ifndef DRC_HOST_ALLOC_H
#define DRC_HOST_ALLOC_H

/*
 * Give every unused dirty page of drc's host arena back to the OS now
 * (mallctl "arena.<i>.purge"), instead of after jemalloc's decay time; each
 * range is invalidated through drc_notify_free() first, as on any purge.
 * Returns 0, or a negative errno (-ENOMEM if the arena could not be made).
 */
int drc__host_purge(void);

#endif
