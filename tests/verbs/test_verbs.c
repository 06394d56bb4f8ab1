/*
 * Tests of src/verbs/verbs.c against the ONE verbs double: the loopback
 * provider and its record (src/loopnic/), dlopen'ed by path and installed
 * as drc's verbs ops table, with PDs of its own (tests/verbs/verbs_double.h). CUDA is the fake
 * driver table of tests/fake_cuda.h; /sys/module is a temporary folder;
 * close() is counted by a definition of close here (the library objects are
 * linked into this program). There is no NIC and no GPU in CI. Each test
 * checks what a user would: the exact arguments of every registration, the
 * method chosen and why, the dmabuf fd closed exactly once, and nothing left
 * after a failure.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/config.h"
#include "drc.h"
#include "drc_verbs.h"
#include "fake_cuda.h"
#include "verbs/topo.h"
#include "verbs/verbs.h"
#include "verbs_double.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* drc's PD: one of the provider's (verbs_double.h's vd.pd[0], on device loop0) */
#define PD (vd.pd[0])

/* close() calls per fd, counted here: drc's objects are linked into this program. */
static int closes[64];

int close(int fd)
{
    static int (*real_close)(int);

    if (!real_close)
        *(void **)&real_close = dlsym(RTLD_NEXT, "close");
    if (fd >= 0 && fd < 64)
        closes[fd]++;
    return real_close(fd);
}

static int base_fds;     /* fds open at setup */

/*
 * The export of the first registration: the shared one (src/cuda/export.c)
 * is still open, one per allocation exported, and nothing else: the copy the
 * backend got was closed.
 */
/* The provider's live dmabuf MRs: each holds its dmabuf (an fd in loopnic, a file reference in the kernel). */
static int provider_dmabuf_holds(void)
{
    struct ibvd_call call;
    int n = 0;

    for (size_t i = 0; i < vd.ncalls(); i++)
        if (vd.call(i, &call))          /* 1: recorded */
            n += (call.op == IBVD_REG_DMABUF && call.mr) - (call.op == IBVD_DEREG && call.kind == IBVD_REG_DMABUF &&
                                                           !call.ret);
    return n;
}

static void only_shared_exports_open(void)
{
    assert_true(fc.nexports >= 1 && fd_is_open(fc.exports[0].fd));
    assert_int_equal(fds_open(), base_fds + drc__cuda_exports_live() + provider_dmabuf_holds());
}

/* Registrations (VA and dmabuf) recorded since the test began. */
static size_t nregs(void)
{
    return vd.count(IBVD_REG_VA) + vd.count(IBVD_REG_DMABUF);
}

/* The @n-th registration, checked to be on our PD. */
static struct ibvd_call reg_call(int n)
{
    struct ibvd_call c;

    assert_true(vd_reg(n, &c));
    assert_ptr_equal(c.pd, PD);
    return c;
}

/* ---- fixtures ---------------------------------------------------------------- */
static char sysroot[64];

static void peermem(int loaded)
{
    char path[128];

    setenv("LOOPNIC_PEERMEM", loaded ? "1" : "0", 1);   /* the NIC takes GPU VAs only with nvidia-peermem */
    snprintf(path, sizeof(path), "%s/sys/module/nvidia_peermem", sysroot);
    if (loaded)
        assert_int_equal(mkdir(path, 0700), 0);
    else
        rmdir(path);
}

static int setup(void **state)
{
    char path[128];

    (void)state;
    vd.reset();
    memset(closes, 0, sizeof(closes));
    fc_reset();
    fc_add(GPU, 64 * MiB, 0, 1);
    fc_add(GPU + 64 * MiB, 64 * MiB, 1, 2);
    vd.add_device_memory(0, 0);
    vd.add_device_memory(GPU, 128 * MiB);   /* the provider knows it is GPU memory, as libcuda would say */
    base_fds = fds_open();
    snprintf(sysroot, sizeof(sysroot), "/tmp/drc-test-verbs-XXXXXX");
    assert_non_null(mkdtemp(sysroot));
    snprintf(path, sizeof(path), "%s/sys", sysroot);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/sys/module", sysroot);
    mkdir(path, 0700);
    drc__verbs_set_sysfs_root(sysroot);
    return 0;
}

