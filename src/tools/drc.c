/*
 * The drc program: `drc demo` runs a small workload through a cache and
 * prints what the cache did; `drc doctor` says whether this machine can
 * register GPU memory for RDMA, and how.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/doctor.h"
#include "drc.h"

/* The demo's backend registers nothing: it counts, so the demo runs without a NIC. */
struct demo_backend {
    unsigned long live, next_key;
};

static int demo_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct demo_backend *b = ctx;

    (void)a;
    b->live++;
    *handle = (void *)(uintptr_t)++b->next_key;
    *lkey = *rkey = (uint32_t)b->next_key;
    return 0;
}

static int demo_dereg(void *ctx, void *handle)
{
    struct demo_backend *b = ctx;

    (void)handle;
    b->live--;
    return 0;
}

static int check(int err, const char *what)
{
    if (err < 0) {
        fprintf(stderr, "drc demo: %s: %s\n", what, drc_strerror(err));
        exit(1);
    }
    return err;
}

static void print_stats(drc_cache_t *c, const char *when)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

    drc_cache_stats(c, &s);
    printf("%-34s hits %6llu  misses %4llu  merges %3llu  invalidated %3llu  regions %3llu  bytes %9llu\n", when,
           (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.merges,
           (unsigned long long)s.invalidated, (unsigned long long)s.regions, (unsigned long long)s.bytes);
}

static int demo(void)
{
    enum { BUFS = 8, BUF_LEN = 1 << 20, MSG = 4096 };
    struct demo_backend b = { 0, 0 };
    struct drc_backend be = { .reg = demo_reg, .dereg = demo_dereg, .ctx = &b };
    drc_cache_t *c;
    drc_region_t *r;
    char *buf[BUFS];
    int i, k;

    check(drc_cache_create(&be, NULL, &c), "create");
    for (i = 0; i < BUFS; i++)
        if (!(buf[i] = aligned_alloc(4096, BUF_LEN)))
            return 1;
    /* A transfer engine sends messages out of a few large buffers: one miss per page range, then hits. */
    for (k = 0; k < 10000; k++) {
        char *p = buf[k % BUFS] + (size_t)(k * 7919 % (BUF_LEN / MSG)) * MSG;

        check(drc_get(c, p, MSG, 0x7, &r), "get");
        check(drc_put(c, r), "put");
    }
    print_stats(c, "10000 sends of 4 KiB in 8 buffers");
    /* Whole-buffer registrations overlap the per-message regions: they coalesce into one. */
    for (i = 0; i < BUFS; i++) {
        check(drc_get(c, buf[i], BUF_LEN, 0x7, &r), "get");
        check(drc_put(c, r), "put");
    }
    print_stats(c, "8 whole-buffer registrations");
    /* Freeing a buffer invalidates its region first, so a new buffer at that address is registered anew. */
    for (i = 0; i < BUFS / 2; i++) {
        check(drc_notify_free(buf[i], BUF_LEN), "notify");
        free(buf[i]);
        buf[i] = NULL;
    }
    print_stats(c, "4 buffers freed");
    printf("backend registrations alive: %lu (one per remaining buffer)\n", b.live);
    for (i = 0; i < BUFS; i++)
        free(buf[i]);
    check(drc_cache_destroy(c), "destroy");
    printf("after destroy: %lu registrations alive\n", b.live);
    return b.live != 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "demo"))
        return demo();
    if (argc >= 2 && !strcmp(argv[1], "doctor"))
        return drc__doctor(argc - 1, argv + 1);
    fprintf(stderr, "usage: drc demo | drc doctor\n");
    return 2;
}
