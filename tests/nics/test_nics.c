/*
 * Many NICs per GPU (issue 11), end to end on the loopback provider
 * (src/loopnic, in place of libibverbs, 4 devices) with the CUDA double
 * (tests/doubles: its "device memory" here is host memory, which loopnic
 * moves with process_vm_writev).
 *
 * What a user would check:
 *  - one allocation registered on 4 NICs is exported once per mapping type
 *    (loopnic counts distinct dmabuf inodes), whatever the number of caches;
 *  - every byte written through each NIC's MR lands in the interior
 *    sub-range asked, neighbours unchanged (the dmabuf offset is right);
 *  - NICs under the GPU's switch get the PCIe type, the others the default;
 *  - a free with exports in the table leaves no fd open;
 *  - drc_reg_mr_multi registers on all 4 or on none: a failure of the 3rd
 *    hands out no MR and leaves no fd open, and never takes another
 *    caller's MR or the shared export with it.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "cuda/cuda.h"
#include "core/config.h"
#include "core/notify.h"
#include "drc.h"
#include "drc_verbs.h"
#include "rcqp.h"
#include "fake_cuda.h"
#include "helpers.h"
#include "loopnic.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { NICS = 4, SIZE = 8 << 20, XFER = 4096 };

static struct nic {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qa, *qb;     /* qa writes to qb, both on pd (loopback) */
    unsigned char *src;
    struct ibv_mr *src_mr;
} nic[NICS];
static struct ibv_device **devs;
static unsigned char *gpu;      /* the double's device memory: 8 MiB of host memory */
static char root[64];           /* a sysfs tree */
static int base_fds;

static struct loopnic_counters counters(void)
{
    struct loopnic_counters c;

    assert_int_equal(loopnic_get_counters(-1, &c), 0);
    return c;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    struct rcqp_peer peer = { .qpn = dest };

    assert_int_equal(rcqp_connect(qp, &peer, ACCESS, 0), 0);
}

static struct ibv_qp *qp_new(struct nic *n)
{
    struct ibv_qp_init_attr ia;
    struct ibv_qp *qp;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = n->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(n->pd, &ia);
    assert_non_null(qp);
    return qp;
}

/* RDMA WRITE of XFER bytes of nic->src to @remote through @rkey; the completion status. */
static int write_to(struct nic *n, uintptr_t remote, uint32_t rkey)
{
    struct ibv_sge sge = { (uintptr_t)n->src, XFER, n->src_mr->lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    int got = 0;

    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    assert_int_equal(ibv_post_send(n->qa, &wr, &bad), 0);
    for (int i = 0; i < 1000 && !got; i++)
        got = ibv_poll_cq(n->cq, 1, &wc);
    assert_int_equal(got, 1);
    return wc.status;
}

static int all(const unsigned char *p, size_t len, unsigned char v)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* ---- a sysfs tree: GPU 0 (1b:00.0) and loop0, loop1 under one switch; loop2, loop3 behind other root ports */
static void pci(const char *chain, const char *ibdev)
{
    assert_int_equal(fake_sysfs_pci(root, chain, ibdev), 0);
}

static void lay_out_machine(void)
{
    snprintf(root, sizeof(root), "/tmp/drc-nics-XXXXXX");
    assert_non_null(mkdtemp(root));
    pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0", NULL);       /* GPU 0 */
    pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:01.0/0000:19:00.0", "loop0");
    pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:02.0/0000:1a:00.0", "loop1");
    pci("pci0000:16/0000:16:02.0/0000:30:00.0", "loop2");                               /* another root port */
    pci("pci0000:80/0000:80:01.0/0000:81:00.0", "loop3");                               /* another socket */
}

static int group_setup(void **state)
{
    int n = 0;

    (void)state;
    if (loopnic_num_devices() < NICS)
        return -1;
    devs = ibv_get_device_list(&n);
    assert_true(devs && n >= NICS);
    for (int i = 0; i < NICS; i++) {
        struct nic *x = &nic[i];

        x->ctx = ibv_open_device(devs[i]);
        assert_non_null(x->ctx);
        x->pd = ibv_alloc_pd(x->ctx);
        x->cq = ibv_create_cq(x->ctx, 64, NULL, NULL, 0);
        assert_true(x->pd && x->cq);
        x->qa = qp_new(x);
        x->qb = qp_new(x);
        connect_qp(x->qa, x->qb->qp_num);
        connect_qp(x->qb, x->qa->qp_num);
        x->src = aligned_alloc(4096, XFER);
        memset(x->src, 0xa0 + i, XFER);
        x->src_mr = ibv_reg_mr(x->pd, x->src, XFER, IBV_ACCESS_LOCAL_WRITE);
        assert_non_null(x->src_mr);
    }
    lay_out_machine();
    return 0;
}

static int group_teardown(void **state)
{
    char cmd[PATH_MAX + 16];

    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) ? -1 : 0;
}

