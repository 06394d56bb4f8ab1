/*
 * Fuzz target for src/core/cache.c: the cache against a model, one thread.
 *
 * The input first picks a configuration (limits, DRC_F_NO_MERGE, DRC_F_REVOKE, DRC_F_ACCESS_SUPERSET,
 * a backend size limit), then becomes a program of get / put / invalidate / failing
 * registrations / registrations raced by an invalidation / re-creation, on
 * 16 fake pages (the cache never touches the memory; the backend below is a
 * recording double that registers nothing). After every step:
 *   - a returned region contains the request and has exactly its access bits
 *     (with DRC_F_ACCESS_SUPERSET, bit 6 of the configuration: at least them,
 *     the remote bits exactly if any is asked: an rkey grants only what was asked), its
 *     handle is a live registration whose arguments are its bounds, and it
 *     was not registered before an invalidation of a range it overlaps;
 *   - refcounts balance: stats.in_use is the number of distinct regions the
 *     model holds, a put of a region not held fails and changes nothing;
 *   - drc_region_valid() of every held region is what the model expects,
 *     drc_invalidate() returns how many valid regions overlapped its range,
 *     and drc_region_invalidate() of a held region 1 if it was valid;
 *   - over a limit, no idle region is left in the tree;
 *   - DRC_F_REVOKE: no invalidated registration is left on the backend, held
 *     or not (a held one reads a NULL handle); without it, a held one is;
 * and at the end (and at every re-creation), with everything put, destroy
 * succeeds and every handle was deregistered exactly once.
 *
 * With bit 5 of the configuration byte the program runs as four threads in
 * turn (threads mode): each step's op byte names the thread slot it runs
 * in (tslot.h: 0, 1, 63, or the shared 64, whose references bit 63 of
 * refmask covers together), so that once two of them hit the cache, hits
 * count their references in thread slots ("Thread references" in cache.c),
 * puts take them from their own slot, the word or another thread's, and
 * every release drains. One real thread: the interleavings inside a get or
 * a put are the thread tests' (tests/core/test_cache_mt.c, under TSan);
 * here it is the counting, with every check above, and a burst op that
 * takes one region more times than a slot counts (REF_N), invalidates it
 * or not, and puts it back from all four threads.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core/cache.h"
#include "core/tslot.h"
#include "fuzz.h"

enum { PAGES = 16, MAX_HANDLES = 1 << 14, MAX_HOLDS = 32 };

#define BASE ((uintptr_t)1 << 30)

struct handle {
    uintptr_t start;
    size_t len;
    unsigned access;
    int deregs;
    int live;
    int valid;          /* model: no invalidation overlapped it since it was registered */
    int in_flight;      /* inside reg(): an invalidation now makes it stale, it is not counted */
};

struct backend {
    struct handle h[MAX_HANDLES];
    unsigned long n;
    int fail;           /* next reg fails with this */
    drc_cache_t *c;
    int raced;          /* next reg invalidates [race_s, race_s + race_len) */
    uintptr_t race_s;
    size_t race_len;
    int race_result;
    unsigned long regs_in_get;
};

static struct backend B;
static size_t page;

/* The model's invalidation: every live registration overlapping the range is no longer valid. */
static int model_invalidate(uintptr_t s, size_t len)
{
    unsigned long i;
    int count = 0;

    for (i = 0; i < B.n; i++) {
        struct handle *h = &B.h[i];

        if (!h->live || s + len <= h->start || h->start + h->len <= s)
            continue;
        if (h->valid && !h->in_flight)
            count++;
        h->valid = 0;
    }
    return count;
}

