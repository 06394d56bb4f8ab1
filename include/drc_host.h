/*
 * Host buffers meant for registration, from a jemalloc arena of drc's own
 * (libdrc_host: link with -ldrc_host -ldrc). Memory this arena gives back to
 * the OS is invalidated in every cache first.
 */
#ifndef DRC_HOST_H
#define DRC_HOST_H

#include <drc.h>

#ifdef __cplusplus
extern "C" {
#endif

DRC_API void *drc_host_alloc(size_t size);
DRC_API void  drc_host_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* DRC_HOST_H */