static int teardown(void **state)
{
    char path[128];

    (void)state;
    peermem(0);
    snprintf(path, sizeof(path), "%s/sys/module", sysroot);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/sys", sysroot);
    rmdir(path);
    rmdir(sysroot);
    drc__verbs_set_sysfs_root(NULL);
    assert_int_equal(vd.live(), 0);     /* every MR deregistered */
    return 0;
}

static drc_cache_t *cache(enum drc_policy policy, unsigned flags)
{
    struct drc_config cfg = { .flags = flags, .policy = policy };
    drc_cache_t *c = NULL;

    assert_int_equal(drc_cache_create_verbs(PD, &cfg, &c), 0);
    return c;
}

static void finish(drc_cache_t *c)
{
    drc_invalidate(c, (void *)0, SIZE_MAX);
    assert_int_equal(drc_cache_destroy(c), 0);
}

/* ---- tests --------------------------------------------------------------------- */
static void host_memory_via_reg_mr_iova2(void **state)
{
    static char buf[3 * 4096] __attribute__((aligned(4096)));
    drc_cache_t *c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    drc_region_t *r;
    struct ibv_mr *mr;

    (void)state;
    assert_int_equal(vd.count(IBVD_QUERY), 1);
    {
        struct ibvd_call q;

        assert_true(vd_nth(IBVD_QUERY, 0, &q));
        assert_ptr_equal(q.ctx, vd.ctx[0]);     /* the PD's own context */
    }
    assert_int_equal(drc_get(c, buf + 100, 5000, RW | IBV_ACCESS_MW_BIND, &r), 0);
    assert_int_equal(nregs(), 1);
    assert_int_equal(reg_call(0).op, IBVD_REG_VA);
    assert_true(reg_call(0).addr == (uintptr_t)buf && reg_call(0).iova == (uintptr_t)buf);
    assert_int_equal(reg_call(0).len, 8192);
    assert_int_equal(reg_call(0).access, RW | IBV_ACCESS_MW_BIND);
    mr = drc_region_mr(r);
    assert_non_null(mr);
    assert_int_equal(drc_region_lkey(r), mr->lkey);
    assert_int_equal(drc_region_rkey(r), mr->rkey);
    assert_int_equal(vd.count(IBVD_PROBE), 0);      /* host memory never needs the probe */
    assert_int_equal(drc_cache_verbs_method(c, -1), DRC_METHOD_HOST);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_invalidate(c, buf, sizeof(buf)), 1);
    assert_int_equal(vd.count(IBVD_DEREG), 1);
    finish(c);
}

static void gpu_memory_via_dmabuf(void **state)
{
    drc_cache_t *c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    drc_region_t *r;
    int fd;

    (void)state;
    assert_int_equal(drc_get(c, (void *)(GPU + 8192 + 7), 4100, RW | IBV_ACCESS_REMOTE_ATOMIC, &r), 0);
    assert_int_equal(vd.count(IBVD_PROBE), 1);
    assert_int_equal(nregs(), 1);
    assert_int_equal(reg_call(0).op, IBVD_REG_DMABUF);
    assert_int_equal(reg_call(0).offset, 8192);  /* the export is the whole allocation, shared */
    assert_int_equal(reg_call(0).len, 8192);     /* [+8192, +16384): 7 + 4100 crosses a page */
    assert_true(reg_call(0).iova == GPU + 8192);
    fd = reg_call(0).fd;                         /* the backend's copy of the shared export */
    assert_true(fc.exports[0].ptr == GPU && fc.exports[0].size == 64 * MiB);
    assert_int_equal(reg_call(0).access, RW | IBV_ACCESS_REMOTE_ATOMIC);
    assert_int_equal(drc_region_access(r), RW | IBV_ACCESS_REMOTE_ATOMIC);
    assert_true(reg_call(0).fd_link[0] != 0);
    assert_int_equal(closes[fd], 1);          /* closed once the MR holds it */
    assert_int_equal(drc_cache_verbs_method(c, 0), DRC_METHOD_DMABUF);
    assert_int_equal(drc_put(c, r), 0);
    /* a second GPU: decided anew, the NIC not probed again */
    memset(closes, 0, sizeof(closes));  /* the fd number may be reused */
    assert_int_equal(drc_get(c, (void *)(GPU + 64 * MiB), 4096, RW, &r), 0);
    assert_int_equal(vd.count(IBVD_PROBE), 1);
    assert_int_equal(reg_call(1).op, IBVD_REG_DMABUF);
    assert_int_equal(drc_cache_verbs_method(c, 1), DRC_METHOD_DMABUF);
    assert_int_equal(drc_put(c, r), 0);
    only_shared_exports_open();
    assert_int_equal(drc__cuda_exports_live(), 2);  /* one export per allocation */
    finish(c);
    assert_int_equal(vd.count(IBVD_DEREG), 2);
}

