/*
 * Tests of build/libdrc_verbs.so (src/preload/preload_verbs.c, with preload_host.c and
 * the CUDA free hooks): does a transfer engine that calls ibv_reg_mr on GPU
 * and host memory work through drc with LD_PRELOAD and no code change?
 *
 * There is no NIC and no GPU in CI. The program (tests/engine/engine_child.c)
 * runs as a child process, without sanitizers (this binary may be an ASan
 * build, and ASan does not mix with preloading), against two DOUBLES found
 * through LD_LIBRARY_PATH: build/loopnic/libibverbs.so.1, the loopback
 * provider with its record (src/loopnic/loopnic_record.h), and build/engine/fakecuda/
 * libcuda.so.1, a CUDA driver whose device memory is reserved address space
 * and whose dmabufs are memfds (THE CUDA double, tests/doubles/fake_libcuda.c). The child
 * checks, from the double's record, what the engine and the NIC would see,
 * and exits 0 with "ok <scenario>" when all of it held.
 *
 * This binary also links src/preload/preload_verbs.c itself, to test the
 * seam with the preload's dlsym interposer (drc__preload_verbs_symbol).
 *
 * Controls: the same program without the preload fails the GPU and
 * host-invalidation scenarios, so the checks can fail.
 */
#include <limits.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <infiniband/verbs.h>

#include "helpers.h"
#include "preload/preload_verbs.h"
#include "verbs/ops.h"

static char build[PATH_MAX];

/* The build folder: the one above this binary that holds engine/engine_child. */
static int find_build(void **state)
{
    (void)state;
    return find_build_dir(build, sizeof(build), "engine/engine_child");
}

struct run {
    int status;             /* exit status */
    char out[4096];         /* stdout */
    char err[4096];         /* stderr */
};

/*
 * Run the child's @scenario with the doubles on LD_LIBRARY_PATH, the
 * interposer preloaded if @preload, and @extra ("NAME=value", several
 * separated by spaces, or NULL) set.
 */
static void run_child(const char *scenario, int preload, const char *extra, struct run *r)
{
    char child[PATH_MAX + 32], pre[PATH_MAX + 48], lib[2 * PATH_MAX + 64];
    char *argv[] = { child, (char *)scenario, NULL };
    char *envp[8], vars[256], *save = NULL, *v;
    int e = 0;

    /* tent_dlopen is a program of its own: it must not link libibverbs */
    snprintf(child, sizeof(child), "%s/engine/%s", build, strcmp(scenario, "tent_dlopen") ? "engine_child" : "tent_child");
    snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/libdrc_verbs.so", build);
    snprintf(lib, sizeof(lib), "LD_LIBRARY_PATH=%s/loopnic:%s/engine/fakecuda", build, build);
    envp[e++] = "PATH=/usr/bin:/bin";
    envp[e++] = lib;
    if (preload)
        envp[e++] = pre;
    snprintf(vars, sizeof(vars), "%s", extra ? extra : "");
    for (v = strtok_r(vars, " ", &save); v && e < 7; v = strtok_r(NULL, " ", &save))
        envp[e++] = v;
    envp[e] = NULL;
    r->status = spawn_capture(child, argv, envp, r->out, sizeof(r->out), r->err, sizeof(r->err));
    assert_int_not_equal(r->status, -1);
    printf("  [%s%s%s] %s%s", preload ? "preload" : "no preload", extra ? ", " : "", extra ? extra : "", r->out,
           r->err);
    assert_true(WIFEXITED(r->status));
    r->status = WEXITSTATUS(r->status);
}

/* The scenario passes under the preload, and writes nothing to stderr (DRC_LOG is unset). */
static void passes(const char *scenario, const char *extra)
{
    struct run r;
    char want[64];

    run_child(scenario, 1, extra, &r);
    assert_int_equal(r.status, 0);
    snprintf(want, sizeof(want), "ok %s", scenario);
    assert_non_null(strstr(r.out, want));
    assert_string_equal(r.err, "");
}

/* ... and fails without it: the checks catch what drc is there to do. */
static void fails_without(const char *scenario)
{
    struct run r;

    run_child(scenario, 0, NULL, &r);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.out, "FAIL"));
}

/*
 * Nested GPU registrations with the same access share one dmabuf MR; one with other access bits (a
 * LOCAL_WRITE-only one) gets its own; each caller's ibv_mr reads as it asked.
 */
static void test_gpu_registrations_are_deduplicated(void **state)
{
    (void)state;
    passes("gpu_dedup", NULL);
    fails_without("gpu_dedup");
}

/* Overlapping registrations (which Mooncake refuses) both succeed and stay valid. */
static void test_overlapping_registrations_work(void **state)
{
    (void)state;
    passes("overlap", NULL);
}

