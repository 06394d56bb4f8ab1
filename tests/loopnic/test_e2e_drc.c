/* End to end: drc's verbs cache (build/libdrc.a, public API only) on the loopnic provider, linked
 * as this program's libibverbs.so.1 (rpath $ORIGIN, in build/loopnic/).
 *
 * A buffer is registered through drc, written by an RDMA WRITE, freed and mapped again at the same
 * VA (munmap + mmap MAP_FIXED), fetched through drc again and written again. With drc told of the
 * free (drc_notify_free before the munmap) the second transfer lands in the new mapping and the
 * provider counts no stale use. The control skips drc_notify_free: drc hands back the old cached
 * region, whose MR still maps the freed pages, and the provider reports the stale use (the WRITE
 * completes with IBV_WC_REM_ACCESS_ERR and the new mapping is untouched), as a real NIC would have
 * written into the freed pages.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "drc.h"
#include "drc_verbs.h"
#include "loopnic.h"
#include "rcqp.h"

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { L = 16 * 4096 };

static loopnic_get_counters_fn *p_counters;

struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
};

struct env {
    struct ibv_device **devs;
    struct side a, b;        /* a writes into b's memory */
    struct ibv_mr *src_mr;
    unsigned char *src;
    drc_cache_t *cache;      /* on b's PD */
};

static void side_open(struct side *s, struct ibv_device *dev)
{
    struct ibv_qp_init_attr ia;

    s->ctx = ibv_open_device(dev);
    assert_non_null(s->ctx);
    s->pd = ibv_alloc_pd(s->ctx);
    s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
    assert_true(s->pd && s->cq);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_send_sge = 1;
    s->qp = ibv_create_qp(s->pd, &ia);
    assert_non_null(s->qp);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    struct rcqp_peer peer = { .qpn = dest };

    assert_int_equal(rcqp_connect(qp, &peer, ALL_ACCESS, 0), 0);
}

static void reconnect(struct env *e)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RESET;
    assert_int_equal(ibv_modify_qp(e->a.qp, &a, IBV_QP_STATE), 0);
    assert_int_equal(ibv_modify_qp(e->b.qp, &a, IBV_QP_STATE), 0);
    connect_qp(e->a.qp, e->b.qp->qp_num);
    connect_qp(e->b.qp, e->a.qp->qp_num);
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof(*e));
    int n = 0;

    if (!e)
        return -1;
    e->devs = ibv_get_device_list(&n);
    if (!e->devs || n < 1)
        return -1;
    side_open(&e->a, e->devs[0]);
    side_open(&e->b, e->devs[n > 1 ? 1 : 0]);
    connect_qp(e->a.qp, e->b.qp->qp_num);
    connect_qp(e->b.qp, e->a.qp->qp_num);
    e->src = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (e->src == MAP_FAILED)
        return -1;
    e->src_mr = ibv_reg_mr(e->a.pd, e->src, L, IBV_ACCESS_LOCAL_WRITE);
    if (!e->src_mr || drc_cache_create_verbs(e->b.pd, NULL, &e->cache) != 0)
        return -1;
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;

    assert_int_equal(drc_cache_destroy(e->cache), 0);
    assert_int_equal(ibv_dereg_mr(e->src_mr), 0);
    munmap(e->src, L);
    ibv_destroy_qp(e->a.qp);
    ibv_destroy_qp(e->b.qp);
    ibv_destroy_cq(e->a.cq);
    ibv_destroy_cq(e->b.cq);
    assert_int_equal(ibv_dealloc_pd(e->a.pd), 0);
    assert_int_equal(ibv_dealloc_pd(e->b.pd), 0);  /* drc deregistered all it held */
    ibv_close_device(e->a.ctx);
    ibv_close_device(e->b.ctx);
    ibv_free_device_list(e->devs);
    free(e);
    return 0;
}

static uint64_t stale_uses(void)
{
    struct loopnic_counters c;

    assert_int_equal(p_counters(-1, &c), 0);
    return c.stale_uses;
}