/*
 * A dmabuf MR cannot be bound to a memory window (the kernel takes no MW_BIND for it). drc used to drop
 * the bit and record it as granted: drc_region_access said MW_BIND, and a later get asking MW_BIND hit
 * that MR. Now such a get fails, nothing records MW_BIND, and the region that exists keeps serving the
 * gets it can serve. On host memory and through peermem MW_BIND is registered as asked.
 */
static void mw_bind_is_never_granted_on_dmabuf(void **state)
{
    static char buf[4096] __attribute__((aligned(4096)));
    drc_cache_t *c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    drc_region_t *r, *again;

    (void)state;
    assert_int_equal(drc_get(c, (void *)GPU, 8192, RW | IBV_ACCESS_MW_BIND, &r), -EOPNOTSUPP);
    assert_int_equal(nregs(), 0);
    only_shared_exports_open();      /* the export was closed all the same */
    assert_int_equal(drc_get(c, (void *)GPU, 8192, RW, &r), 0);
    assert_int_equal(drc_region_access(r), RW);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &again),
                     -EOPNOTSUPP);                     /* no hit on the MR that lacks it */
    assert_int_equal(nregs(), 1);
    assert_true(drc_region_valid(r));
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &again), 0);
    assert_ptr_equal(again, r);                        /* and it still serves what it has */
    assert_int_equal(drc_put(c, again), 0);
    assert_int_equal(drc_put(c, r), 0);
    /* host memory: MW_BIND is a bit ibv_reg_mr takes, and is registered */
    assert_int_equal(drc_get(c, buf, sizeof(buf), RW | IBV_ACCESS_MW_BIND, &r), 0);
    assert_int_equal(reg_call(1).access, RW | IBV_ACCESS_MW_BIND);
    assert_int_equal(drc_region_access(r), RW | IBV_ACCESS_MW_BIND);
    assert_int_equal(drc_put(c, r), 0);
    finish(c);
}

static void nic_without_dmabuf_falls_back_to_peermem(void **state)
{
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    vd.set_probe_errno(EOPNOTSUPP);
    peermem(1);
    c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), 0);
    assert_int_equal(nregs(), 1);
    assert_int_equal(reg_call(0).op, IBVD_REG_VA);
    assert_true(reg_call(0).addr == GPU && reg_call(0).iova == GPU && reg_call(0).len == 4096);
    assert_int_equal(reg_call(0).access, RW);
    only_shared_exports_open();  /* exported all the same, closed once */
    assert_int_equal(drc_cache_verbs_method(c, 0), DRC_METHOD_PEERMEM);
    assert_non_null(strstr(drc__verbs_reason(c, 0), "peermem"));
    assert_int_equal(drc_put(c, r), 0);
    finish(c);
}

static void no_dmabuf_no_peermem_is_a_clear_error(void **state)
{
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    vd.set_probe_errno(EPROTONOSUPPORT);
    c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), -EOPNOTSUPP);
    assert_int_equal(nregs(), 0);
    only_shared_exports_open();
    assert_int_equal(drc_cache_verbs_method(c, 0), -EOPNOTSUPP);
    assert_non_null(strstr(drc__verbs_reason(c, 0), "5.12"));   /* the kernel is what to upgrade */
    assert_string_equal(drc__verbs_advice(-EPROTONOSUPPORT), drc__verbs_reason(c, 0));
    finish(c);
}

