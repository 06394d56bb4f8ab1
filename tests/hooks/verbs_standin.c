/*
 * A stand-in for the verbs front's seam (src/preload/preload_verbs.c), linked
 * into a test copy of the preload library in place of the real front: it
 * serves ibv_dereg_mr only, with a function that says it is drc's. The
 * preload test checks that dlsym and dlvsym on any handle, libibverbs's own
 * included, answer with it (issue 9 item 4: engines that dlopen libibverbs).
 */
#include <stddef.h>
#include <string.h>

enum { STANDIN = 4242 };

static int standin_dereg_mr(void *mr)
{
    (void)mr;
    return STANDIN;
}

void *drc__preload_verbs_symbol(const char *name, const char *version);
int drc__preload_verbs_enabled(void);

void *drc__preload_verbs_symbol(const char *name, const char *version)
{
    (void)version;
    return !strcmp(name, "ibv_dereg_mr") ? (void *)standin_dereg_mr : NULL;
}

int drc__preload_verbs_enabled(void)
{
    return 1;
}
