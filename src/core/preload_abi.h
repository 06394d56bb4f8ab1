/*
 * The preload ABI: what a drc hands the preload library (src/preload/), two
 * objects built apart that may come from different releases.
 *
 * The preload library exports drc_hook_attach(const struct drc__preload_ops *).
 * A drc looks it up with dlsym(RTLD_DEFAULT) when its first cache subscribes
 * (notify.c) and, where it is there, hands it its ops. The preload may sit in
 * front of several copies of drc (libdrc.so and a static libdrc.a in the
 * executable): each attaches its own ops, and the preload tells each of every
 * free it sees. The ops live as long as the process.
 *
 * Version 2. Fields are only ever added at the end, and the version raised;
 * the preload ignores ops of a version older than it needs. Every function may
 * be called from any thread, from inside an allocator's or the driver's free
 * path: none allocates or takes a lock. A begin returns a ticket for end, to
 * call once the memory is really gone (-1: nothing to end).
 */
#ifndef DRC_PRELOAD_ABI_H
#define DRC_PRELOAD_ABI_H

#include <stddef.h>

struct drc__preload_ops {
    int version;                                    /* 2 */
    /* [addr, addr + len) is being freed: invalidate it in every cache, mark it until end */
    int (*begin)(const void *addr, size_t len);
    void (*end)(int ticket);
    const unsigned *caches;                         /* atomic: how many caches are subscribed now */
    /*
     * The device-memory layer's, NULL in a drc built without it. begin_free:
     * the whole device or pinned allocation containing @addr, looked up while
     * it is still valid (the first byte when its bounds cannot be found).
     * begin_teardown: every allocation of @device the drc knows (-1: of every
     * device). ctx_device: the device of the driver context @ctx (-1:
     * unknown). primary_released: called after a reference to @device's
     * primary context was dropped; if it was the last, the context was reset
     * and every allocation of the device is gone: invalidated then.
     */
    int (*begin_free)(unsigned long long addr);
    int (*begin_teardown)(int device);
    int (*ctx_device)(void *ctx);
    void (*primary_released)(int device);
};

#endif
