/*
 * A program outside drc's tree, built against an installed drc (tests/pkg/test_install.sh): with
 * pkg-config (drc, drc_host) and with CMake (find_package(drc): drc::drc, drc::host, drc::static).
 * It includes every public header, checks the version, and runs one get/put through a backend of
 * its own. With -DWITH_HOST it also takes a buffer from libdrc_host's arena.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <drc.h>
#include <drc_cuda.h>
#include <drc_host.h>
#include <drc_verbs.h>

static int regs;

static int reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    (void)ctx;
    (void)a;
    *handle = (void *)(uintptr_t)++regs;
    *lkey = *rkey = (uint32_t)regs;
    return 0;
}

static int dereg(void *ctx, void *handle)
{
    (void)ctx;
    (void)handle;
    return 0;
}

int main(void)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg };
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    unsigned major, minor, patch;
    const char *v = drc_version(&major, &minor, &patch);
    drc_cache_t *c;
    drc_region_t *r;
    void *buf;
    int err;

    if (major != DRC_VERSION_MAJOR || minor < DRC_VERSION_MINOR) {
        fprintf(stderr, "consumer: header %d.%d, library %s\n", DRC_VERSION_MAJOR, DRC_VERSION_MINOR, v);
        return 1;
    }
#ifdef WITH_HOST
    buf = drc_host_alloc(1 << 16);
#else
    buf = aligned_alloc(1 << 12, 1 << 16);
#endif
    if (!buf || (err = drc_cache_create(&be, NULL, &c)) != 0 || (err = drc_get(c, buf, 100, 1, &r)) != 0) {
        fprintf(stderr, "consumer: %s\n", buf ? drc_strerror(err) : "no buffer");
        return 1;
    }
    drc_put(c, r);
    drc_cache_stats(c, &s);
    if (s.misses != 1 || s.regions != 1 || s.comp_mask != DRC_STATS_ALL)
        return 1;
    drc_invalidate(c, buf, 1 << 16);
    if (drc_cache_destroy(c) != 0)
        return 1;
#ifdef WITH_HOST
    drc_host_free(buf);
#else
    free(buf);
#endif
    printf("consumer: drc %s, one registration, ok\n", v);
    return 0;
}