static void gpu_without_dmabuf_export(void **state)
{
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    fc.dmabuf_attr[1] = 0;      /* e.g. the proprietary kernel module */
    c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_cache_verbs_method(c, 0), DRC_METHOD_DMABUF);
    assert_int_equal(drc_cache_verbs_method(c, 1), -EOPNOTSUPP);
    assert_non_null(strstr(drc__verbs_reason(c, 1), "open kernel module"));
    assert_int_equal(drc_get(c, (void *)(GPU + 64 * MiB), 4096, RW, &r), -EOPNOTSUPP);
    assert_int_equal(nregs(), 0);
    finish(c);
    /* with peermem loaded, a new cache uses it for that GPU */
    peermem(1);
    c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_get(c, (void *)(GPU + 64 * MiB), 4096, RW, &r), 0);
    assert_int_equal(reg_call(0).op, IBVD_REG_VA);
    assert_int_equal(drc_put(c, r), 0);
    finish(c);
}

/*
 * Issue 13: two GPUs and two NICs, one verbs cache per NIC (its PD). The
 * method is decided per (GPU, NIC) pair, once: NIC a does dmabuf, NIC b does
 * not (its probe fails); GPU 1 cannot export (no DMA_BUF_SUPPORTED);
 * nvidia-peermem is loaded. Each pair registers the way its decision says,
 * and each NIC is probed once whatever the number of GPUs.
 */
static void method_per_gpu_and_nic(void **state)
{
    struct ibv_pd *pd_b = vd.pd[1];     /* NIC b: the provider's second device */
    struct drc_config cfg = { .policy = DRC_DMABUF_THEN_PEERMEM };
    const uintptr_t gpu[2] = { GPU, GPU + 64 * MiB };
    drc_cache_t *c[2];
    drc_region_t *r;
    struct ibvd_call call;
    int nic, dev, round;

    (void)state;
    fc.dmabuf_attr[1] = 0;
    peermem(1);
    c[0] = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_cache_verbs_method(c[0], 0), DRC_METHOD_DMABUF);  /* NIC a probed now */
    vd.set_probe_errno(EOPNOTSUPP);     /* so that NIC b's probe fails */
    assert_int_equal(drc_cache_create_verbs(pd_b, &cfg, &c[1]), 0);
    for (round = 0; round < 2; round++) {
        for (nic = 0; nic < 2; nic++) {
            for (dev = 0; dev < 2; dev++) {
                size_t before = nregs();

                assert_int_equal(drc_get(c[nic], (void *)(gpu[dev] + (size_t)round * MiB), 4096, RW, &r), 0);
                assert_int_equal(nregs(), before + 1);
                assert_int_equal(drc_put(c[nic], r), 0);
            }
        }
    }
    /* the decisions, per pair */
    assert_int_equal(drc_cache_verbs_method(c[0], 0), DRC_METHOD_DMABUF);
    assert_int_equal(drc_cache_verbs_method(c[0], 1), DRC_METHOD_PEERMEM);    /* the GPU cannot export */
    assert_int_equal(drc_cache_verbs_method(c[1], 0), DRC_METHOD_PEERMEM);    /* the NIC cannot import */
    assert_int_equal(drc_cache_verbs_method(c[1], 1), DRC_METHOD_PEERMEM);
    /* each registration followed its pair's decision, on its NIC's PD */
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 2);     /* (GPU 0, NIC a), both rounds */
    assert_int_equal(vd.count(IBVD_REG_VA), 6);
    for (round = 0; round < (int)vd.count(IBVD_REG_DMABUF); round++) {
        assert_true(vd_nth(IBVD_REG_DMABUF, round, &call));
        assert_ptr_equal(call.pd, PD);
        assert_true(call.addr >= gpu[0] && call.addr < gpu[1]);
    }
    for (nic = round = 0; round < (int)vd.count(IBVD_REG_VA); round++) {
        assert_true(vd_nth(IBVD_REG_VA, round, &call));
        nic += call.pd == pd_b;
    }
    assert_int_equal(nic, 4);                           /* NIC b: both GPUs, both rounds */
    /* decided once: one probe per NIC, not per GPU or per registration */
    assert_int_equal(vd.count(IBVD_PROBE), 2);
    finish(c[0]);
    finish(c[1]);
}

