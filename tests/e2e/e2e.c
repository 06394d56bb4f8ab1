/* The end-to-end suite (issue 10): two processes, an initiator (this test) and a target (this
 * program re-executed with --target), exchange QP numbers, addresses and rkeys over a socketpair,
 * register through drc and move patterns both ways with RDMA WRITE and READ; every byte is checked.
 *
 * One source, two programs (tests/e2e/e2e.mk):
 *   e2e_api     registers through drc's C API (drc_cache_create_verbs, drc_get, drc_region_mr);
 *               the allocator's part (drc_notify_free before a free) is done by hand.
 *   e2e_engine  an engine on plain verbs (ibv_reg_mr / ibv_dereg_mr) that knows nothing of drc;
 *               run with build/libdrc_verbs.so preloaded, drc serves its registrations and sees
 *               its munmaps.
 * Both link the system's -libverbs. make test runs the matrix: e2e_api on the loopback provider
 * in place (LD_LIBRARY_PATH=build/loopnic), e2e_engine the same way under the preload, and
 * e2e_engine with drc and then the provider preloaded over the system's libibverbs; every test,
 * the same assertions, in each. The provider's control API (found with dlsym) adds its counters:
 * stale uses, live MRs, injected failures. On a real NIC (make test-hw) the tests that need that
 * API skip, the others run as is.
 *
 * The controls: the hazard test runs again with a target that has no invalidation (e2e_api: no
 * drc_notify_free; e2e_engine: DRC_PRELOAD=verbs, the interposer without its unmap hooks); the
 * transfer after the remap must then not land in the new memory, and loopnic counts a stale use.
 *
 * Revocation (DRC_F_REVOKE; DRC_VERBS_REVOKE=1 for the interposer, and for e2e_api's target, which
 * then creates its cache with the flag): the target's engine keeps its MR across the free, the same
 * VA comes back, and both sides transfer through the old keys. With revocation the free took the MR
 * off the NIC: each work request completes with a protection error, no byte lands in the new
 * mapping, and no stale use is counted. The control, the same target without revocation, keeps the
 * MR registered: the provider counts the stale uses (a real NIC would write into the orphaned pages).
 *
 * Environment: E2E_DEVICE (device name, default the first), E2E_GID_INDEX (default 0),
 * E2E_REQUIRE_HW (refuse to run on loopnic), E2E_REQUIRE_GPU (no CUDA driver is a failure, not a
 * skip), E2E_MODE (the matrix column, printed). --probe: exit 0 if libibverbs sees a device, 77
 * if not.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "../helpers.h"
#include "rcqp.h"
#include "loopnic.h"
#ifdef E2E_API
#include "drc.h"
#include "drc_verbs.h"
#endif

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { PAGE = 4096, NREG = 64 };

/* ---- the loopback provider's control API, if this libibverbs is loopnic ---- */
static loopnic_get_counters_fn *ln_counters;
static loopnic_fail_fn *ln_fail_reg, *ln_fail_wr;

static struct loopnic_counters counters(void)
{
    struct loopnic_counters c;

    memset(&c, 0, sizeof(c));
    if (ln_counters)
        ln_counters(-1, &c);
    return c;
}

#define NEED_LOOPNIC()                                                          \
    do {                                                                        \
        if (!ln_counters) {                                                     \
            fprintf(stderr, "skipped: needs the loopnic provider's control API\n"); \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* ---- one process's verbs side ---- */
struct qpinfo { uint32_t qp_num, psn; uint16_t lid; uint8_t gid[16]; };

struct side {
    struct ibv_device **devs;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    int gid_index;
    struct qpinfo me, peer;
    struct {                /* registrations, by index */
        struct ibv_mr *mr;
        void *region;       /* e2e_api: the drc_region_t */
    } reg[NREG];
#ifdef E2E_API
    drc_cache_t *cache;
#endif
};

/* Open device number @dev (-1: E2E_DEVICE, else the first), a PD, a CQ and an RC QP. */
static int side_open_dev(struct side *s, int dev)
{
    const char *want = getenv("E2E_DEVICE");
    struct ibv_qp_init_attr ia;
    struct ibv_port_attr pa;
    union ibv_gid gid;
    int n = 0, i = 0;

    memset(s, 0, sizeof(*s));
    s->gid_index = getenv("E2E_GID_INDEX") ? atoi(getenv("E2E_GID_INDEX")) : 0;
    if (!(s->devs = ibv_get_device_list(&n)) || n < 1)
        return -1;
    if (dev >= 0)
        i = dev < n ? dev : n;
    else if (want)
        for (i = 0; i < n && strcmp(ibv_get_device_name(s->devs[i]), want); i++) {}
    if (i == n || !(s->ctx = ibv_open_device(s->devs[i])) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
        !(s->cq = ibv_create_cq(s->ctx, 256, NULL, NULL, 0)))
        return -1;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    if (!(s->qp = ibv_create_qp(s->pd, &ia)) || ibv_query_port(s->ctx, 1, &pa) != 0)
        return -1;
    memset(&gid, 0, sizeof(gid));
    ibv_query_gid(s->ctx, 1, s->gid_index, &gid);
    s->me.qp_num = s->qp->qp_num;
    s->me.psn = (uint32_t)getpid() & 0xffffff;
    s->me.lid = pa.lid;
    memcpy(s->me.gid, gid.raw, 16);
#ifdef E2E_API
    {
        /* DRC_VERBS_REVOKE=1: the same switch as the interposer's */
        const char *rv = getenv("DRC_VERBS_REVOKE");
        struct drc_config cfg = { .flags = rv && !strcmp(rv, "1") ? DRC_F_REVOKE : 0 };

        if (drc_cache_create_verbs(s->pd, &cfg, &s->cache) != 0)
            return -1;
    }
#endif
    return 0;
}

static int side_open(struct side *s)
{
    return side_open_dev(s, -1);
}

/* RESET -> INIT -> RTR -> RTS towards s->peer */
static int side_connect(struct side *s)
{
    struct rcqp_peer peer = { .qpn = s->peer.qp_num, .psn = s->peer.psn, .lid = s->peer.lid,
                              .sgid_index = (uint8_t)s->gid_index };

    memcpy(peer.gid.raw, s->peer.gid, 16);
    return rcqp_connect(s->qp, &peer, ACC, s->me.psn) ? -1 : 0;
}

static void side_close(struct side *s)
{
    for (int i = 0; i < NREG; i++)
        if (s->reg[i].mr) {
#ifdef E2E_API
            drc_put(s->cache, s->reg[i].region);
#else
            ibv_dereg_mr(s->reg[i].mr);
#endif
        }
#ifdef E2E_API
    if (s->cache)
        drc_cache_destroy(s->cache);
#endif
    if (s->qp)
        ibv_destroy_qp(s->qp);
    if (s->cq)
        ibv_destroy_cq(s->cq);
    if (s->pd)
        ibv_dealloc_pd(s->pd);
    if (s->ctx)
        ibv_close_device(s->ctx);
    if (s->devs)
        ibv_free_device_list(s->devs);
}

/* Register [addr, addr+len) with @access: drc_get (e2e_api) or ibv_reg_mr (e2e_engine). Returns
 * the slot, or a negative errno. */
static int reg_access(struct side *s, void *addr, size_t len, unsigned access)
{
    int i;

    for (i = 0; i < NREG && s->reg[i].mr; i++) {}
    if (i == NREG)
        return -ENOSPC;
#ifdef E2E_API
    {
        drc_region_t *r;
        int rc = drc_get(s->cache, addr, len, access, &r);
        if (rc)
            return rc;
        s->reg[i].region = r;
        s->reg[i].mr = drc_region_mr(r);
    }
#else
    if (!(s->reg[i].mr = ibv_reg_mr(s->pd, addr, len, (int)access)))
        return -errno;
#endif
    return i;
}

static int reg(struct side *s, void *addr, size_t len)
{
    return reg_access(s, addr, len, ACC);
}

static int unreg(struct side *s, int i)
{
    struct ibv_mr *mr = s->reg[i].mr;

    s->reg[i].mr = NULL;
#ifdef E2E_API
    (void)mr;
    return drc_put(s->cache, s->reg[i].region);
#else
    return ibv_dereg_mr(mr);
#endif
}

/* One signalled RDMA WRITE or READ of len bytes between local (lkey) and remote (rkey); returns
 * the completion's status, or -1 if the post failed or nothing completed within 10 s. */
static int post(struct side *s, int write, void *local, uint32_t lkey, size_t len, uint64_t raddr, uint32_t rkey)
{
    struct ibv_sge sg = { (uintptr_t)local, (uint32_t)len, lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    struct timespec t0, t;
    int n = 0;

    memset(&wr, 0, sizeof(wr));
    wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;   /* drc registers with iova = the address */
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(s->qp, &wr, &bad))
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10)
            return -1;
    }
    return n == 1 ? (int)wc.status : -1;
}