static int setup(void **state)
{
    (void)state;
    fc_reset();
    fc.pcie_unsupported = 0;    /* a driver with the PCIe mapping type */
    gpu = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(gpu != MAP_FAILED);
    memset(gpu, 0x11, SIZE);
    fc_add((uintptr_t)gpu, SIZE, 0, 77);
    loopnic_reset_counters();
    base_fds = fds_open();
    setenv("DRC_SYSFS_ROOT", root, 1);
    unsetenv("DRC_DMABUF_MAPPING");
    drc__env_reset();   /* drc reads its environment once: read it again */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fc.n = 0;
    munmap(gpu, SIZE);
    return 0;
}

/* The free as drc sees it: the begin-free routine, before the real free. */
static void free_gpu(void)
{
    drc__notify_end(drc__cuda_begin_free((uintptr_t)gpu));
}

/*
 * 4 NICs, 4 verbs caches, one allocation: one export per mapping type
 * (loop0/loop1 sit under the GPU's switch: PCIe; loop2/loop3 do not:
 * default), and a WRITE through each NIC's MR lands exactly in its
 * interior sub-range.
 */
static void four_nics_one_export_per_mapping(void **state)
{
    const uintptr_t at = (uintptr_t)gpu + (1 << 20) + 100;     /* interior, not page-aligned */
    drc_cache_t *c[NICS];
    drc_region_t *r[NICS];
    struct loopnic_counters k;
    unsigned exports = fakecu_exports();

    (void)state;
    for (int i = 0; i < NICS; i++) {
        assert_int_equal(drc_cache_create_verbs(nic[i].pd, NULL, &c[i]), 0);
        assert_int_equal(drc_get(c[i], (void *)(at + (size_t)i * 2 * XFER), XFER, ACCESS, &r[i]), 0);
    }
    k = counters();
    assert_int_equal(k.dmabuf_regs, NICS);
    assert_int_equal(k.dmabuf_inodes, 2);              /* one per mapping type */
    assert_int_equal(fakecu_exports() - exports, 2);
    assert_int_equal(drc__cuda_exports_live(), 2);
    assert_int_equal(fc.nexports, 2);
    assert_true(fc.exports[0].ptr == (uintptr_t)gpu && fc.exports[0].size == SIZE);
    assert_int_equal(fc.exports[0].flags, DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);   /* loop0 */
    assert_int_equal(fc.exports[1].flags, 0);                                                  /* loop2 */
    assert_int_equal(fds_open(), base_fds + 2 + (int)counters().dmabuf_held);        /* the table's two; every copy closed */

    for (int i = 0; i < NICS; i++) {
        unsigned char *dst = (unsigned char *)(at + (size_t)i * 2 * XFER);

        assert_int_equal(write_to(&nic[i], (uintptr_t)dst, drc_region_rkey(r[i])), IBV_WC_SUCCESS);
        assert_true(all(dst, XFER, (unsigned char)(0xa0 + i)));
        assert_true(all(dst - 100, 100, 0x11));            /* neighbours unchanged */
        assert_true(all(dst + XFER, XFER, 0x11));
    }
    assert_int_equal(counters().bytes_moved, NICS * XFER);
    assert_int_equal(counters().stale_uses, 0);
    for (int i = 0; i < NICS; i++)
        assert_int_equal(drc_put(c[i], r[i]), 0);
    /* the free: the exports are closed before it, the idle MRs deregistered */
    free_gpu();
    assert_int_equal(drc__cuda_exports_live(), 0);
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);
    assert_int_equal(counters().live_mrs, NICS);       /* the source MRs only */
    for (int i = 0; i < NICS; i++)
        assert_int_equal(drc_cache_destroy(c[i]), 0);
}