/* ibv_dereg_mr drops one reference; ibv_dealloc_pd releases what the cache kept, and says EBUSY while held. */
static void test_dereg_is_refcounted(void **state)
{
    (void)state;
    passes("refcount", NULL);
    fails_without("refcount");
}

/*
 * A second ibv_dereg_mr of a deregistered MR: EINVAL, and the provider never sees it (it would
 * deregister the cached MR it names, which another registration holds).
 */
static void test_a_stale_dereg_is_refused(void **state)
{
    (void)state;
    passes("stale_dereg", NULL);
    fails_without("stale_dereg");
}

/*
 * Threads registering and deregistering through the preload (one thread's MRs deregistered by
 * another) while PDs are allocated, registered on and deallocated beside them: every MR as asked and
 * served by the cache, every dealloc succeeds, nothing left.
 */
static void test_threads_register_while_pds_come_and_go(void **state)
{
    (void)state;
    passes("threads_pds", NULL);
    fails_without("threads_pds");
}

/* Another iova, ON_DEMAND, the engine's own dmabuf MRs: passed through, and deregistered as they are. */
static void test_what_drc_cannot_serve_passes_through(void **state)
{
    (void)state;
    passes("passthrough", NULL);
}

/* munmap of registered host memory deregisters before the memory goes; a held MR is never reused. */
static void test_munmap_invalidates_first(void **state)
{
    (void)state;
    passes("host_munmap", NULL);
    fails_without("host_munmap");
}

/* madvise(DONTNEED) likewise; WILLNEED does not. */
static void test_madvise_invalidates_first(void **state)
{
    (void)state;
    passes("host_madvise", NULL);
}

/* drc_host_alloc memory: kept across free and reuse, invalidated when jemalloc purges it. */
static void test_jemalloc_purge_invalidates_first(void **state)
{
    (void)state;
    passes("host_jemalloc", NULL);
}

/* DRC_VERBS_HOST=passthrough: host registrations untouched, GPU ones still cached. */
static void test_host_passthrough(void **state)
{
    (void)state;
    passes("host_passthrough", "DRC_VERBS_HOST=passthrough");
}

/* cuMemFree of registered GPU memory, reallocated at the same VA: never served the stale MR. */
static void test_gpu_free_invalidates(void **state)
{
    (void)state;
    passes("gpu_free", NULL);
    fails_without("gpu_free");
}

/* An engine with a private dlopen of libibverbs: ibv_reg_mr via dlsym still reaches drc. */
static void test_private_dlopen_is_served(void **state)
{
    (void)state;
    passes("private_dlopen", NULL);
}

/*
 * An engine that opens libibverbs itself (TENT, NCCL) and takes ibv_reg_mr, ibv_reg_mr_iova2,
 * ibv_dereg_mr, ibv_dealloc_pd and ibv_rereg_mr by dlsym: drc's definitions refuse rereg of an MR of
 * drc (EINVAL, never reaching the provider), keep drc's MRs from the provider's dereg, and release
 * drc's cached MRs before dealloc_pd (no EBUSY). Without the preload the provider sees the rereg.
 */
static void test_engine_with_its_own_libibverbs(void **state)
{
    (void)state;
    passes("tent", NULL);
    fails_without("tent");
}

/*
 * The same with libibverbs loaded only RTLD_LOCAL (tests/engine/tent_child.c links none): RTLD_NEXT
 * from the preload cannot see it, and drc must still forward its own registrations to it. Without the
 * preload, the provider sees ibv_rereg_mr of a shared MR.
 */
static void test_engine_with_a_private_libibverbs_only(void **state)
{
    (void)state;
    passes("tent_dlopen", NULL);
    fails_without("tent_dlopen");
}

/* DRC_VERBS_WIDEN: remote-access GPU registrations widened only when asked; local ones unless "never". */
static void test_widening_switch(void **state)
{
    (void)state;
    passes("widen", NULL);
    passes("widen", "DRC_VERBS_WIDEN=always");
    passes("widen", "DRC_VERBS_WIDEN=never");
}

/*
 * ibv_reg_mr on memory already registered (GPU, widened; host) is a cache hit that asks the CUDA
 * driver nothing: the double counts its memory queries over 300 hits (the first registrations, the
 * control, do ask it).
 */
static void test_hits_ask_the_driver_nothing(void **state)
{
    (void)state;
    passes("hit_calls", NULL);
}

/* DRC_VERBS=off: the verbs front forwards every call untouched. */
static void test_verbs_front_off(void **state)
{
    (void)state;
    /* straight to the provider, which takes GPU memory through ibv_reg_mr only with peermem */
    passes("verbs_off", "DRC_VERBS=off LOOPNIC_PEERMEM=1");
}