static int be_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct handle *h;
    int err;

    (void)ctx;
    B.regs_in_get++;
    FUZZ_ASSERT(a->start % page == 0 && a->len % page == 0 && a->len > 0);
    FUZZ_ASSERT(a->type == DRC_MEM_HOST && a->device == -1 && a->dmabuf_fd == -1);
    if (B.fail) {
        err = B.fail;
        B.fail = 0;
        return err;
    }
    FUZZ_ASSERT(B.n < MAX_HANDLES);
    h = &B.h[B.n++];
    *h = (struct handle){ .start = a->start, .len = a->len, .access = a->access, .live = 1, .valid = 1,
                          .in_flight = 1 };
    if (B.raced) {
        /* the memory is freed while the backend registers it */
        int want = model_invalidate(B.race_s, B.race_len);   /* before: idle ones are deregistered inside */

        B.raced = 0;
        B.race_result = drc_invalidate(B.c, (const void *)B.race_s, B.race_len);
        FUZZ_ASSERT(B.race_result == want);
    }
    h->in_flight = 0;
    *handle = (void *)(uintptr_t)B.n;       /* id = index + 1 */
    *lkey = (uint32_t)B.n;
    *rkey = (uint32_t)~B.n;
    return 0;
}

static int be_dereg(void *ctx, void *handle)
{
    unsigned long id = (unsigned long)(uintptr_t)handle;

    (void)ctx;
    FUZZ_ASSERT(id >= 1 && id <= B.n);
    FUZZ_ASSERT(B.h[id - 1].live);
    B.h[id - 1].live = 0;
    B.h[id - 1].deregs++;
    return 0;
}

static struct handle *handle_of(const drc_region_t *r)
{
    unsigned long id = drc_region_lkey(r);     /* lkey = id; the handle reads NULL once revoked */

    FUZZ_ASSERT(id >= 1 && id <= B.n);
    return &B.h[id - 1];
}

struct hold {
    drc_region_t *r;
    unsigned long id;
};

struct state {
    drc_cache_t *c;
    struct drc_config cfg;
    size_t max_len;
    int threads;        /* threads mode: steps run in four thread slots */
    struct hold holds[MAX_HOLDS];
    int nholds;
};

static size_t distinct_held(const struct state *st)
{
    size_t n = 0;
    int i, j;

    for (i = 0; i < st->nholds; i++) {
        for (j = 0; j < i; j++)
            if (st->holds[j].r == st->holds[i].r)
                break;
        n += j == i;
    }
    return n;
}

static void check_invariants(struct state *st)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    unsigned long i, live = 0;
    int k;

    drc_cache_stats(st->c, &s);
    FUZZ_ASSERT(s.in_use == distinct_held(st));
    for (i = 0; i < B.n; i++)
        live += B.h[i].live;
    FUZZ_ASSERT(s.regs - s.deregs == live);
    FUZZ_ASSERT(s.regions <= live);
    for (k = 0; k < st->nholds; k++) {
        struct handle *h = handle_of(st->holds[k].r);

        if (st->cfg.flags & DRC_F_REVOKE) {
            FUZZ_ASSERT(h->live == h->valid);  /* revoked by its invalidation, held or not */
            FUZZ_ASSERT(!drc_region_handle(st->holds[k].r) == !h->valid);
        } else {
            FUZZ_ASSERT(h->live);   /* never deregistered while held */
        }
        FUZZ_ASSERT(drc_region_valid(st->holds[k].r) == h->valid);
    }
    if (st->cfg.flags & DRC_F_REVOKE)
        for (i = 0; i < B.n; i++)
            FUZZ_ASSERT(B.h[i].valid || !B.h[i].live);
    /* over a limit every region left in the tree is in use */
    if ((st->cfg.max_regions && s.regions > st->cfg.max_regions) ||
        (st->cfg.max_bytes && s.bytes > st->cfg.max_bytes))
        FUZZ_ASSERT(s.regions <= s.in_use);
}

static void create(struct state *st, struct fuzz_in *in)
{
    struct drc_backend be = { .reg = be_reg, .dereg = be_dereg, .ctx = &B };
    struct drc__cache_opts o = { 0 };
    uint8_t f = fuzz_u8(in);

    memset(&st->cfg, 0, sizeof(st->cfg));
    st->cfg.max_regions = f & 1 ? fuzz_range(in, 1, 4) : 0;
    st->cfg.max_bytes = f & 2 ? fuzz_range(in, 1, 8) * page : 0;
    st->cfg.flags = (f & 4 ? DRC_F_NO_MERGE : 0) | (f & 16 ? DRC_F_REVOKE : 0) | (f & 64 ? DRC_F_ACCESS_SUPERSET : 0);
    st->max_len = f & 8 ? fuzz_range(in, 1, 6) * page : 0;
    st->threads = !!(f & 32);
    o.max_len = st->max_len;
    FUZZ_ASSERT(drc__cache_create(&be, &st->cfg, &o, &st->c) == 0);
    B.c = st->c;
}