/* Topology unknown (no sysfs tree) or forced default: one export for all 4 NICs. */
static void four_nics_one_export(void **state)
{
    drc_cache_t *c[NICS];
    drc_region_t *r[NICS];

    (void)state;
    setenv("DRC_DMABUF_MAPPING", "default", 1);
    drc__env_reset();
    for (int i = 0; i < NICS; i++) {
        assert_int_equal(drc_cache_create_verbs(nic[i].pd, NULL, &c[i]), 0);
        assert_int_equal(drc_get(c[i], gpu + 3 * 4096, 3 * 4096, ACCESS, &r[i]), 0);
    }
    assert_int_equal(counters().dmabuf_inodes, 1);
    assert_int_equal(fc.nexports, 1);
    assert_int_equal(fds_open(), base_fds + 1 + (int)counters().dmabuf_held);
    /* freed while the regions are still held: the export goes at once, the MRs on the last put */
    free_gpu();
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);
    for (int i = 0; i < NICS; i++) {
        assert_false(drc_region_valid(r[i]));
        assert_int_equal(drc_put(c[i], r[i]), 0);
        assert_int_equal(drc_cache_destroy(c[i]), 0);
    }
    assert_int_equal(counters().live_mrs, NICS);
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);
}

/* drc_reg_mr_multi: all 4, one export; then the 3rd of 4 fails: none left, no fd. */
static void multi_all_or_nothing(void **state)
{
    struct ibv_pd *pds[NICS];
    struct ibv_mr *mrs[NICS];
    unsigned char *dst = gpu + (2 << 20) + 4096;

    (void)state;
    setenv("DRC_DMABUF_MAPPING", "auto", 1);
    drc__env_reset();
    for (int i = 0; i < NICS; i++)
        pds[i] = nic[i].pd;
    assert_int_equal(drc_reg_mr_multi(pds, NICS, dst, XFER, ACCESS, mrs), 0);
    assert_int_equal(counters().dmabuf_regs, NICS);
    assert_int_equal(counters().dmabuf_inodes, 2);
    for (int i = 0; i < NICS; i++) {
        assert_non_null(mrs[i]);
        assert_ptr_equal(mrs[i]->pd, nic[i].pd);
        assert_int_equal(write_to(&nic[i], (uintptr_t)dst, mrs[i]->rkey), IBV_WC_SUCCESS);
        assert_true(all(dst, XFER, (unsigned char)(0xa0 + i)));
        assert_int_equal(drc_dereg_mr(mrs[i]), 0);
    }
    assert_true(all(dst - 4096, 4096, 0x11) && all(dst + XFER, 4096, 0x11));
    free_gpu();
    assert_int_equal(counters().live_mrs, NICS);
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);

    /* the 3rd registration fails: everything rolled back */
    fc_add((uintptr_t)gpu, SIZE, 0, 78);
    loopnic_fail_dmabuf_reg(3, ENOMEM);
    memset(mrs, 0xff, sizeof(mrs));
    assert_int_equal(drc_reg_mr_multi(pds, NICS, dst, XFER, ACCESS, mrs), -ENOMEM);
    for (int i = 0; i < NICS; i++)
        assert_null(mrs[i]);
    /* the source MRs, and the three this call registered, cached idle (the free below takes them) */
    assert_int_equal(counters().live_mrs, NICS + NICS - 1);
    assert_int_equal(fds_open(), base_fds + drc__cuda_exports_live() + (int)counters().dmabuf_held);   /* no copy left open */
    free_gpu();
    assert_int_equal(counters().live_mrs, NICS);
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);
    assert_int_equal(drc_reg_mr_multi(NULL, NICS, dst, XFER, ACCESS, mrs), -EINVAL);
    assert_int_equal(drc_reg_mr_multi(pds, 0, dst, XFER, ACCESS, mrs), -EINVAL);
    for (int i = 0; i < NICS; i++)
        assert_int_equal(drc_pd_release(nic[i].pd), 0);
}

