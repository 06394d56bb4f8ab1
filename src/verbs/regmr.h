/*
 * What the ibv_reg_mr interposer (preload_verbs.c) asks of regmr.c beyond the
 * public drc_reg_mr / drc_dereg_mr / drc_pd_release.
 */
#ifndef DRC_REGMR_H
#define DRC_REGMR_H

#include <stdint.h>

#include "drc_verbs.h"

/*
 * The configuration of every per-PD cache created after this call (the
 * interposer sets it from the environment before any registration). NULL
 * restores the defaults. Not thread-safe against drc_reg_mr: call it first.
 */
DRC_API void drc__regmr_configure(const struct drc_config *cfg);   /* DRC_API: libdrc_preload.so uses it (drc.map, DRC_PRIVATE_0) */

/*
 * drc_dereg_mr without the fallback: -ENOENT, touching nothing, when @mr
 * did not come from drc_reg_mr (the interposer then hands it to the next
 * ibv_dereg_mr); otherwise what drc_dereg_mr returns.
 */
DRC_API int drc__regmr_dereg(struct ibv_mr *mr);

/*
 * The interposer's ibv_dereg_mr: drc__regmr_dereg, whose error comes back
 * as a positive errno (verbs' rule), and for an MR not drc's (-ENOENT
 * there) what the verbs ops table's dereg_mr returns, untouched.
 */
DRC_API int drc__regmr_dereg_verbs(struct ibv_mr *mr);

/* 1 if @mr is a caller MR handed out by drc_reg_mr and not yet deregistered. */
DRC_API int drc__regmr_owns(const struct ibv_mr *mr);

/*
 * Tests (linked with the objects, not exported): make at most @more slots of
 * caller MRs beyond those made so far (UINT32_MAX: as many as the slab
 * holds), so that a full slab can be reached; once the free slots are taken
 * too, registrations go to the provider as asked.
 */
void drc__regmr_slab_cap(uint32_t more);

/*
 * What drc_reg_mr did over the process's life, for the interposer's exit
 * summary: counts of events never go down, whether or not the PDs and their
 * caches still exist (ibv_dealloc_pd releases a PD's cache; its statistics
 * are kept).
 */
struct drc__regmr_totals {
    uint64_t pds;            /* per-PD caches made, ever */
    uint64_t pds_now;        /* per-PD caches that exist now */
    uint64_t mrs_gpu, mrs_host;   /* caller MRs handed out through a cache, ever */
    uint64_t mrs_direct;     /* drc_reg_mr calls passed straight to ibv_reg_mr (access bits drc cannot cache) */
    uint64_t live;           /* caller MRs not yet deregistered: exact when no drc_reg_mr or drc_dereg_mr
                              * runs beside the call (a sum of per-thread counts), within [0, peak] */
    uint64_t peak;           /* the most held at once, bounded from above: the slots drc made for caller
                              * MRs; exact while one thread registers and deregisters (regmr.c says by
                              * how much it may be over with several) */
    struct drc_stats cache;  /* event counts summed over every per-PD cache, released ones included;
                              * regions/bytes/in_use: the caches that exist now */
    uint64_t dmabuf, peermem;/* per-PD caches, ever, whose GPU 0 registered through dmabuf / peermem */
};
DRC_API void drc__regmr_totals(struct drc__regmr_totals *t);

#endif