static void policies(void **state)
{
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    /* DMABUF_ONLY never uses peermem, even where it is loaded */
    vd.set_probe_errno(EOPNOTSUPP);
    peermem(1);
    c = cache(DRC_DMABUF_ONLY, 0);
    assert_int_equal(drc_cache_verbs_method(c, 0), -EOPNOTSUPP);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), -EOPNOTSUPP);
    assert_int_equal(nregs(), 0);
    finish(c);
    /* PEERMEM_ONLY never probes nor registers a dmabuf */
    vd.reset();
    c = cache(DRC_PEERMEM_ONLY, 0);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), 0);
    assert_int_equal(vd.count(IBVD_PROBE), 0);
    assert_int_equal(reg_call(0).op, IBVD_REG_VA);
    assert_int_equal(drc_cache_verbs_method(c, 0), DRC_METHOD_PEERMEM);
    assert_int_equal(drc_put(c, r), 0);
    finish(c);
    peermem(0);
    c = cache(DRC_PEERMEM_ONLY, 0);
    assert_int_equal(drc_cache_verbs_method(c, 0), -EOPNOTSUPP);
    assert_non_null(strstr(drc__verbs_reason(c, 0), "modprobe"));
    finish(c);
    /* an unknown policy */
    {
        struct drc_config cfg = { .flags = 0, .policy = (enum drc_policy)7 };
        drc_cache_t *x = NULL;

        assert_int_equal(drc_cache_create_verbs(PD, &cfg, &x), -EINVAL);
        assert_null(x);
    }
    assert_int_equal(drc_cache_create_verbs(NULL, NULL, &c), -EINVAL);
}

static void probe_answers(void **state)
{
    (void)state;
    vd.set_probe_errno(EBADF);
    assert_int_equal(drc__verbs_probe_dmabuf(PD), 0);
    vd.set_probe_errno(EOPNOTSUPP);
    assert_int_equal(drc__verbs_probe_dmabuf(PD), -EOPNOTSUPP);
    vd.set_probe_errno(EPROTONOSUPPORT);
    assert_int_equal(drc__verbs_probe_dmabuf(PD), -EPROTONOSUPPORT);
    vd.set_probe_errno(EINVAL);     /* unexpected: reported, and dmabuf is tried */
    assert_int_equal(drc__verbs_probe_dmabuf(PD), -EINVAL);
    assert_int_equal(vd.count(IBVD_PROBE), 4);
    assert_non_null(strstr(drc__verbs_advice(-EOPNOTSUPP), "rdma-core"));
}

