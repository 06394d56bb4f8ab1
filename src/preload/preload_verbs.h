/*
 * The seam between the verbs front (preload_verbs.c) and the rest of the
 * preload library: its dlsym/dlvsym interposer asks here which ibv_* names
 * drc serves. Hidden names, within the preload library only.
 */
#ifndef DRC_PRELOAD_VERBS_H
#define DRC_PRELOAD_VERBS_H

/*
 * drc's definition of @name if the verbs front serves it (ibv_reg_mr,
 * ibv_reg_mr_iova, ibv_reg_mr_iova2, ibv_dereg_mr, ibv_dealloc_pd,
 * ibv_rereg_mr), else NULL: a name drc does not serve, a @version other than
 * the one drc implements (rdma-core's default: IBVERBS_1.1, or 1.7/1.8 for the
 * iova forms; NULL @version means the default), or the front disabled.
 * A dlsym(handle, "ibv_dereg_mr") from a library that opened libibverbs
 * itself must get this answer, whatever the handle. Thread-safe, no lock,
 * no allocation. The next definitions drc forwards to are looked up with
 * dlvsym/dlsym from preload_verbs.c: a dlsym interposer must answer those
 * calls as libc would (drc ignores an answer that is its own definition).
 */
void *drc__preload_verbs_symbol(const char *name, const char *version);

/* 1 unless DRC_VERBS=off (or 0) was set when the preload loaded. Thread-safe. */
int drc__preload_verbs_enabled(void);

#endif
