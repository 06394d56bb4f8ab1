/*
 * What the two halves of build/libdrc_hook.so share: the interposer
 * (hook_preload.c) and the CUPTI monitor (hook_cupti.c). Hidden symbols.
 */
#ifndef DRC_HOOK_PRELOAD_H
#define DRC_HOOK_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

/*
 * Begin the free of the allocation containing @dptr (its whole bounds looked
 * up first) or of the mapping [ptr, ptr+size): drc invalidates it and marks
 * it as being freed. Returns a ticket for drc__hook_end(), to call once the
 * real free returned (-1: drc is not attached or has no cache).
 */
int drc__hook_begin_free(unsigned long long dptr);
int drc__hook_begin_unmap(unsigned long long ptr, size_t size);
void drc__hook_end(int ticket);

/* The real dlsym (libc's), for code of the hook library that must not see its own interposer. */
void *drc__hook_real_dlsym(void *handle, const char *name);

/*
 * Start the CUPTI monitor: dlopen libcupti, subscribe, enable the enter
 * callbacks of the frees. 0, or -1 after printing why to stderr.
 */
int drc__hook_cupti_start(void);

#endif
