/*
 * An object that looks a symbol up with dlsym, for hook_child's "dlsym-race"
 * mode. Built twice: as a drc-like object (-DDRC_LIKE: it exports
 * drc_notify_free, which is how the preload tells drc's own lookups from a
 * program's) and as an ordinary one; each is copied under several names, so
 * that the program loads several distinct objects of each kind.
 */
#include <dlfcn.h>

#ifdef DRC_LIKE
/* Only its presence matters (preload.c, from_drc); it is never called. */
__attribute__((visibility("default"))) int drc_notify_free(const void *addr, unsigned long len)
{
    (void)addr;
    (void)len;
    return 0;
}
#endif

/* dlsym(@h, @name) from this object: no tail call, so that the preload sees this object as the caller. */
__attribute__((visibility("default"))) void *drc_test_caller_lookup(void *h, const char *name)
{
    void *p = dlsym(h, name);

    __asm__ volatile("" : "+r"(p) : : "memory");
    return p;
}