/* The pattern: a byte that depends on the seed and on the offset, so a shifted copy is caught. */
static unsigned char pat(unsigned seed, size_t i)
{
    return (unsigned char)(seed * 131u + i * 7u + (i >> 12) * 13u + 1u);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pat(seed, i);
}

/* Bytes that differ from the pattern. */
static size_t bad_bytes(const unsigned char *p, size_t n, unsigned seed)
{
    size_t bad = 0;

    for (size_t i = 0; i < n; i++)
        bad += p[i] != pat(seed, i);
    return bad;
}

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- the target: does what the initiator asks, one message at a time ---- */
enum op { T_ALLOC, T_FILL, T_CHECK, T_REG, T_UNREG, T_REMAP, T_POST, T_COUNTERS, T_NONZERO, T_STATE, T_FORK, T_QUIT };
struct msg { uint32_t op, arg; uint64_t a, b, c, d, e; };

/* How a target is started (start(); the target gets them as its third argument). */
enum {
    TF_NO_INVALIDATION = 1,  /* e2e_api: no drc_notify_free; e2e_engine: DRC_PRELOAD=verbs (no unmap hooks) */
    TF_REVOKE = 2,           /* DRC_VERBS_REVOKE=1 */
    TF_MISSPELT = 4,         /* DRC_PRELOAD with a misspelt part */
    TF_NO_DRC = 8,           /* e2e_engine: DRC_VERBS=off; e2e_api: a fork child releases through the provider */
};
enum { T_REMAP_MUNMAP = 0, T_REMAP_FIXED = 1 };
#define MISSPELT_PARTS "cuda,verbs,hots"

/*
 * fork() in a target that registered [buf, buf+len) (its slot @slot). The child, as a worker that
 * a program forks would: opens the device anew (its own PD, QPs, and through drc its own cache),
 * registers the inherited buffer (the parent's VA, the child's copy of the pages) and writes into
 * it over a QP pair of its own; then releases the registration it inherited (as destructors do at
 * a child's exit) and unmaps its copy. Returns the child's exit status: 0, the number of the
 * failed check, or 2 if it hung (SIGALRM) and 100 + the signal if it died.
 */
