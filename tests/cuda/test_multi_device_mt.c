/*
 * The stress test of issue 13 on THE CUDA DOUBLE laid out as two devices
 * (tests/fake_cuda.h, contexts checked: fc.strict_ctx); also run under TSan.
 * tests/gpu/test_multi_gpu.c runs the same on two real GPUs.
 *
 * Getter threads (each with device 0's, device 1's or no context current)
 * get and put regions of SLOTS allocations, slot i on device i % 2, while a
 * freer (the main thread) frees each slot from either device's context and
 * allocates it again at the same address (the double's first fit: a new
 * buffer id there). A
 * getter checks every region it got against the buffer id of the memory at
 * that address now (a region's memory is that of its dmabuf, as a NIC maps
 * it, when it has one: what the VA held at reg() may differ, see rec_reg),
 * but only for gets no free overlapped: gen[i] is odd while
 * slot i is being freed and reallocated, and a get is checked only if it saw
 * the same even generation before and after. What a user checks: no stale
 * region, regs == deregs once the cache is gone, the fds back to what they
 * were. The control (the same run freeing with the plain cuMemFree, drc not
 * told) must show stale regions, or the check proves nothing.
 *
 * The run ends on events, never on how fast the machine is: the freer goes on
 * until it has made MIN_ROUNDS rounds and the getters have made MIN_EXPOSED
 * checked gets of a slot freed at least once (a get that could be stale);
 * the control goes on until it has seen a stale region, or until EXPOSED_CAP
 * such gets, which only a cache that is never stale gets through. A
 * wall-clock limit is only a hang guard: reaching it fails, with the counts.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "drc.h"
#include "drc_cuda.h"
#include "fake_cuda.h"

#define MiB (1ul << 20)
enum { SLOTS = 4, GETTERS = 4, MIN_ROUNDS = 2000, MIN_EXPOSED = 50000, EXPOSED_CAP = 1000000, HANG_S = 300 };

struct mr {
    unsigned long long buffer_id;   /* of the memory registered: the dmabuf's, else the region's start's at reg() */
};

static int regs, deregs;            /* atomic */

/* What ibv_reg_mr does with host memory it cannot read: pinning it fails. */
static int readable(uintptr_t p)
{
    char b;
    struct iovec local = { &b, 1 }, remote = { (void *)p, 1 };

    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1;
}

/*
 * A get that classifies a slot between its free and its reallocation sees
 * no CUDA memory there and asks for a host registration of the freed VA: a
 * NIC refuses it (the double's freed memory is PROT_NONE), and so does this.
 */
static int rec_reg(void *ctx, const struct drc_reg_args *a, void **h, uint32_t *lkey, uint32_t *rkey)
{
    struct mr *m;

    (void)ctx;
    if (a->type == DRC_MEM_HOST && !readable(a->start))
        return -EFAULT;
    if (!(m = calloc(1, sizeof(*m))))
        return -ENOMEM;
    /*
     * A NIC maps the dmabuf it is handed, not the VA: a dmabuf of a freed
     * allocation (a stale shared export, src/cuda/export.c) registered while
     * a new buffer sits at the same VA is stale although the VA's buffer id
     * is right. So the dmabuf's buffer id (the double remembers it) when
     * there is one; the VA's only without (peermem, host).
     */
    if (a->dmabuf_fd < 0 || fakecu_dmabuf_id(a->dmabuf_fd, &m->buffer_id) != 0)
        cuPointerGetAttribute(&m->buffer_id, DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID, a->start);
    __atomic_fetch_add(&regs, 1, __ATOMIC_RELAXED);
    *h = m;
    *lkey = *rkey = 1;
    return 0;
}

static int rec_dereg(void *ctx, void *h)
{
    (void)ctx;
    free(h);
    __atomic_fetch_add(&deregs, 1, __ATOMIC_RELAXED);
    return 0;
}

static unsigned long long slot[SLOTS];  /* atomic */
static unsigned gen[SLOTS];             /* atomic: odd while slot i is freed and reallocated */
static int stop;                        /* atomic: the freer is done, getters return */
static long stale, checked, exposed;    /* atomic: gets checked, of them after a free of their slot, stale */
static drc_cache_t *cache;