/* WRITE L bytes of pattern seed from a's source into dst through region r; returns the status. */
static enum ibv_wc_status write_through(struct env *e, drc_region_t *r, void *dst, unsigned char seed)
{
    struct ibv_mr *mr = drc_region_mr(r);
    struct ibv_sge sg;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    int n = 0;

    assert_non_null(mr);
    memset(e->src, seed, L);
    sg.addr = (uintptr_t)e->src;
    sg.length = L;
    sg.lkey = e->src_mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)dst;   /* drc registers host memory with iova = address */
    wr.wr.rdma.rkey = mr->rkey;
    assert_int_equal(ibv_post_send(e->a.qp, &wr, &bad), 0);
    for (int i = 0; i < 1000 && n == 0; i++)
        n = ibv_poll_cq(e->a.cq, 1, &wc);
    assert_int_equal(n, 1);
    return wc.status;
}

static int all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* free and map again at the same VA, filled with fill */
static void remap_same_va(unsigned char *buf, unsigned char fill)
{
    assert_int_equal(munmap(buf, L), 0);
    assert_ptr_equal(mmap(buf, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), buf);
    memset(buf, fill, L);
}

static void test_invalidated_by_drc_no_stale_use(void **state)
{
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    drc_region_t *r;
    uint64_t s0 = stale_uses();
    uint32_t rkey1;

    assert_true(buf != MAP_FAILED);
    assert_int_equal(drc_get(e->cache, buf, L, ALL_ACCESS, &r), 0);
    rkey1 = drc_region_mr(r)->rkey;
    assert_int_equal(write_through(e, r, buf, 0x11), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x11));
    assert_int_equal(drc_put(e->cache, r), 0);

    assert_true(drc_notify_free(buf, L) >= 1);     /* the allocator tells drc first */
    remap_same_va(buf, 0);
    assert_int_equal(drc_get(e->cache, buf, L, ALL_ACCESS, &r), 0);
    assert_true(drc_region_mr(r)->rkey != rkey1);  /* a new registration */
    assert_int_equal(write_through(e, r, buf, 0x22), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x22));                /* landed in the new mapping */
    assert_int_equal(stale_uses() - s0, 0);
    assert_int_equal(drc_put(e->cache, r), 0);
    assert_true(drc_invalidate(e->cache, buf, L) >= 1);
    munmap(buf, L);
}

static void test_control_without_invalidation_is_stale(void **state)
{
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    drc_region_t *r, *r2;
    uint64_t s0 = stale_uses();

    assert_true(buf != MAP_FAILED);
    assert_int_equal(drc_get(e->cache, buf, L, ALL_ACCESS, &r), 0);
    assert_int_equal(write_through(e, r, buf, 0x33), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x33));
    assert_int_equal(drc_put(e->cache, r), 0);

    remap_same_va(buf, 0);                          /* nobody told drc */
    assert_int_equal(drc_get(e->cache, buf, L, ALL_ACCESS, &r2), 0);
    assert_ptr_equal(r2, r);                        /* the old cached region: a hit */
    assert_int_equal(write_through(e, r2, buf, 0x44), IBV_WC_REM_ACCESS_ERR);
    assert_true(all(buf, L, 0));                    /* the new mapping is untouched */
    assert_true(stale_uses() - s0 > 0);
    assert_int_equal(drc_put(e->cache, r2), 0);
    assert_true(drc_invalidate(e->cache, buf, L) >= 1);
    reconnect(e);                                   /* the error completion left a's QP in error */
    munmap(buf, L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalidated_by_drc_no_stale_use),
        cmocka_unit_test(test_control_without_invalidation_is_stale),
    };

    p_counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    if (!p_counters) {
        fprintf(stderr, "test_e2e_drc: the loopnic provider is not this program's libibverbs\n");
        return 1;
    }
    return cmocka_run_group_tests_name("e2e_drc", tests, setup, teardown);
}