static void max_mr_size_is_never_exceeded(void **state)
{
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    vd.set_query(0, 64 * 1024);
    c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    assert_int_equal(drc_get(c, (void *)GPU, 64 * 1024 + 1, RW, &r), -E2BIG);
    assert_int_equal(nregs(), 0);
    assert_int_equal(drc_get(c, (void *)GPU, 32 * 1024, RW, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    /* the union (48 KiB) fits: merged */
    assert_int_equal(drc_get(c, (void *)(GPU + 16 * 1024), 32 * 1024, RW, &r), 0);
    assert_int_equal(reg_call(1).len, 48 * 1024);
    assert_true(reg_call(1).iova == GPU);
    assert_int_equal(drc_put(c, r), 0);
    /* the union (80 KiB) would not: registered alone */
    assert_int_equal(drc_get(c, (void *)(GPU + 40 * 1024), 40 * 1024, RW, &r), 0);
    assert_int_equal(reg_call(2).len, 40 * 1024);
    assert_true(reg_call(2).iova == GPU + 40 * 1024);
    assert_int_equal(drc_put(c, r), 0);
    assert_string_equal(drc_strerror(-E2BIG),
                        "the range is larger than the RDMA device's max_mr_size: register it in smaller pieces");
    finish(c);
}

static void registration_failure_leaves_nothing(void **state)
{
    drc_cache_t *c = cache(DRC_DMABUF_THEN_PEERMEM, 0);
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *r;

    (void)state;
    vd.fail_next_reg(EFAULT);
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), -EFAULT);
    only_shared_exports_open();
    drc_cache_stats(c, &s);
    assert_int_equal(s.regions, 0);
    assert_int_equal(vd.live(), 0);
    /* the next try registers */
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    /* a dereg error reaches the last put of an invalidated region */
    assert_int_equal(drc_get(c, (void *)GPU, 4096, RW, &r), 0);
    assert_int_equal(drc_invalidate(c, (void *)GPU, 4096), 1);
    vd.set_dereg_ret(EBUSY);
    assert_int_equal(drc_put(c, r), -EBUSY);
    vd.set_dereg_ret(0);
    finish(c);
}

static void create_failures(void **state)
{
    drc_cache_t *c = NULL;

    (void)state;
    vd.set_query(ENODEV, 0);
    assert_int_equal(drc_cache_create_verbs(PD, NULL, &c), -ENODEV);
    assert_null(c);
}

static void not_a_verbs_cache(void **state)
{
    struct drc_backend be;
    drc_cache_t *c;

    (void)state;
    memset(&be, 0, sizeof(be));
    be.reg = (int (*)(void *, const struct drc_reg_args *, void **, uint32_t *, uint32_t *))1;
    be.dereg = (int (*)(void *, void *))1;
    assert_int_equal(drc_cache_create(&be, NULL, &c), 0);
    assert_int_equal(drc_cache_verbs_method(c, 0), -EINVAL);
    assert_int_equal(drc_cache_verbs_method(NULL, 0), -EINVAL);
    assert_null(drc_region_mr(NULL));
    assert_int_equal(drc_cache_destroy(c), 0);
}

/* A PCI function at devices/<chain> under @top, linked from bus/pci/devices and, for a NIC, class/infiniband. */
static void lay(const char *top, const char *chain, const char *ibdev)
{
    char dir[512], link[512], cmd[1200];

    snprintf(dir, sizeof(dir), "%s/devices/%s", top, chain);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s' '%s/bus/pci/devices'", dir, top);
    assert_int_equal(system(cmd), 0);
    snprintf(link, sizeof(link), "%s/bus/pci/devices/%s", top, strrchr(chain, '/') + 1);
    assert_int_equal(symlink(dir, link), 0);
    if (ibdev) {
        snprintf(cmd, sizeof(cmd), "mkdir -p '%s/class/infiniband/%s'", top, ibdev);
        assert_int_equal(system(cmd), 0);
        snprintf(link, sizeof(link), "%s/class/infiniband/%s/device", top, ibdev);
        assert_int_equal(symlink(dir, link), 0);
    }
}

/*
 * The mapping type per (GPU, NIC) pair, over one laid-out machine (GPU 0 at
 * 1b:00.0 and GPU 1 at 9b:00.0, as the CUDA double reports them): the
 * topology decides, the configuration flags force, the environment wins,
 * and an unknown NIC or a typo gives the default type.
 */