static void *getter(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    long n;

    fc_current = seed % 3 == 2 ? NULL : FC_PRIMARY(seed % 3);  /* device 0's, device 1's, or none */
    for (n = 0; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); n++) {
        int i = (int)(rand_r(&seed) % SLOTS);
        unsigned g1 = __atomic_load_n(&gen[i], __ATOMIC_ACQUIRE), g2;
        unsigned long long p = __atomic_load_n(&slot[i], __ATOMIC_ACQUIRE), now = 0;
        drc_region_t *r;

        if (g1 & 1)
            continue;
        if (drc_get(cache, (void *)(uintptr_t)(p + MiB), MiB, 1, &r))
            continue;
        cuPointerGetAttribute(&now, DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID, p + MiB);
        g2 = __atomic_load_n(&gen[i], __ATOMIC_ACQUIRE);
        if (g1 == g2) {     /* no free overlapped this get: the region must be on the memory there now */
            __atomic_fetch_add(&checked, 1, __ATOMIC_RELAXED);
            if (g1 >= 2)    /* the slot was freed and reallocated before: a stale region could be here */
                __atomic_fetch_add(&exposed, 1, __ATOMIC_RELAXED);
            if (((struct mr *)drc_region_handle(r))->buffer_id != now)
                __atomic_fetch_add(&stale, 1, __ATOMIC_RELAXED);
        }
        drc_put(cache, r);
        if (n % 16 == 0)
            sched_yield();  /* let the freer in: two cores are shared by five threads */
    }
    return NULL;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void run(int with_drc)
{
    struct drc_backend be = { .reg = rec_reg, .dereg = rec_dereg };
    struct drc_config cfg = { .policy = DRC_DMABUF_THEN_PEERMEM };
    pthread_t t[GETTERS];
    int i, k, fds, rounds, hung = 0;
    struct timespec t0, now;

    fc_reset();
    fc.strict_ctx = 1;
    fds = open_fds();
    regs = deregs = 0;
    stale = checked = exposed = 0;
    stop = 0;
    memset(gen, 0, sizeof(gen));
    assert_int_equal(drc_cache_create(&be, &cfg, &cache), 0);
    for (i = 0; i < SLOTS; i++) {
        fc_current = FC_PRIMARY(i & 1);
        assert_int_equal(cuMemAlloc_v2(&slot[i], 16 * MiB), 0);
    }
    for (k = 0; k < GETTERS; k++)
        assert_int_equal(pthread_create(&t[k], NULL, getter, (void *)(uintptr_t)(k + 1)), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (k = 0;; k++) {
        unsigned long long p;
        long ex = __atomic_load_n(&exposed, __ATOMIC_RELAXED);

        if (with_drc ? k >= MIN_ROUNDS && ex >= MIN_EXPOSED
                     : (k >= MIN_ROUNDS && ex >= MIN_EXPOSED && __atomic_load_n(&stale, __ATOMIC_RELAXED) > 0) ||
                           ex >= EXPOSED_CAP)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > HANG_S) {
            hung = 1;
            break;
        }

        i = k % SLOTS;
        fc_current = FC_PRIMARY((k / SLOTS) & 1);      /* free from either device's context */
        __atomic_fetch_add(&gen[i], 1, __ATOMIC_ACQ_REL);
        assert_int_equal(with_drc ? drc_cuMemFree(slot[i]) : cuMemFree_v2(slot[i]), 0);
        fc_current = FC_PRIMARY(i & 1);
        assert_int_equal(cuMemAlloc_v2(&p, 16 * MiB), 0);
        assert_true(p == slot[i]);                      /* the same VA, a new buffer id */
        __atomic_store_n(&slot[i], p, __ATOMIC_RELEASE);
        __atomic_fetch_add(&gen[i], 1, __ATOMIC_ACQ_REL);
        sched_yield();
    }
    rounds = k;
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    for (k = 0; k < GETTERS; k++)
        pthread_join(t[k], NULL);
    for (i = 0; i < SLOTS; i++)
        assert_int_equal(drc_cuMemFree(slot[i]), 0);
    assert_int_equal(drc_cache_destroy(cache), 0);
    print_message("  %s: %d free+realloc rounds, %ld checked gets (%ld after a free), %ld stale, %d registrations, "
                  "%d deregistrations\n", with_drc ? "drc_cuMemFree" : "control, plain cuMemFree", rounds, checked,
                  exposed, stale, regs, deregs);
    if (hung)
        fail_msg("hang guard: not done after %d s (%d rounds, %ld gets after a free)", HANG_S, rounds, exposed);
    assert_int_equal(regs, deregs);
    assert_int_equal(open_fds(), fds);
    fc_current = NULL;
    drc__cuda_set_driver(NULL);
    if (with_drc) {
        assert_true(rounds >= MIN_ROUNDS && exposed >= MIN_EXPOSED);   /* what the loop waited for */
        assert_int_equal(stale, 0);
    } else {
        assert_true(stale > 0);     /* else the check above could not fail */
    }
}

static void no_stale_region_over_two_devices(void **state)
{
    (void)state;
    run(1);
}

static void control_without_the_hook_is_stale(void **state)
{
    (void)state;
    run(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_stale_region_over_two_devices),
        cmocka_unit_test(control_without_the_hook_is_stale),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