/* Put everything, destroy, and check every handle was deregistered exactly once. */
static void finish(struct state *st)
{
    unsigned long i;

    if (st->nholds)
        FUZZ_ASSERT(drc_cache_destroy(st->c) == -EBUSY);
    while (st->nholds > 0) {
        st->nholds--;
        FUZZ_ASSERT(drc_put(st->c, st->holds[st->nholds].r) == 0);
    }
    FUZZ_ASSERT(drc_cache_destroy(st->c) == 0);
    st->c = NULL;
    for (i = 0; i < B.n; i++) {
        FUZZ_ASSERT(!B.h[i].live);
        FUZZ_ASSERT(B.h[i].deregs == 1);
    }
    B.n = 0;
}

/* Threads mode: the next step runs as thread slot 0, 1, 63 or 64 (shared), picked by @b. */
static void as_thread(const struct state *st, unsigned b)
{
    static const int slots[] = { 0, 1, 63, DRC__TSLOTS };

    if (st->threads)
        drc__my_tslot = slots[b % 4];
}

static void op_get(struct state *st, struct fuzz_in *in, int fail, int race)
{
    static const unsigned acc[] = { 0, 1, 2, 4, 1 | 2, 1 | 4, 8, DRC_ACCESS_MASK };
    uintptr_t a = BASE + fuzz_range(in, 0, PAGES * page - 1);
    size_t len = 1 + fuzz_range(in, 0, 4 * page);
    unsigned access = acc[fuzz_u8(in) % 8];
    uintptr_t first = a & ~(uintptr_t)(page - 1), end = (a + len + page - 1) & ~(uintptr_t)(page - 1);
    struct drc_stats before = { .comp_mask = DRC_STATS_ALL }, after = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *r = NULL;
    struct handle *h;
    uintptr_t rs;
    size_t rl;
    int err, want_err = 0;

    if (st->nholds == MAX_HOLDS)
        return;
    if (fail)
        B.fail = want_err = -(int)fuzz_range(in, 1, 120);
    if (race) {
        B.raced = 1;
        B.race_s = BASE + fuzz_range(in, 0, PAGES) * page;
        B.race_len = fuzz_range(in, 1, 4) * page;
    }
    drc_cache_stats(st->c, &before);
    B.regs_in_get = 0;
    err = drc_get(st->c, (const void *)a, len, access, &r);
    drc_cache_stats(st->c, &after);
    if (st->max_len && end - first > st->max_len)
        FUZZ_ASSERT(err == -E2BIG && B.regs_in_get == 0);
    if (fail && B.regs_in_get)
        FUZZ_ASSERT(err == want_err);   /* the backend's first reg failed: its errno, no retry */
    B.fail = 0;
    B.raced = 0;
    if (err) {
        /* nothing cached, nothing leaked (check_invariants counts live handles) */
        FUZZ_ASSERT(after.regions <= before.regions && after.hits == before.hits);
        FUZZ_ASSERT(err == -E2BIG || (fail && err == want_err));
        return;
    }
    h = handle_of(r);
    drc_region_bounds(r, &rs, &rl);
    FUZZ_ASSERT(rs <= a && a + len <= rs + rl);
    FUZZ_ASSERT((drc_region_access(r) & access) == access);
    FUZZ_ASSERT((st->cfg.flags & DRC_F_ACCESS_SUPERSET) || drc_region_access(r) == access);
    FUZZ_ASSERT(!(access & DRC_ACCESS_REMOTE) ||
                (drc_region_access(r) & DRC_ACCESS_REMOTE) == (access & DRC_ACCESS_REMOTE));
    FUZZ_ASSERT(h->live && h->valid);
    FUZZ_ASSERT(h->start == rs && h->len == rl && h->access == drc_region_access(r));
    FUZZ_ASSERT(drc_region_valid(r) == 1);
    FUZZ_ASSERT(drc_region_lkey(r) == (uint32_t)(uintptr_t)drc_region_handle(r));
    if (B.regs_in_get == 0) {
        FUZZ_ASSERT(after.hits == before.hits + 1 && after.misses == before.misses);
    } else {
        FUZZ_ASSERT(after.hits == before.hits);
        FUZZ_ASSERT(after.misses >= before.misses + 1);
        /* a new registration covers its request's page range */
        FUZZ_ASSERT(rs <= first && first + (end - first) <= rs + rl);
        if (st->cfg.flags & DRC_F_NO_MERGE)
            FUZZ_ASSERT(rs == first && rl == end - first);
    }
    st->holds[st->nholds++] = (struct hold){ r, (unsigned long)(uintptr_t)drc_region_handle(r) };
}