static int fork_child(struct side *parent, int slot, unsigned char *buf, size_t len, int flags)
{
    pid_t pid = fork();
    int st;

    if (pid == 0) {
        struct side a, b;
        unsigned char *src;
        int si, bi;

        alarm(30);       /* a hang guard only */
        src = map(len);
        CHILD_CHECK(10, src);
        CHILD_CHECK(11, side_open(&a) == 0 && side_open(&b) == 0);
        a.peer = b.me;
        b.peer = a.me;
        CHILD_CHECK(12, side_connect(&a) == 0 && side_connect(&b) == 0);
        si = reg(&a, src, len);
        bi = reg(&b, buf, len);
        CHILD_CHECK(13, si >= 0 && bi >= 0);
        fill(src, len, 50);
        CHILD_CHECK(14, post(&a, 1, src, a.reg[si].mr->lkey, len, (uintptr_t)buf, b.reg[bi].mr->rkey) ==
                            IBV_WC_SUCCESS);
        CHILD_CHECK(15, bad_bytes(buf, len, 50) == 0);     /* in the child's copy */
        CHILD_CHECK(16, unreg(&a, si) == 0 && unreg(&b, bi) == 0);
        side_close(&a);
        side_close(&b);
#ifdef E2E_API
        if (flags & TF_NO_DRC) {    /* the control: the release reaches the provider */
            struct ibv_mr *mr = drc_region_mr(parent->reg[slot].region);
            CHILD_CHECK(17, mr && ibv_dereg_mr(mr) == 0);
        } else
#endif
        {
            (void)flags;
            CHILD_CHECK(17, unreg(parent, slot) == 0);
        }
        CHILD_CHECK(18, munmap(buf, len) == 0);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 1;
    if (WIFSIGNALED(st))
        return WTERMSIG(st) == SIGALRM ? 2 : 100 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int run_target(int fd, int flags)
{
    int no_invalidation = flags & TF_NO_INVALIDATION;

    (void)no_invalidation;     /* e2e_engine: DRC_PRELOAD did it */
    struct side s;
    struct msg m, r;
    int rc = 1;

    if (side_open(&s) != 0 || write(fd, &s.me, sizeof(s.me)) != sizeof(s.me) ||
        read(fd, &s.peer, sizeof(s.peer)) != sizeof(s.peer) || side_connect(&s) != 0) {
        fprintf(stderr, "e2e target: verbs setup failed\n");
        return 1;
    }
    while (read(fd, &m, sizeof(m)) == sizeof(m)) {
        memset(&r, 0, sizeof(r));
        switch ((enum op)m.op) {
        case T_ALLOC:            /* a = len -> a = address, zeroed */
            r.a = (uintptr_t)map(m.a);
            break;
        case T_FILL:             /* a = address, b = len, arg = seed */
            fill((unsigned char *)(uintptr_t)m.a, m.b, m.arg);
            break;
        case T_CHECK:            /* -> a = bytes that differ */
            r.a = bad_bytes((unsigned char *)(uintptr_t)m.a, m.b, m.arg);
            break;
        case T_REG: {            /* c = access (0: ACC) -> arg = slot or negative errno; a = rkey; b = lkey */
            int i = reg_access(&s, (void *)(uintptr_t)m.a, m.b, m.c ? (unsigned)m.c : ACC);
            r.arg = (uint32_t)i;
            if (i >= 0) {
                r.a = s.reg[i].mr->rkey;
                r.b = s.reg[i].mr->lkey;
            }
            break;
        }
        case T_UNREG:
            r.arg = (uint32_t)unreg(&s, (int)m.arg);
            break;
        case T_REMAP: {          /* free a, b bytes and map the same VA again (zeroed): arg T_REMAP_MUNMAP
                                  * munmap then mmap; T_REMAP_FIXED mmap(MAP_FIXED) over it, no munmap */
            void *p = (void *)(uintptr_t)m.a;
#ifdef E2E_API
            if (!no_invalidation)
                drc_notify_free(p, m.b);   /* what the allocator tells drc before it frees */
#endif
            r.arg = (m.arg == T_REMAP_MUNMAP && munmap(p, m.b) != 0) ||
                    mmap(p, m.b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != p;
            break;
        }
        case T_POST:             /* arg = write; a = local, b = lkey, c = len, d = remote, e = rkey */
            r.arg = (uint32_t)post(&s, (int)m.arg, (void *)(uintptr_t)m.a, (uint32_t)m.b, m.c, m.d, (uint32_t)m.e);
            break;
        case T_COUNTERS: {       /* -> a = live MRs, b = registrations, c = stale uses, d = protection errors */
            struct loopnic_counters c = counters();
            r.a = c.live_mrs;
            r.b = c.total_regs;
            r.c = c.stale_uses;
            r.d = c.prot_errors;
            break;
        }
        case T_NONZERO: {        /* a = address, b = len -> a = bytes that are not 0 */
            const unsigned char *p = (const unsigned char *)(uintptr_t)m.a;
            for (uint64_t k = 0; k < m.b; k++)
                r.a += p[k] != 0;
            break;
        }
        case T_STATE: {          /* arg = slot -> a = the rkey read from the slot's ibv_mr (e2e_api: the
                                  * region's ibv_mr, 0 if drc_region_mr gives none), b = region valid */
#ifdef E2E_API
            struct ibv_mr *mr = drc_region_mr(s.reg[m.arg].region);
            r.a = mr ? mr->rkey : 0;
            r.b = (uint64_t)drc_region_valid(s.reg[m.arg].region);
#else
            r.a = s.reg[m.arg].mr->rkey;    /* the caller's ibv_mr: still valid memory */
            r.b = 1;
#endif
            break;
        }
        case T_FORK:             /* arg = slot of the registration of [a, a+b) -> arg = the child's status */
            r.arg = (uint32_t)fork_child(&s, (int)m.arg, (unsigned char *)(uintptr_t)m.a, m.b, flags);
            break;
        case T_QUIT:
            side_close(&s);
            rc = 0;
            r.arg = 0;
            if (write(fd, &r, sizeof(r)) != sizeof(r))
                rc = 1;
            return rc;
        }
        if (write(fd, &r, sizeof(r)) != sizeof(r))
            break;
    }
    return rc;
}

/* ---- the initiator ---- */
struct env {
    struct side s;
    int fd;
    pid_t pid;
    int err;            /* the target's stderr: an unlinked file, copied to ours at teardown */
};

static struct msg ask(struct env *e, uint32_t op, uint32_t arg, uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                      uint64_t x)
{
    struct msg m = { op, arg, a, b, c, d, x }, r;

    assert_int_equal(write(e->fd, &m, sizeof(m)), sizeof(m));
    assert_int_equal(read(e->fd, &r, sizeof(r)), sizeof(r));
    return r;
}

/* Start a target (TF_* flags) and connect a QP pair to it. */
static int start(void **state, int flags)
{
    struct env *e = calloc(1, sizeof(*e));
    char errpath[] = "/tmp/drc-e2e-err-XXXXXX";
    int sv[2];

    if (!e || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 || (e->err = mkstemp(errpath)) < 0)
        return -1;
    unlink(errpath);
    e->pid = fork();
    if (e->pid == 0) {
        char fdarg[16], flagarg[16];
        close(sv[0]);
        dup2(e->err, 2);
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        snprintf(flagarg, sizeof(flagarg), "%d", flags);
        if (flags & TF_NO_INVALIDATION)
            setenv("DRC_PRELOAD", "verbs", 1);   /* e2e_engine: the interposer without its unmap hooks */
        if (flags & TF_MISSPELT)
            setenv("DRC_PRELOAD", MISSPELT_PARTS, 1);
        if (flags & TF_REVOKE)
            setenv("DRC_VERBS_REVOKE", "1", 1);  /* the interposer's switch; e2e_api's target reads it too */
        if (flags & TF_NO_DRC)
            setenv("DRC_VERBS", "off", 1);       /* e2e_engine: the interposer forwards every call */
        execl("/proc/self/exe", "e2e-target", "--target", fdarg, flagarg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    e->fd = sv[0];
    if (e->pid < 0 || side_open(&e->s) != 0 || write(e->fd, &e->s.me, sizeof(e->s.me)) != sizeof(e->s.me) ||
        read(e->fd, &e->s.peer, sizeof(e->s.peer)) != sizeof(e->s.peer) || side_connect(&e->s) != 0) {
        fprintf(stderr, "e2e: verbs setup failed\n");
        return -1;
    }
    *state = e;
    return 0;
}

static int setup(void **state) { return start(state, 0); }
static int setup_control(void **state) { return start(state, TF_NO_INVALIDATION); }
static int setup_revoke(void **state) { return start(state, TF_REVOKE); }
static int setup_misspelt(void **state) { return start(state, TF_MISSPELT); }
static int setup_no_drc(void **state) { return start(state, TF_NO_DRC); }

/* Does a line of what the target wrote on stderr so far contain @what? */
static int target_said(struct env *e, const char *what)
{
    char buf[8192];
    ssize_t n = pread(e->err, buf, sizeof(buf) - 1, 0);

    buf[n > 0 ? n : 0] = 0;
    return strstr(buf, what) != NULL;
}

static int teardown(void **state)
{
    struct env *e = *state;
    struct msg m = { T_QUIT, 0, 0, 0, 0, 0, 0 }, r;
    int st = 0;

    if (write(e->fd, &m, sizeof(m)) != sizeof(m) || read(e->fd, &r, sizeof(r)) != sizeof(r))
        fprintf(stderr, "e2e: the target did not answer QUIT\n");
    waitpid(e->pid, &st, 0);
    close(e->fd);
    {
        char buf[4096];
        ssize_t n;
        off_t off = 0;

        while ((n = pread(e->err, buf, sizeof(buf), off)) > 0) {
            fwrite(buf, 1, (size_t)n, stderr);
            off += n;
        }
        close(e->err);
    }
    side_close(&e->s);
    free(e);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Patterns both ways, WRITE and READ, started from each side, at several sizes and offsets. */
static void test_patterns_both_ways(void **state)
{
    struct env *e = *state;
    enum { LEN = 64 * PAGE };
    static const size_t off[] = { 0, 1, 4095, 5 * PAGE + 17 }, sz[] = { 1, 4096, 3 * PAGE + 5, 40 * PAGE };
    unsigned char *mine = map(LEN);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a;
    struct msg tr;
    int mi, seed = 1;
    uint32_t lkey, rkey;
    struct loopnic_counters c0 = counters();

    assert_true(mine && theirs);
    mi = reg(&e->s, mine, LEN);
    assert_true(mi >= 0);
    lkey = e->s.reg[mi].mr->lkey;
    tr = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true((int)tr.arg >= 0);
    rkey = (uint32_t)tr.a;
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++)
        for (size_t j = 0; j < sizeof(sz) / sizeof(sz[0]); j++, seed += 4) {
            size_t o = off[i], n = sz[j];
            /* initiator WRITEs, the target checks */
            fill(mine + o, n, (unsigned)seed);
            assert_int_equal(post(&e->s, 1, mine + o, lkey, n, theirs + o, rkey), IBV_WC_SUCCESS);
            assert_int_equal(ask(e, T_CHECK, (uint32_t)seed, theirs + o, n, 0, 0, 0).a, 0);
            /* the target fills, the initiator READs */
            ask(e, T_FILL, (uint32_t)seed + 1, theirs + o, n, 0, 0, 0);
            memset(mine + o, 0, n);
            assert_int_equal(post(&e->s, 0, mine + o, lkey, n, theirs + o, rkey), IBV_WC_SUCCESS);
            assert_int_equal(bad_bytes(mine + o, n, (unsigned)seed + 1), 0);
            /* the target WRITEs into the initiator */
            ask(e, T_FILL, (uint32_t)seed + 2, theirs + o, n, 0, 0, 0);
            memset(mine + o, 0, n);
            assert_int_equal(ask(e, T_POST, 1, theirs + o, tr.b, n, (uintptr_t)(mine + o), e->s.reg[mi].mr->rkey).arg,
                             IBV_WC_SUCCESS);
            assert_int_equal(bad_bytes(mine + o, n, (unsigned)seed + 2), 0);
            /* the target READs from the initiator */
            fill(mine + o, n, (unsigned)seed + 3);
            assert_int_equal(ask(e, T_POST, 0, theirs + o, tr.b, n, (uintptr_t)(mine + o), e->s.reg[mi].mr->rkey).arg,
                             IBV_WC_SUCCESS);
            assert_int_equal(ask(e, T_CHECK, (uint32_t)seed + 3, theirs + o, n, 0, 0, 0).a, 0);
        }
    if (ln_counters)   /* every byte went through the provider, none was refused */
        assert_int_equal(counters().wr_errors - c0.wr_errors, 0);
    assert_int_equal((int)ask(e, T_UNREG, tr.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, LEN);
}

/* register, transfer, free, map the same VA again (how: T_REMAP_*), register, transfer, verify.
 * Returns the bytes of the second transfer that did not land in the new memory; *stale gets
 * loopnic's count. */
static size_t hazard_how(struct env *e, uint32_t how, uint64_t *stale)
{
    enum { LEN = 16 * PAGE };
    unsigned char *mine = map(LEN);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a;
    struct loopnic_counters c0 = counters();
    struct msg t1, t2;
    int mi;
    size_t bad;

    assert_true(mine && theirs);
    mi = reg(&e->s, mine, LEN);
    assert_true(mi >= 0);
    t1 = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true((int)t1.arg >= 0);
    fill(mine, LEN, 7);
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t1.a), IBV_WC_SUCCESS);
    assert_int_equal(ask(e, T_CHECK, 7, theirs, LEN, 0, 0, 0).a, 0);
    /* the target's engine is done with it and frees it; the same VA comes back */
    assert_int_equal((int)ask(e, T_UNREG, t1.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(ask(e, T_REMAP, how, theirs, LEN, 0, 0, 0).arg, 0);
    t2 = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true((int)t2.arg >= 0);
    fill(mine, LEN, 8);
    post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t2.a);  /* status checked by the callers */
    bad = ask(e, T_CHECK, 8, theirs, LEN, 0, 0, 0).a;
    *stale = counters().stale_uses - c0.stale_uses;
    assert_int_equal((int)ask(e, T_UNREG, t2.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, LEN);
    return bad;
}

static size_t hazard(struct env *e, uint64_t *stale)
{
    return hazard_how(e, T_REMAP_MUNMAP, stale);
}

/* The interposer's complaint about a DRC_PRELOAD it cannot read names the variable. */
#define PRELOAD_COMPLAINT "DRC_PRELOAD"

static void test_hazard_with_drc(void **state)
{
    uint64_t stale;

    assert_int_equal(hazard(*state, &stale), 0);   /* every byte in the new memory */
    assert_int_equal(stale, 0);
    assert_false(target_said(*state, PRELOAD_COMPLAINT));   /* a sound configuration: no complaint */
}

/* The control: the same program, the target's drc not told of the free. */
static void test_hazard_control_without_invalidation(void **state)
{
    uint64_t stale;

    assert_true(hazard(*state, &stale) > 0);       /* the transfer missed the new memory */
    if (ln_counters)
        assert_true(stale > 0);                    /* and the provider saw the stale MR used */
    assert_false(target_said(*state, PRELOAD_COMPLAINT));   /* DRC_PRELOAD=verbs is a valid choice */
}

/* mmap(MAP_FIXED) over registered memory, no munmap (what an allocator that recycles address
 * space does), then a registration of the same VA: it must be of the new pages. */
static void test_remap_fixed_with_drc(void **state)
{
    uint64_t stale;

    assert_int_equal(hazard_how(*state, T_REMAP_FIXED, &stale), 0);
    assert_int_equal(stale, 0);
}

/* The control: the same without the host part (DRC_PRELOAD=verbs; e2e_api: no drc_notify_free). */
static void test_remap_fixed_control_without_invalidation(void **state)
{
    uint64_t stale;

    assert_true(hazard_how(*state, T_REMAP_FIXED, &stale) > 0);
    if (ln_counters)
        assert_true(stale > 0);
}

/* A misspelt DRC_PRELOAD (MISSPELT_PARTS) leaves protection on and says so on stderr once. The
 * controls are the two tests above: a sound setting makes no complaint, and without the host part
 * the hazard is seen. */
static void test_misspelt_preload_keeps_protection(void **state)
{
    uint64_t stale;

    assert_int_equal(hazard(*state, &stale), 0);
    assert_int_equal(stale, 0);
#ifndef E2E_API
    assert_true(target_said(*state, PRELOAD_COMPLAINT));
#endif
}

/* The target's engine keeps its MR across a free of its memory; the same VA comes back, and both
 * sides transfer through the old keys: the initiator WRITEs to the old rkey (*st1), the target
 * WRITEs from the old lkey (*st2). Returns the bytes of the new mapping that are not 0 (it is
 * mapped zeroed, the pattern never is); the target's ibv_mr after the free in *state. */
struct held { int st1, st2; uint64_t stale, prot; struct msg state; };

static uint64_t held_across_free(struct env *e, struct held *h)
{
    enum { LEN = 16 * PAGE };
    unsigned char *mine = map(LEN);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a, nonzero;
    struct loopnic_counters c0 = counters();
    struct msg t1, tc0, tc1;
    int mi;

    assert_true(mine && theirs);
    mi = reg(&e->s, mine, LEN);
    assert_true(mi >= 0);
    t1 = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true((int)t1.arg >= 0);
    fill(mine, LEN, 7);
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t1.a), IBV_WC_SUCCESS);
    assert_int_equal(ask(e, T_CHECK, 7, theirs, LEN, 0, 0, 0).a, 0);
    tc0 = ask(e, T_COUNTERS, 0, 0, 0, 0, 0, 0);
    /* freed while the engine still holds its MR; the same VA comes back, zeroed */
    assert_int_equal(ask(e, T_REMAP, 0, theirs, LEN, 0, 0, 0).arg, 0);
    fill(mine, LEN, 8);
    h->st1 = post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t1.a);
    h->st2 = (int)ask(e, T_POST, 1, theirs, t1.b, LEN, (uintptr_t)mine, e->s.reg[mi].mr->rkey).arg;
    nonzero = ask(e, T_NONZERO, 0, theirs, LEN, 0, 0, 0).a;
    tc1 = ask(e, T_COUNTERS, 0, 0, 0, 0, 0, 0);
    h->stale = counters().stale_uses - c0.stale_uses + tc1.c - tc0.c;
    h->prot = counters().prot_errors - c0.prot_errors + tc1.d - tc0.d;
    h->state = ask(e, T_STATE, t1.arg, 0, 0, 0, 0, 0);
    /* the engine's MR is still its own to deregister */
    assert_int_equal((int)ask(e, T_UNREG, t1.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, LEN);
    return nonzero;
}

/* With revocation: protection errors that the engine sees, nothing in the new mapping, no stale use. */
static void test_held_mr_revoked_by_free(void **state)
{
    struct held h;

    assert_int_equal(held_across_free(*state, &h), 0);
    assert_int_equal(h.st1, IBV_WC_REM_ACCESS_ERR);   /* the old rkey is dead */
    if (ln_counters) {
        assert_int_equal(h.st2, IBV_WC_LOC_PROT_ERR);  /* the old lkey too */
        assert_int_equal(h.stale, 0);                  /* no MR mapped freed memory when it was used */
        assert_int_equal(h.prot, 2);
    } else {
        /* a real responder QP goes to the error state after the first: the second may be flushed */
        assert_true(h.st2 == IBV_WC_LOC_PROT_ERR || h.st2 == IBV_WC_WR_FLUSH_ERR);
    }
#ifdef E2E_API
    assert_int_equal(h.state.a, 0);    /* drc_region_mr: NULL, never the provider's freed ibv_mr */
    assert_int_equal(h.state.b, 0);    /* drc_region_valid */
#else
    assert_int_not_equal(h.state.a, 0);    /* the engine's ibv_mr is still readable */
#endif
}

/* The control: the same target without revocation; the held MR still maps the freed pages. */
static void test_held_mr_control_without_revoke(void **state)
{
    struct held h;

    assert_int_equal(held_across_free(*state, &h), 0);    /* loopnic refuses it; a NIC writes the orphan */
    if (ln_counters) {
        assert_true(h.stale > 0);                      /* the provider saw the stale MR used */
    } else {
        assert_int_equal(h.st1, IBV_WC_SUCCESS);       /* into the orphaned pages */
    }
#ifdef E2E_API
    assert_int_not_equal(h.state.a, 0);    /* still registered: drc_region_mr gives it */
    assert_int_equal(h.state.b, 0);
#endif
}

/* Coalesced registrations: overlapping ranges of the target share one MR; a WRITE into each
 * page through the MR of a sub-buffer lands in that page and nowhere else. */
static void test_coalesced_host_subbuffers(void **state)
{
    struct env *e = *state;
    enum { NP = 8, LEN = NP * PAGE };
    unsigned char *mine = map(PAGE);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a;
    struct msg a, b, sub;
    int mi;

    assert_true(mine && theirs);
    mi = reg(&e->s, mine, PAGE);
    assert_true(mi >= 0);
    for (int k = 0; k < NP; k++)
        ask(e, T_FILL, 100u + (uint32_t)k, theirs + (uint64_t)k * PAGE, PAGE, 0, 0, 0);
    a = ask(e, T_REG, 0, theirs, 3 * PAGE, 0, 0, 0);             /* pages 0-2 */
    b = ask(e, T_REG, 0, theirs + 2 * PAGE, 6 * PAGE, 0, 0, 0);  /* pages 2-7: overlaps, merged */
    assert_true((int)a.arg >= 0 && (int)b.arg >= 0);
    for (int k = 0; k < NP; k++) {
        uint64_t page = theirs + (uint64_t)k * PAGE;
        sub = ask(e, T_REG, 0, page + 100, 1000, 0, 0, 0);        /* a sub-buffer inside page k */
        assert_true((int)sub.arg >= 0);
        assert_int_equal(sub.a, b.a);                             /* served by the coalesced MR */
        fill(mine, 1000, 200u + (unsigned)k);
        assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, 1000, page + 100, (uint32_t)sub.a),
                         IBV_WC_SUCCESS);
        assert_int_equal(ask(e, T_CHECK, 200u + (uint32_t)k, page + 100, 1000, 0, 0, 0).a, 0);
        /* the rest of page k and every other page are what they were */
        assert_int_equal(ask(e, T_CHECK, 100u + (uint32_t)k, page, 100, 0, 0, 0).a, 0);
        ask(e, T_FILL, 100u + (uint32_t)k, page, PAGE, 0, 0, 0);  /* restore page k */
        for (int j = 0; j < NP; j++)
            assert_int_equal(ask(e, T_CHECK, 100u + (uint32_t)j, theirs + (uint64_t)j * PAGE, PAGE, 0, 0, 0).a, 0);
        assert_int_equal((int)ask(e, T_UNREG, sub.arg, 0, 0, 0, 0, 0).arg, 0);
    }
    assert_int_equal((int)ask(e, T_UNREG, a.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal((int)ask(e, T_UNREG, b.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, PAGE);
}

/*
 * What the C API promises a drc_get() that asks no remote bit, while a region of the same memory
 * has some (drc.h, DRC_F_ACCESS_SUPERSET): by default a hit needs exactly the asked bits, so the
 * local-only registration gets a region of its own whose rkey refuses a peer, as through the
 * interposer. 0 would be the opt-in relaxed rule (DRC_F_ACCESS_SUPERSET), where the WRITE lands.
 */
#define E2E_API_LOCAL_ONLY_RKEY_REFUSES_PEER 1

/*
 * rkey scope: two components of the target register the same buffer, A with REMOTE_WRITE, then B
 * with LOCAL_WRITE only. A peer that gets B's rkey may not write: the WRITE completes with a
 * remote access error and no byte lands, as on the NIC without drc. The control in the same test:
 * A's rkey writes.
 */
static void test_rkey_scope_local_only_registration(void **state)
{
    struct env *e = *state;
    enum { LEN = 4 * PAGE };
    unsigned char *mine = map(LEN);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a;
    struct msg a, b;
    int mi, st, strict = 1;

#ifdef E2E_API
    strict = E2E_API_LOCAL_ONLY_RKEY_REFUSES_PEER;
#endif
    assert_true(mine && theirs);
    mi = reg(&e->s, mine, LEN);
    assert_true(mi >= 0);
    a = ask(e, T_REG, 0, theirs, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0, 0);
    b = ask(e, T_REG, 0, theirs, LEN, IBV_ACCESS_LOCAL_WRITE, 0, 0);
    assert_true((int)a.arg >= 0 && (int)b.arg >= 0);
    /* the control: A's rkey lets the peer write */
    fill(mine, LEN, 20);
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)a.a), IBV_WC_SUCCESS);
    assert_int_equal(ask(e, T_CHECK, 20, theirs, LEN, 0, 0, 0).a, 0);
    /* B's rkey does not (the QP goes to the error state: this is the last transfer) */
    fill(mine, LEN, 21);
    st = post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)b.a);
    if (strict) {
        assert_int_equal(st, IBV_WC_REM_ACCESS_ERR);
        assert_int_equal(ask(e, T_CHECK, 20, theirs, LEN, 0, 0, 0).a, 0);   /* no byte landed */
    } else {
        assert_int_equal(st, IBV_WC_SUCCESS);
        assert_int_equal(ask(e, T_CHECK, 21, theirs, LEN, 0, 0, 0).a, 0);
    }
    assert_int_equal((int)ask(e, T_UNREG, b.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal((int)ask(e, T_UNREG, a.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, LEN);
}

/*
 * fork() of a target that holds a registration: the child (fork_child) registers the inherited
 * buffer on a device it opened itself and writes into it, then releases what it inherited and
 * unmaps its copy, all without hanging (its hang guard is SIGALRM). *child gets its exit status.
 * Then the initiator writes through the parent's rkey: the status of that transfer in *st.
 * Returns the bytes of the parent's buffer that differ from that last write.
 */
static uint64_t fork_case(struct env *e, int *child, int *st, uint64_t *stale)
{
    enum { LEN = 4 * PAGE };
    unsigned char *mine = map(LEN);
    uint64_t theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a, bad;
    struct loopnic_counters c0;
    struct msg t;
    int mi;

    assert_true(mine && theirs);
    mi = reg(&e->s, mine, LEN);
    assert_true(mi >= 0);
    t = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true((int)t.arg >= 0);
    fill(mine, LEN, 7);
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t.a), IBV_WC_SUCCESS);
    *child = (int)ask(e, T_FORK, t.arg, theirs, LEN, 0, 0, 0).arg;
    /* the child wrote into its own copy: the parent's pages are as they were */
    assert_int_equal(ask(e, T_CHECK, 7, theirs, LEN, 0, 0, 0).a, 0);
    c0 = counters();
    fill(mine, LEN, 8);
    *st = post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t.a);
    bad = ask(e, T_CHECK, 8, theirs, LEN, 0, 0, 0).a;
    *stale = counters().stale_uses - c0.stale_uses;
    ask(e, T_UNREG, t.arg, 0, 0, 0, 0, 0);     /* checked by the callers' teardown (the target's exit) */
    assert_int_equal(unreg(&e->s, mi), 0);
    munmap(mine, LEN);
    return bad;
}