/*
 * The seam with the preload's dlsym interposer: drc__preload_verbs_symbol() answers the names drc
 * serves, in the version it implements, with the definitions this program links (preload_verbs.o is
 * linked into it for this test), and nothing else.
 */
static void test_symbol_seam(void **state)
{
    static const struct {
        const char *name, *version;
        void *want;
    } cases[] = {
        { "ibv_reg_mr", NULL, (void *)ibv_reg_mr },
        { "ibv_reg_mr", "IBVERBS_1.1", (void *)ibv_reg_mr },
        { "ibv_reg_mr", "IBVERBS_1.0", NULL },         /* the old ABI: not drc's to serve */
        { "ibv_reg_mr_iova", "IBVERBS_1.7", (void *)ibv_reg_mr_iova },
        { "ibv_reg_mr_iova2", NULL, (void *)ibv_reg_mr_iova2 },
        { "ibv_reg_mr_iova2", "IBVERBS_1.8", (void *)ibv_reg_mr_iova2 },
        { "ibv_dereg_mr", NULL, (void *)ibv_dereg_mr },
        { "ibv_dereg_mr", "IBVERBS_1.1", (void *)ibv_dereg_mr },
        { "ibv_dereg_mr", "IBVERBS_1.0", NULL },
        { "ibv_dealloc_pd", NULL, (void *)ibv_dealloc_pd },
        { "ibv_rereg_mr", "IBVERBS_1.1", (void *)ibv_rereg_mr },
        { "ibv_reg_dmabuf_mr", NULL, NULL },           /* not interposed: the engine's own dmabuf MRs */
        { "ibv_alloc_pd", NULL, NULL },
        { "malloc", NULL, NULL },
        { "ibv_", NULL, NULL },
        { NULL, NULL, NULL },
    };
    size_t i;

    (void)state;
    assert_int_equal(drc__preload_verbs_enabled(), 1);
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        printf("  %s@%s\n", cases[i].name ? cases[i].name : "(null)", cases[i].version ? cases[i].version : "-");
        assert_ptr_equal(drc__preload_verbs_symbol(cases[i].name, cases[i].version), cases[i].want);
    }
}

/*
 * DRC_LOG=info: one summary line at exit, on stderr, and nothing else. It counts what happened over
 * the process's life: the engine deallocated its PD before exit, which released the PD's cache, and
 * the line must still say 1 PD, 12 MRs, 1 NIC registration, 11 hits (it used to say 0 PDs and 0
 * registrations, read from the caches that were left).
 */
static void test_log_summary_only_when_asked(void **state)
{
    struct run r;
    const char *nl;

    (void)state;
    run_child("log", 1, "DRC_LOG=info", &r);
    assert_int_equal(r.status, 0);
    nl = strchr(r.err, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], 0);     /* exactly one line */
    assert_non_null(strstr(r.err, "drc: over the process: 1 PDs, 12 MRs handed out (12 GPU, 0 host, "
                                  "0 passed through), at most 12 held at once, 0 still held;"));
    assert_non_null(strstr(r.err, "1 NIC registrations and 1 deregistrations for them, 11 hits"));
    assert_non_null(strstr(r.err, "0 cached now; GPU via dmabuf"));
    passes("log", NULL);            /* and without DRC_LOG, silence */
}

/*
 * An rkey never grants more than its registration asked, through the interposer: the engine's
 * LOCAL_WRITE-only MR over memory another component registered for remote writes refuses a peer's
 * WRITE (remote access error, nothing written), host and GPU; the control WRITE with the other MR's
 * rkey lands; no MR gets RELAXED_ORDERING or any bit its request did not ask. Without the preload the
 * provider alone behaves so too (the engine's checks hold on a plain NIC, GPU memory through peermem).
 */
static void test_rkey_grants_only_what_was_asked(void **state)
{
    struct run r;

    (void)state;
    passes("rkey_scope", NULL);
    run_child("rkey_scope", 0, "LOOPNIC_PEERMEM=1", &r);     /* GPU memory straight to the provider */
    assert_int_equal(r.status, 0);
}

/* ---- a sysfs tree: GPU 0 of the CUDA double (1b:00.0) and loop0 under one PCIe switch, loop1 behind another root port */
static char sysfs[64];

static void pci(const char *chain, const char *ibdev)
{
    assert_int_equal(fake_sysfs_pci(sysfs, chain, ibdev), 0);
}

/*
 * Run the "decisions" program through the interposer (ibv_reg_mr) and through the C API (drc_reg_mr),
 * with @extra set in both: each run's line must read @want, so the two decide alike.
 */