static void op_put(struct state *st, struct fuzz_in *in)
{
    int k, i, still;
    drc_region_t *r;

    if (!st->nholds)
        return;
    k = (int)fuzz_range(in, 0, (uint64_t)st->nholds - 1);
    r = st->holds[k].r;
    st->holds[k] = st->holds[--st->nholds];
    FUZZ_ASSERT(drc_put(st->c, r) == 0);
    for (still = 0, i = 0; i < st->nholds; i++)
        still |= st->holds[i].r == r;
    /*
     * One put too many, or an invalidation by handle of a region nobody
     * holds, while its registration is known to be this region's and idle
     * in the cache (in threads mode, possibly from another thread than took
     * the references): refused, and nothing changes.
     */
    if (!still && handle_of(r)->live && (k = fuzz_u8(in)) & 1) {
        struct drc_stats a = { .comp_mask = DRC_STATS_ALL }, b = { .comp_mask = DRC_STATS_ALL };

        as_thread(st, (unsigned)k >> 2);
        drc_cache_stats(st->c, &a);
        if (k & 2)
            FUZZ_ASSERT(drc_region_invalidate(st->c, r) == -EINVAL);
        else
            FUZZ_ASSERT(drc_put(st->c, r) == -EINVAL);
        drc_cache_stats(st->c, &b);
        FUZZ_ASSERT(memcmp(&a, &b, sizeof(a)) == 0);
        FUZZ_ASSERT(drc_region_valid(r) == 1 && handle_of(r)->live);
    }
}

static void op_invalidate(struct state *st, struct fuzz_in *in)
{
    uintptr_t s = BASE - page + fuzz_range(in, 0, (PAGES + 2) * page);
    size_t len = fuzz_range(in, 0, 6 * page);
    int want = len ? model_invalidate(s, len) : 0;

    FUZZ_ASSERT(drc_invalidate(st->c, (const void *)s, len) == want);
}

/* drc_region_invalidate of a held region: it and only it becomes invalid; 1 if it was valid. */
static void op_invalidate_handle(struct state *st, struct fuzz_in *in)
{
    struct handle *h;
    drc_region_t *r;
    int k, want;

    if (!st->nholds)
        return;
    k = (int)fuzz_range(in, 0, (uint64_t)st->nholds - 1);
    r = st->holds[k].r;
    h = handle_of(r);
    want = h->valid;
    h->valid = 0;
    FUZZ_ASSERT(drc_region_invalidate(st->c, r) == want);
    FUZZ_ASSERT(drc_region_valid(r) == 0);
    /* held: deregistered on its last put, not now; or now, revoked */
    FUZZ_ASSERT(h->live == !(st->cfg.flags & DRC_F_REVOKE));
}

/*
 * Threads mode: one thread takes one range BURST times (more than a slot's
 * REF_N), all the same region; maybe it is invalidated, by range or by
 * handle; then the four threads put the references back in turn. The
 * registration lives until the last put if it was invalidated (unless
 * DRC_F_REVOKE), and is deregistered by that put; in_use counts the region
 * until then.
 */
