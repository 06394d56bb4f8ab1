/*
 * What the two halves of build/libdrc_hook.so share: the interposer
 * (hook_preload.c) and the CUPTI monitor (hook_cupti.c). Hidden symbols.
 */
#ifndef DRC_HOOK_PRELOAD_H
#define DRC_HOOK_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

/* Tell drc the allocation containing @dptr is about to be freed (whole bounds looked up first). */
void drc__hook_before_free(unsigned long long dptr);

/* Tell drc [ptr, ptr+size) is about to be unmapped. */
void drc__hook_before_unmap(unsigned long long ptr, size_t size);

/* The real dlsym (libc's), for code of the hook library that must not see its own interposer. */
void *drc__hook_real_dlsym(void *handle, const char *name);

/*
 * Start the CUPTI monitor: dlopen libcupti, subscribe, enable the enter
 * callbacks of the frees. 0, or -1 after printing why to stderr.
 */
int drc__hook_cupti_start(void);

#endif