static void decides(const char *extra, const char *want)
{
    struct run v, a;

    run_child("decisions", 1, extra, &v);
    run_child("decisions", 0, extra, &a);
    assert_int_equal(v.status, 0);
    assert_int_equal(a.status, 0);
    assert_string_equal(v.err, "");
    assert_string_equal(a.err, "");
    assert_non_null(strstr(a.out, want));       /* the C API, as the topology says */
    assert_non_null(strstr(v.out, want));       /* the interposer, the same */
}

/*
 * Every per-NIC decision is the same under the preload as through drc_reg_mr: the dmabuf mapping type
 * from the PCI topology (PCIe for loop0 under the GPU's switch, the default type for loop1; the
 * preload's ops table once lacked get_device_name and gave both the default), DRC_DMABUF_MAPPING's
 * override, and the method (dmabuf; refused where the NIC cannot do dmabuf and no peermem is loaded).
 */
static void test_nic_decisions_match_the_c_api(void **state)
{
    char root[128], env[256];

    (void)state;
    snprintf(sysfs, sizeof(sysfs), "/tmp/drc-pci-XXXXXX");
    assert_non_null(mkdtemp(sysfs));
    pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0", NULL);       /* GPU 0 */
    pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:01.0/0000:19:00.0", "loop0");
    pci("pci0000:16/0000:16:02.0/0000:30:00.0", "loop1");                               /* another root port */
    snprintf(root, sizeof(root), "DRC_SYSFS_ROOT=%s", sysfs);
    decides(root, "decisions: loop0 dmabuf pcie loop1 dmabuf default (");
    snprintf(env, sizeof(env), "%s DRC_DMABUF_MAPPING=default", root);
    decides(env, "decisions: loop0 dmabuf default loop1 dmabuf default (");
    snprintf(env, sizeof(env), "%s DRC_DMABUF_MAPPING=pcie", root);
    decides(env, "decisions: loop0 dmabuf pcie loop1 dmabuf pcie (");
    decides("DRC_SYSFS_ROOT=/nonexistent", "decisions: loop0 dmabuf default loop1 dmabuf default (");
    snprintf(env, sizeof(env), "%s ENGINE_PROBE_ERRNO=%d", root, EOPNOTSUPP);
    decides(env, "decisions: loop0 refused pcie loop1 refused default (");
    snprintf(env, sizeof(env), "rm -rf '%s'", sysfs);
    assert_int_equal(system(env), 0);
}

/*
 * The ops table the preload installs (preload_verbs.o is linked into this program: its constructor
 * ran) has every entry: drc's per-NIC decisions read it as they read libibverbs's own outside the
 * preload. Checked field by field and over the whole struct, so that an entry added later without a
 * forwarder fails here.
 */
static void test_preload_fills_every_ops_entry(void **state)
{
    typedef void (*fn)(void);
    fn f[sizeof(struct drc__verbs_ops) / sizeof(fn)];
    const struct drc__verbs_ops *ops = drc__verbs();
    size_t i;

    (void)state;
    assert_int_equal(drc__preload_verbs_enabled(), 1);
#define NONNULL(field, name, version) \
    printf("  %s\n", name);           \
    assert_non_null(ops->field);
    DRC__VERBS_OPS(NONNULL)
#undef NONNULL
    assert_int_equal(sizeof(f), sizeof(*ops));
    memcpy(f, ops, sizeof(f));
    for (i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        assert_non_null(f[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_registrations_are_deduplicated),
        cmocka_unit_test(test_overlapping_registrations_work),
        cmocka_unit_test(test_dereg_is_refcounted),
        cmocka_unit_test(test_what_drc_cannot_serve_passes_through),
        cmocka_unit_test(test_a_stale_dereg_is_refused),
        cmocka_unit_test(test_threads_register_while_pds_come_and_go),
        cmocka_unit_test(test_munmap_invalidates_first),
        cmocka_unit_test(test_madvise_invalidates_first),
        cmocka_unit_test(test_jemalloc_purge_invalidates_first),
        cmocka_unit_test(test_host_passthrough),
        cmocka_unit_test(test_gpu_free_invalidates),
        cmocka_unit_test(test_private_dlopen_is_served),
        cmocka_unit_test(test_log_summary_only_when_asked),
        cmocka_unit_test(test_engine_with_its_own_libibverbs),
        cmocka_unit_test(test_engine_with_a_private_libibverbs_only),
        cmocka_unit_test(test_widening_switch),
        cmocka_unit_test(test_hits_ask_the_driver_nothing),
        cmocka_unit_test(test_verbs_front_off),
        cmocka_unit_test(test_symbol_seam),
        cmocka_unit_test(test_rkey_grants_only_what_was_asked),
        cmocka_unit_test(test_nic_decisions_match_the_c_api),
        cmocka_unit_test(test_preload_fills_every_ops_entry),
    };

    return cmocka_run_group_tests(tests, find_build, NULL);
}