static void op_burst(struct state *st, struct fuzz_in *in)
{
    enum { BURST = 70 };
    uintptr_t a = BASE + fuzz_range(in, 0, PAGES * page - 1);
    size_t len = 1 + fuzz_range(in, 0, 2 * page);
    unsigned how = fuzz_u8(in), who = fuzz_u8(in);
    drc_region_t *r = NULL, *q;
    struct handle *h;
    int i, k, others;

    as_thread(st, who);
    for (i = 0; i < BURST; i++) {
        if (drc_get(st->c, (const void *)a, len, 0, &q) != 0) {
            FUZZ_ASSERT(i == 0 && st->max_len);    /* -E2BIG: larger than the backend takes */
            return;
        }
        FUZZ_ASSERT(!r || q == r);
        r = q;
    }
    h = handle_of(r);
    for (others = 0, k = 0; k < st->nholds; k++)
        others |= st->holds[k].r == r;
    if (how % 3 == 1) {
        uintptr_t rs;
        size_t rl;
        int want;

        drc_region_bounds(r, &rs, &rl);
        want = model_invalidate(rs, rl);    /* first: the idle ones are deregistered inside drc's */
        FUZZ_ASSERT(drc_invalidate(st->c, (const void *)rs, rl) == want);
    } else if (how % 3 == 2) {
        FUZZ_ASSERT(drc_region_invalidate(st->c, r) == h->valid);
        h->valid = 0;
    }
    for (i = BURST; i > 0; i--) {
        struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

        drc_cache_stats(st->c, &s);
        FUZZ_ASSERT(s.in_use == distinct_held(st) + !others);
        FUZZ_ASSERT(h->live == (h->valid || !(st->cfg.flags & DRC_F_REVOKE)));
        FUZZ_ASSERT(drc_region_valid(r) == h->valid);
        as_thread(st, who + (unsigned)i);
        FUZZ_ASSERT(drc_put(st->c, r) == 0);
    }
    if (!h->valid && !others)
        FUZZ_ASSERT(!h->live && h->deregs == 1);    /* released by the last put */
    if (!others && h->live && how & 8) {
        struct drc_stats x = { .comp_mask = DRC_STATS_ALL }, y = { .comp_mask = DRC_STATS_ALL };

        drc_cache_stats(st->c, &x);
        FUZZ_ASSERT(drc_put(st->c, r) == -EINVAL);   /* one too many, from any thread */
        drc_cache_stats(st->c, &y);
        FUZZ_ASSERT(memcmp(&x, &y, sizeof(x)) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    static struct state st;
    int steps = 0, me = drc__tslot();
    uint8_t op;

    page = (size_t)sysconf(_SC_PAGESIZE);
    memset(&st, 0, sizeof(st));
    B.n = 0;            /* B.h[i] is filled by each reg */
    B.fail = 0;
    B.raced = 0;
    create(&st, &in);
    while (fuzz_more(&in) && steps++ < 2048) {
        op = fuzz_u8(&in);
        as_thread(&st, op >> 3);
        switch (op % 8) {
        case 0:
        case 1:
            op_get(&st, &in, 0, 0);
            break;
        case 2:
            op_put(&st, &in);
            break;
        case 3:
            op_invalidate(&st, &in);
            break;
        case 4:
            op_get(&st, &in, 1, 0);     /* the backend fails */
            break;
        case 5:
            op_get(&st, &in, 0, 1);     /* an invalidation inside reg() */
            break;
        case 6:
            if (fuzz_u8(&in) % 4 == 0)
                op_invalidate_handle(&st, &in);
            else
                op_put(&st, &in);
            break;
        case 7:
            op = fuzz_u8(&in);
            if (op % 8 == 0) {
                finish(&st);            /* a new cache with a new configuration */
                create(&st, &in);
            } else if (op % 8 == 1 && st.threads) {
                op_burst(&st, &in);
            } else {
                op_get(&st, &in, 0, 0);
            }
            break;
        }
        check_invariants(&st);
    }
    finish(&st);
    drc__my_tslot = me;
    return 0;
}