static void mapping_per_gpu_nic_pair(void **state)
{
    static const struct {
        int gpu;
        const char *nic, *env;
        unsigned flags;
        int mapping, path;
    } t[] = {
        { 0, "mlx5_0", NULL, 0, DRC__MAPPING_PCIE, DRC__PATH_SWITCH },         /* under GPU 0's switch */
        { 0, "mlx5_1", NULL, 0, DRC__MAPPING_PCIE, DRC__PATH_SWITCH },         /* two NICs on one GPU */
        { 0, "mlx5_2", NULL, 0, DRC__MAPPING_DEFAULT, DRC__PATH_HOST },        /* through the root complex */
        { 1, "mlx5_2", NULL, 0, DRC__MAPPING_PCIE, DRC__PATH_SWITCH },         /* GPU 1's own NIC */
        { 1, "mlx5_0", NULL, 0, DRC__MAPPING_DEFAULT, DRC__PATH_HOST },        /* across sockets */
        { 0, "rxe0", NULL, 0, DRC__MAPPING_DEFAULT, -ENOENT },                 /* no PCI device */
        { 0, "mlx5_2", NULL, DRC_F_DMABUF_PCIE, DRC__MAPPING_PCIE, 0 },        /* forced by the configuration */
        { 0, "mlx5_0", NULL, DRC_F_DMABUF_DEFAULT, DRC__MAPPING_DEFAULT, 0 },
        { 0, "mlx5_0", "default", DRC_F_DMABUF_PCIE, DRC__MAPPING_DEFAULT, 0 },/* the environment wins */
        { 0, "mlx5_2", "pcie", 0, DRC__MAPPING_PCIE, 0 },
        { 0, "mlx5_2", "auto", 0, DRC__MAPPING_DEFAULT, DRC__PATH_HOST },
        { 0, "mlx5_0", "pcei", 0, DRC__MAPPING_PCIE, DRC__PATH_SWITCH },       /* a typo: reported, auto */
    };
    char top[64], cmd[128];
    const char *why;
    int path;

    (void)state;
    snprintf(top, sizeof(top), "/tmp/drc-map-XXXXXX");
    assert_non_null(mkdtemp(top));
    lay(top, "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0", NULL);
    lay(top, "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:01.0/0000:19:00.0", "mlx5_0");
    lay(top, "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:02.0/0000:1a:00.0", "mlx5_1");
    lay(top, "pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9b:00.0", NULL);
    lay(top, "pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:01.0/0000:9c:00.0", "mlx5_2");
    setenv("DRC_SYSFS_ROOT", top, 1);
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (t[i].env)
            setenv("DRC_DMABUF_MAPPING", t[i].env, 1);
        else
            unsetenv("DRC_DMABUF_MAPPING");
        drc__env_reset();   /* drc reads its environment once: read it again */
        assert_int_equal(drc__verbs_mapping(t[i].gpu, t[i].nic, t[i].flags, &path, &why), t[i].mapping);
        assert_int_equal(path, t[i].path);
        assert_non_null(why);
    }
    unsetenv("DRC_DMABUF_MAPPING");
    unsetenv("DRC_SYSFS_ROOT");
    drc__env_reset();
    {   /* both forcing flags at once: refused, not one silently chosen */
        struct drc_config cfg = { .flags = DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT };
        drc_cache_t *c = NULL;

        assert_int_equal(drc_cache_create_verbs(PD, &cfg, &c), -EINVAL);
        assert_int_equal(drc_reg_mr_configure(&cfg), -EINVAL);
        assert_null(c);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(host_memory_via_reg_mr_iova2, setup, teardown),
        cmocka_unit_test_setup_teardown(gpu_memory_via_dmabuf, setup, teardown),
        cmocka_unit_test_setup_teardown(mw_bind_is_never_granted_on_dmabuf, setup, teardown),
        cmocka_unit_test_setup_teardown(nic_without_dmabuf_falls_back_to_peermem, setup, teardown),
        cmocka_unit_test_setup_teardown(no_dmabuf_no_peermem_is_a_clear_error, setup, teardown),
        cmocka_unit_test_setup_teardown(gpu_without_dmabuf_export, setup, teardown),
        cmocka_unit_test_setup_teardown(method_per_gpu_and_nic, setup, teardown),
        cmocka_unit_test_setup_teardown(policies, setup, teardown),
        cmocka_unit_test_setup_teardown(probe_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(max_mr_size_is_never_exceeded, setup, teardown),
        cmocka_unit_test_setup_teardown(registration_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(create_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(not_a_verbs_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(mapping_per_gpu_nic_pair, setup, teardown),
    };

    return cmocka_run_group_tests(tests, vd_load, NULL);
}