/*
 * A failed drc_reg_mr_multi takes back only its own references. Another caller holds an MR of the range
 * on loop0; a multi over loop0 (a hit on that region) and loop1 (the same PCIe mapping type: the shared
 * export) fails on loop1. The other caller's MR still moves data, and its next registration of the range
 * is a hit: no new NIC registration, no new export. Without DRC_F_REVOKE the rollback used to retire the
 * region and close the shared export (the other caller registered again); with it, it revoked the other
 * caller's live keys (the WRITE failed with a remote access error).
 */
static void multi_failure_leaves_other_callers_alone(void **state)
{
    static const unsigned flags[] = { 0, DRC_F_REVOKE };
    unsigned char *dst = gpu + (3 << 20);
    struct ibv_pd *pds[2] = { nic[0].pd, nic[1].pd };
    struct ibv_mr *held, *again, *mrs[2];

    (void)state;
    setenv("DRC_DMABUF_MAPPING", "auto", 1);
    for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
        struct drc_config cfg = { .flags = flags[f] };
        unsigned exports;
        uint64_t regs;

        printf("  %s\n", flags[f] ? "DRC_F_REVOKE" : "no revoke");
        for (int i = 0; i < 2; i++)
            assert_int_equal(drc_pd_release(nic[i].pd), 0);    /* caches made from now on take cfg */
        assert_int_equal(drc_reg_mr_configure(&cfg), 0);
        held = drc_reg_mr(nic[0].pd, dst, XFER, ACCESS);
        assert_non_null(held);
        exports = fakecu_exports();
        regs = counters().dmabuf_regs;
        loopnic_fail_dmabuf_reg(1, ENOMEM);     /* loop1's registration: the only one the multi makes */
        assert_int_equal(drc_reg_mr_multi(pds, 2, dst, XFER, ACCESS, mrs), -ENOMEM);
        assert_true(mrs[0] == NULL && mrs[1] == NULL);
        assert_int_equal(counters().dmabuf_regs, regs);
        /* the other caller's MR: its keys still move data */
        memset(dst, 0x11, XFER);
        assert_int_equal(write_to(&nic[0], (uintptr_t)dst, held->rkey), IBV_WC_SUCCESS);
        assert_true(all(dst, XFER, 0xa0));
        /* and its memory is still cached and exported: a hit */
        again = drc_reg_mr(nic[0].pd, dst, XFER, ACCESS);
        assert_non_null(again);
        assert_int_equal(again->rkey, held->rkey);
        assert_int_equal(counters().dmabuf_regs, regs);
        assert_int_equal(fakecu_exports(), exports);
        assert_int_equal(drc_dereg_mr(again), 0);
        assert_int_equal(drc_dereg_mr(held), 0);
        for (int i = 0; i < 2; i++)
            assert_int_equal(drc_pd_release(nic[i].pd), 0);
        free_gpu();
        fc_add((uintptr_t)gpu, SIZE, 0, 79 + (int)f);
    }
    assert_int_equal(drc_reg_mr_configure(NULL), 0);
    assert_int_equal(counters().live_mrs, NICS);
    assert_int_equal(counters().stale_uses, 0);
    assert_int_equal(fds_open(), base_fds + (int)counters().dmabuf_held);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(four_nics_one_export_per_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(four_nics_one_export, setup, teardown),
        cmocka_unit_test_setup_teardown(multi_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(multi_failure_leaves_other_callers_alone, setup, teardown),
    };

    setenv("LOOPNIC_DEVICES", "4", 0);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