/* The child's registration works and does not hang; the parent's MR outlives what the child did. */
static void test_fork_child_leaves_parent_mr(void **state)
{
    int child, st;
    uint64_t stale;

    assert_int_equal(fork_case(*state, &child, &st, &stale), 0);
    assert_int_equal(child, 0);
    assert_int_equal(st, IBV_WC_SUCCESS);
    assert_int_equal(stale, 0);
}

/* The control: without drc (e2e_engine: DRC_VERBS=off; e2e_api: the child deregisters the
 * inherited ibv_mr itself) the child's release reaches the provider, which takes the parent's MR
 * down, as the kernel does for a child on an inherited verbs context: the parent's WRITE fails. */
static void test_fork_control_child_release_reaches_nic(void **state)
{
    int child, st;
    uint64_t stale;

    NEED_LOOPNIC();    /* what a NIC does with a child's command on the parent's context is the kernel's */
    assert_true(fork_case(*state, &child, &st, &stale) > 0);
    assert_int_equal(child, 0);
    assert_int_equal(st, IBV_WC_REM_ACCESS_ERR);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Failures on the way: the provider fails the 2nd registration from now, then a work request;
 * drc returns the error, leaks no fd and no MR, and the next registration and transfer work. */
static void test_failures_leak_nothing(void **state)
{
    struct env *e = *state;
    enum { LEN = 4 * PAGE };
    unsigned char *mine;
    uint64_t theirs;
    struct msg t;
    struct loopnic_counters c0;
    int fds0, mi, rc, first;

    NEED_LOOPNIC();
    mine = map(LEN);
    theirs = ask(e, T_ALLOC, 0, LEN, 0, 0, 0, 0).a;
    t = ask(e, T_REG, 0, theirs, LEN, 0, 0, 0);
    assert_true(mine && theirs && (int)t.arg >= 0);
    fds0 = count_fds();
    ln_fail_reg(2, EFAULT);                           /* the second registration from now fails */
    first = reg(&e->s, mine + 3 * PAGE, PAGE);        /* the first works */
    assert_true(first >= 0);
    c0 = counters();
    rc = reg(&e->s, mine, PAGE);
    assert_int_equal(rc, -EFAULT);                    /* drc returns the provider's error */
    assert_int_equal(counters().live_mrs, c0.live_mrs);
    assert_int_equal(counters().reg_failures, c0.reg_failures + 1);
    assert_int_equal(count_fds(), fds0);
    mi = reg(&e->s, mine, LEN);                       /* the next one works */
    assert_true(mi >= 0);
    assert_true(counters().live_mrs > c0.live_mrs);

    ln_fail_wr(1, IBV_WC_RETRY_EXC_ERR);              /* a work request fails */
    fill(mine, LEN, 9);
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t.a), IBV_WC_RETRY_EXC_ERR);
    assert_true(ask(e, T_CHECK, 9, theirs, LEN, 0, 0, 0).a > 0);   /* nothing moved */
    assert_int_equal(side_connect(&e->s), 0);         /* the QP went to error: connect it again */
    assert_int_equal(post(&e->s, 1, mine, e->s.reg[mi].mr->lkey, LEN, theirs, (uint32_t)t.a), IBV_WC_SUCCESS);
    assert_int_equal(ask(e, T_CHECK, 9, theirs, LEN, 0, 0, 0).a, 0);
    assert_int_equal(unreg(&e->s, mi), 0);
    assert_int_equal(unreg(&e->s, first), 0);
    assert_int_equal((int)ask(e, T_UNREG, t.arg, 0, 0, 0, 0, 0).arg, 0);
    assert_int_equal(count_fds(), fds0);
    munmap(mine, LEN);
}

/* ---- GPU memory, in one process (QPs to each other): the dmabuf path ---- */
static struct {
    int (*init)(unsigned);
    int (*dev_get)(int *, int);
    int (*retain)(void **, int);
    int (*set_cur)(void *);
    int (*alloc)(unsigned long long *, size_t);
    int (*free_)(unsigned long long);
    int (*memcpy_)(unsigned long long, unsigned long long, size_t);
    int (*export_)(void *, unsigned long long, size_t, int, unsigned long long);
    void *h;
} cu;

static int double_memcpy(unsigned long long dst, unsigned long long src, size_t n)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* The CUDA driver (the real one, or loopnic's double through LD_LIBRARY_PATH), a context current. */
static int cuda_up(void)
{
    void *h = cu.h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *ctx;
    int dev;

    if (!h)
        return 0;
    *(void **)&cu.init = dlsym(h, "cuInit");
    *(void **)&cu.dev_get = dlsym(h, "cuDeviceGet");
    *(void **)&cu.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set_cur = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.free_ = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.memcpy_ = dlsym(h, "cuMemcpy");
    if (!cu.memcpy_ && dlsym(h, "fakecu_exports"))
        cu.memcpy_ = double_memcpy;     /* the CUDA double: its device memory is host memory */
    *(void **)&cu.export_ = dlsym(h, "cuMemGetHandleForAddressRange");
    return cu.init && cu.dev_get && cu.retain && cu.set_cur && cu.alloc && cu.free_ && cu.memcpy_ && cu.export_ &&
           cu.init(0) == 0 && cu.dev_get(&dev, 0) == 0 && cu.retain(&ctx, dev) == 0 && cu.set_cur(ctx) == 0;
}

struct local { struct side a, b; unsigned char *src; int si; };   /* a writes into b's memory */

/* Two sides of device @dev (-1: the one E2E_DEVICE names) connected to each other. */
static int local_open(struct local *l, int dev)
{
    if (side_open_dev(&l->a, dev) || side_open_dev(&l->b, dev))
        return -1;
    l->a.peer = l->b.me;
    l->b.peer = l->a.me;
    if (side_connect(&l->a) || side_connect(&l->b) || !(l->src = map(16 * PAGE)) ||
        (l->si = reg(&l->a, l->src, 16 * PAGE)) < 0)
        return -1;
    return 0;
}

static void local_close(struct local *l)
{
    side_close(&l->a);
    side_close(&l->b);
    munmap(l->src, 16 * PAGE);
}

static int setup_local(void **state)
{
    struct local *l = calloc(1, sizeof(*l));

    if (!l || local_open(l, -1))
        return -1;
    *state = l;
    return 0;
}

static int teardown_local(void **state)
{
    struct local *l = *state;

    local_close(l);
    free(l);
    return 0;
}

/* Two NICs (devices 0 and 1), a local pair on each; NULL state if there is one device only. */
static int setup_two_nics(void **state)
{
    struct local *l = calloc(2, sizeof(*l));
    struct ibv_device **devs;
    int n = 0;

    devs = ibv_get_device_list(&n);
    if (devs)
        ibv_free_device_list(devs);
    if (!l)
        return -1;
    *state = NULL;
    if (n < 2) {
        free(l);
        return 0;
    }
    if (local_open(&l[0], 0) || local_open(&l[1], 1))
        return -1;
    *state = l;
    return 0;
}

static int teardown_two_nics(void **state)
{
    struct local *l = *state;

    if (l) {
        local_close(&l[0]);
        local_close(&l[1]);
        free(l);
    }
    return 0;
}

/* E2E_REQUIRE_GPU (make test's wrappers, which bring the CUDA double): no driver is a failure. */
#define NEED_GPU()                                                              \
    do {                                                                        \
        if (!cuda_up()) {                                                       \
            fprintf(stderr, "skipped: no CUDA driver (libcuda.so.1)\n");        \
            if (getenv("E2E_REQUIRE_GPU"))                                      \
                fail_msg("E2E_REQUIRE_GPU: the CUDA driver did not load");      \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* WRITE n bytes of pattern seed from a's source to b's dst through rkey; the status. */
static int local_write(struct local *l, uint64_t dst, size_t n, uint32_t rkey, unsigned seed)
{
    fill(l->src, n, seed);
    return post(&l->a, 1, l->src, l->a.reg[l->si].mr->lkey, n, dst, rkey);
}

/* Pages of GPU memory at d whose bytes differ from page pattern 100 + k (want[k] = -1), or from
 * pattern want[k] at [off, off + n) of page k. */
static int gpu_pages_as(uint64_t d, int np, const int *want, size_t off, size_t n)
{
    unsigned char *h = malloc((size_t)np * PAGE);
    int bad = 0;

    assert_non_null(h);
    assert_int_equal(cu.memcpy_((uintptr_t)h, d, (size_t)np * PAGE), 0);
    for (int k = 0; k < np; k++) {
        unsigned char *p = h + (size_t)k * PAGE;
        if (want[k] < 0)
            bad += bad_bytes(p, PAGE, 100u + (unsigned)k) != 0;
        else
            bad += bad_bytes(p, off, 100u + (unsigned)k) != 0 || bad_bytes(p + off, n, (unsigned)want[k]) != 0;
    }
    free(h);
    return bad;
}

static void gpu_background(uint64_t d, int np)
{
    unsigned char *h = malloc((size_t)np * PAGE);

    assert_non_null(h);
    for (int k = 0; k < np; k++)
        fill(h + (size_t)k * PAGE, PAGE, 100u + (unsigned)k);
    assert_int_equal(cu.memcpy_(d, (uintptr_t)h, (size_t)np * PAGE), 0);
    free(h);
}

/* Coalesced and interior registrations of GPU memory (dmabuf: drc exports, the NIC registers
 * the fd at iova = address with the offset drc computed): a WRITE into each sub-buffer lands
 * there and nowhere else. UCX issue 11417 was a wrong offset that sent writes to neighbours. */
static void test_coalesced_gpu_subbuffers(void **state)
{
    struct local *l = *state;
    enum { NP = 8 };
    unsigned long long d;
    int want[NP], a, b, sub;

    NEED_GPU();
    assert_int_equal(cu.alloc(&d, 1 << 20), 0);
    gpu_background(d, NP);
    for (int k = 0; k < NP; k++)
        want[k] = -1;
    sub = reg(&l->b, (void *)(uintptr_t)(d + 5 * PAGE + 100), 1000);   /* the first: interior */
    assert_true(sub >= 0);
    assert_int_equal(local_write(l, d + 5 * PAGE + 100, 1000, l->b.reg[sub].mr->rkey, 300), IBV_WC_SUCCESS);
    want[5] = 300;
    assert_int_equal(gpu_pages_as(d, NP, want, 100, 1000), 0);
    assert_int_equal(unreg(&l->b, sub), 0);
    gpu_background(d, NP);
    want[5] = -1;
    a = reg(&l->b, (void *)(uintptr_t)d, 3 * PAGE);
    b = reg(&l->b, (void *)(uintptr_t)(d + 2 * PAGE), 6 * PAGE);
    assert_true(a >= 0 && b >= 0);
    for (int k = 0; k < NP; k++) {
        uint64_t page = d + (uint64_t)k * PAGE;
        sub = reg(&l->b, (void *)(uintptr_t)(page + 100), 1000);
        assert_true(sub >= 0);
        assert_int_equal(l->b.reg[sub].mr->rkey, l->b.reg[b].mr->rkey);  /* the coalesced MR */
        assert_int_equal(local_write(l, page + 100, 1000, l->b.reg[sub].mr->rkey, 400u + (unsigned)k), IBV_WC_SUCCESS);
        want[k] = 400 + k;
        assert_int_equal(gpu_pages_as(d, NP, want, 100, 1000), 0);
        want[k] = -1;
        gpu_background(d, NP);
        assert_int_equal(unreg(&l->b, sub), 0);
    }
    assert_int_equal(unreg(&l->b, a), 0);
    assert_int_equal(unreg(&l->b, b), 0);
#ifdef E2E_API
    assert_true(drc_notify_free((void *)(uintptr_t)d, 1 << 20) >= 1);
#endif
    assert_int_equal(cu.free_(d), 0);
}

/* The control: a dmabuf registration with a wrong offset (0 for an interior iova) sends the
 * write to the start of the export, and the neighbour check sees it. */
static void test_control_wrong_dmabuf_offset_is_caught(void **state)
{
    struct local *l = *state;
    enum { NP = 8 };
    unsigned long long d;
    struct ibv_mr *mr;
    int want[NP], fd = -1;

    NEED_GPU();
    if (ln_counters && !dlsym(cu.h, "fakecu_dmabuf_base")) {
        /* loopnic with the real driver takes a dmabuf's memory to be at iova: only a NIC (or the
         * CUDA double) moves the bytes the offset names */
        fprintf(stderr, "skipped: loopnic cannot see dmabuf offsets with the real CUDA driver\n");
        skip();
    }
    assert_int_equal(cu.alloc(&d, 1 << 20), 0);
    gpu_background(d, NP);
    for (int k = 0; k < NP; k++)
        want[k] = -1;
    assert_int_equal(cu.export_(&fd, d, NP * PAGE, 1, 0), 0);
    mr = ibv_reg_dmabuf_mr(l->b.pd, 0 /* should be 5 * PAGE */, PAGE, d + 5 * PAGE, fd, ACC);
    assert_non_null(mr);
    assert_int_equal(local_write(l, d + 5 * PAGE, PAGE, mr->rkey, 500), IBV_WC_SUCCESS);
    want[5] = 500;
    assert_true(gpu_pages_as(d, NP, want, 0, PAGE) > 0);   /* page 5 missed, page 0 overwritten */
    assert_int_equal(ibv_dereg_mr(mr), 0);
    close(fd);
    assert_int_equal(cu.free_(d), 0);
}

/* A failed dmabuf registration: drc returns the error, closes its export, leaves no MR. */
static void test_failed_dmabuf_registration_leaks_nothing(void **state)
{
    struct local *l = *state;
    unsigned long long d;
    loopnic_fail_fn *fail_dmabuf = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_dmabuf_reg");
    struct loopnic_counters c0;
    int fds0, rc, i;

    NEED_LOOPNIC();
    NEED_GPU();
    assert_non_null(fail_dmabuf);
    assert_int_equal(cu.alloc(&d, 1 << 20), 0);
    i = reg(&l->b, (void *)(uintptr_t)d, 4 * PAGE);   /* the first also probes the NIC's dmabuf support */
    assert_true(i >= 0);
    c0 = counters();
    fds0 = count_fds();
    fail_dmabuf(1, EIO);
    rc = reg(&l->b, (void *)(uintptr_t)(d + 64 * PAGE), 4 * PAGE);
    assert_int_equal(rc, -EIO);
    assert_int_equal(counters().live_mrs, c0.live_mrs);
    assert_int_equal(counters().dmabuf_regs, c0.dmabuf_regs);
    assert_int_equal(count_fds(), fds0);
    assert_int_equal(unreg(&l->b, i), 0);
    i = reg(&l->b, (void *)(uintptr_t)(d + 64 * PAGE), 4 * PAGE);   /* the next one works */
    assert_true(i >= 0);
    assert_int_equal(counters().dmabuf_regs, c0.dmabuf_regs + 1);
    assert_int_equal(local_write(l, d + 64 * PAGE, 4 * PAGE, l->b.reg[i].mr->rkey, 600), IBV_WC_SUCCESS);
    assert_int_equal(unreg(&l->b, i), 0);
#ifdef E2E_API
    assert_true(drc_notify_free((void *)(uintptr_t)d, 1 << 20) >= 1);
#endif
    assert_int_equal(cu.free_(d), 0);
}

/*
 * Two NICs, one buffer (host memory, or GPU memory through dmabuf) registered on each: each MR is
 * of its own NIC's PD, and a WRITE through each NIC lands. The control: one NIC's rkey on the
 * other NIC is refused (loopnic only: a real NIC's key numbers are its own business), so the
 * check would see a registration handed to the wrong NIC.
 */
static void two_nics(struct local *l, uint64_t d, int gpu)
{
    enum { LEN = 4 * PAGE };
    unsigned char *h = malloc(LEN);
    int i[2];

    assert_non_null(h);
    for (int k = 0; k < 2; k++) {
        i[k] = reg(&l[k].b, (void *)(uintptr_t)d, LEN);
        assert_true(i[k] >= 0);
        assert_ptr_equal(l[k].b.reg[i[k]].mr->pd, l[k].b.pd);
        assert_ptr_equal(l[k].b.reg[i[k]].mr->context, l[k].b.ctx);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(local_write(&l[k], d, LEN, l[k].b.reg[i[k]].mr->rkey, 700u + (unsigned)k), IBV_WC_SUCCESS);
        if (gpu)
            assert_int_equal(cu.memcpy_((uintptr_t)h, d, LEN), 0);
        else
            memcpy(h, (void *)(uintptr_t)d, LEN);
        assert_int_equal(bad_bytes(h, LEN, 700u + (unsigned)k), 0);
    }
    if (ln_counters) {
        assert_int_equal(local_write(&l[1], d, LEN, l[0].b.reg[i[0]].mr->rkey, 710), IBV_WC_REM_ACCESS_ERR);
        if (gpu)
            assert_int_equal(cu.memcpy_((uintptr_t)h, d, LEN), 0);
        else
            memcpy(h, (void *)(uintptr_t)d, LEN);
        assert_int_equal(bad_bytes(h, LEN, 701), 0);    /* nothing landed */
    }
    for (int k = 0; k < 2; k++)
        assert_int_equal(unreg(&l[k].b, i[k]), 0);
    free(h);
}

#define NEED_TWO_NICS(l)                                                        \
    do {                                                                        \
        if (!(l)) {                                                             \
            fprintf(stderr, "skipped: one RDMA device (tests/nics covers many NICs)\n"); \
            skip();                                                             \
        }                                                                       \
    } while (0)

static void test_two_nics_host_memory(void **state)
{
    enum { LEN = 4 * PAGE };
    void *p;

    NEED_TWO_NICS(*state);
    p = map(LEN);
    assert_non_null(p);
    two_nics(*state, (uintptr_t)p, 0);
    munmap(p, LEN);
}

static void test_two_nics_gpu_memory(void **state)
{
    unsigned long long d;

    NEED_TWO_NICS(*state);
    NEED_GPU();
    assert_int_equal(cu.alloc(&d, 1 << 20), 0);
    two_nics(*state, d, 1);
#ifdef E2E_API
    assert_true(drc_notify_free((void *)(uintptr_t)d, 1 << 20) >= 1);
#endif
    assert_int_equal(cu.free_(d), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_patterns_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hazard_with_drc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hazard_control_without_invalidation, setup_control, teardown),
        cmocka_unit_test_setup_teardown(test_held_mr_revoked_by_free, setup_revoke, teardown),
        cmocka_unit_test_setup_teardown(test_held_mr_control_without_revoke, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coalesced_host_subbuffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remap_fixed_with_drc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remap_fixed_control_without_invalidation, setup_control, teardown),
        cmocka_unit_test_setup_teardown(test_misspelt_preload_keeps_protection, setup_misspelt, teardown),
        cmocka_unit_test_setup_teardown(test_rkey_scope_local_only_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_child_leaves_parent_mr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_control_child_release_reaches_nic, setup_no_drc, teardown),
        cmocka_unit_test_setup_teardown(test_failures_leak_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coalesced_gpu_subbuffers, setup_local, teardown_local),
        cmocka_unit_test_setup_teardown(test_control_wrong_dmabuf_offset_is_caught, setup_local, teardown_local),
        cmocka_unit_test_setup_teardown(test_failed_dmabuf_registration_leaks_nothing, setup_local, teardown_local),
        cmocka_unit_test_setup_teardown(test_two_nics_host_memory, setup_two_nics, teardown_two_nics),
        cmocka_unit_test_setup_teardown(test_two_nics_gpu_memory, setup_two_nics, teardown_two_nics),
    };
    const char *mode = getenv("E2E_MODE");    /* the wrapper's name for the matrix's column */
    char group[64];
    char reg_path[64];
    int n = 0, rc;
    struct ibv_device **devs;

    ln_counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    ln_fail_reg = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_reg");
    ln_fail_wr = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_wr");
    if (argc == 4 && !strcmp(argv[1], "--target"))
        return run_target(atoi(argv[2]), atoi(argv[3]));
    if (ln_counters && getenv("E2E_REQUIRE_HW")) {
        fprintf(stderr, "e2e: libibverbs.so.1 is the loopback provider (LD_LIBRARY_PATH?), not the real one\n");
        return 1;
    }
    /* loopnic: a shared table, so that the target's rkeys and QP numbers resolve here */
    if (ln_counters && !getenv("LOOPNIC_REGISTRY")) {
        snprintf(reg_path, sizeof(reg_path), "/dev/shm/drc-e2e-%d", (int)getpid());
        setenv("LOOPNIC_REGISTRY", reg_path, 1);
    } else {
        reg_path[0] = 0;
    }
    devs = ibv_get_device_list(&n);
    if (!devs || n == 0) {
        printf("e2e: no RDMA device: skipped\n");
        return 77;
    }
    ibv_free_device_list(devs);
    if (argc == 2 && !strcmp(argv[1], "--probe")) {   /* test_hw.sh: is there a device? */
        printf("e2e: %d RDMA device(s)\n", n);
        return 0;
    }
#ifdef E2E_API
    snprintf(group, sizeof(group), "e2e_api%s%s", mode ? " " : "", mode ? mode : "");
#else
    if (!dlsym(RTLD_DEFAULT, "drc_notify_free"))
        fprintf(stderr, "e2e_engine: drc is not preloaded: the control and the coalescing checks will fail\n");
    snprintf(group, sizeof(group), "e2e_engine%s%s", mode ? " " : "", mode ? mode : "");
#endif
    fprintf(stderr, "%s\n", group);      /* which column of the matrix failed */
    rc = cmocka_run_group_tests_name(group, tests, NULL, NULL);
    if (reg_path[0])
        unlink(reg_path);
    return rc;
}
