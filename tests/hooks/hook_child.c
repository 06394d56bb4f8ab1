/*
 * The program the preload test (tests/preload/test_hook_preload.c) runs, with and
 * without LD_PRELOAD=build/libdrc_hook.so, against the fake libcuda.so.1 of
 * tests/doubles/fake_libcuda.c (THE CUDA double: no GPU in CI).
 *
 * Usage: hook_child MODE. It allocates fake device memory, registers two
 * regions of it in a drc cache (one held, one idle), frees the allocation
 * the way MODE says, and at the moment the fake driver frees it checks what
 * drc did. Prints one line, "MODE: notified" or "MODE: NOT notified", and
 * exits 0 when drc was told before the free, 2 when not, 1 on a setup error.
 *
 * MODE: direct    call cuMemFree_v2 (linked)
 *       gpa       ask the linked cuGetProcAddress_v2 for "cuMemFree", call that
 *       runtime   as the CUDA runtime: dlopen libcuda, dlsym cuGetProcAddress_v2,
 *                 ask it for "cuGetProcAddress", ask that for "cuMemFree" (3020)
 *       runtime-async  the same for "cuMemFreeAsync" (11020, per-thread stream)
 *       dlsym     dlsym(libcuda, "cuMemFree_v2")
 *       unmap     dlsym(libcuda, "cuMemUnmap") on the whole allocation
 *       wrapper   drc_cuMemFree (no preload needed)
 *       rtld-next check that dlsym(RTLD_NEXT) still means "after the caller"
 *       rtld-default  a library loaded RTLD_LOCAL finds its own dependency's symbol with
 *                 dlsym/dlvsym(RTLD_DEFAULT) (librtld_user.so beside this program)
 *       nocache   free through every path with no cache created: all succeed
 *       noctx     64 MiB, regions at +32 MiB, freed as "runtime" from a thread with no
 *                 current context (cuMemGetAddressRange then fails with 201)
 *       noctx-wrapper  the same through drc_cuMemFree
 *       freehost  pinned host memory (cuMemAllocHost), freed through cuGetProcAddress's cuMemFreeHost
 *       unregister  the same with cuMemHostUnregister
 *       ipcclose  cuIpcCloseMemHandle (through cuGetProcAddress) of the memory, taken as imported
 *       release   two cuDevicePrimaryCtxRetain, then two cuDevicePrimaryCtxRelease: the last frees it
 *       reset     no free at all: cuDevicePrimaryCtxReset (through cuGetProcAddress) frees it
 *       destroy   the same with cuCtxDestroy
 *       ibv-dlsym dlopen libibverbs.so.1 RTLD_LOCAL, dlsym/dlvsym "ibv_dereg_mr" on that handle:
 *                 prints whose definition it got; exits 0 when drc's (the preload's), 2 when not
 *
 * Host memory (the preload's host part, preload_host.c): 4 pages registered as
 * a held region on page 1 and an idle one on page 2, then new pages put over
 * them by one libc call without munmap. Prints "MODE: invalidated" (the held
 * region invalid, the idle one deregistered, and the next registration of
 * page 2 a miss) or "MODE: kept" (all three as before); exits 0 when that is
 * what MODE must give, 2 when not.
 *       host-mmap       mmap(MAP_FIXED) over the 4 pages: invalidated
 *       host-mmap64     the same through mmap64
 *       host-noreplace  mmap(MAP_FIXED_NOREPLACE) over them fails with EEXIST: kept
 *       host-shmat      shmat(SHM_REMAP) of a 4-page segment at their address: invalidated
 *       host-mremap     mremap(MREMAP_FIXED) of another mapping onto them: invalidated
 *       host-remap-file the 4 pages are a shared file mapping; remap_file_pages of pages 1-2: invalidated
 *       host-mremap-shrink  mremap shrinking in place frees only the whole pages past the new
 *                 end: to 2.5 pages keeps page 2 (its region stays valid) and frees page 3; with
 *                 MREMAP_MAYMOVE from 3 to 2 pages, page 0 stays. Exits 0 when exactly so.
 *       dlsym-race  8 threads, each calling dlsym(libcuda, "cuMemFree_v2") from 8 objects in
 *                 turn (hooktest/caller/: 4 export drc_notify_free, 4 do not): every answer
 *                 must be the one for its caller (drc's objects get the driver's function, the
 *                 others the preload's wrapper). Prints the wrong answers; exits 0 when none.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include "drc.h"
#include "drc_cuda.h"
#include "fake_libcuda.h"

typedef int free_fn(unsigned long long);
typedef int free_async_fn(unsigned long long, void *);
typedef int unmap_fn(unsigned long long, size_t);
typedef int gpa2_fn(const char *, void **, int, unsigned long long, int *);

static unsigned long deregs;
static uintptr_t regs;

static int reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    uintptr_t next;

    (void)ctx;
    (void)a;
    next = ++regs;
    *handle = (void *)next;
    *lkey = *rkey = (uint32_t)next;
    return 0;
}

static int dereg(void *ctx, void *handle)
{
    (void)ctx;
    (void)handle;
    deregs++;
    return 0;
}

struct seen {
    drc_region_t *held;
    int called, held_valid;
    unsigned long deregs;
};

static void on_free(uintptr_t ptr, size_t len, const char *entry, void *arg)
{
    struct seen *s = arg;

    (void)ptr;
    (void)len;
    (void)entry;
    s->called = 1;
    s->held_valid = drc_region_valid(s->held);
    s->deregs = deregs;
}

static void *sym(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    return h ? dlsym(h, name) : NULL;
}

/* What the runtime does to get an entry point: dlsym cuGetProcAddress_v2, ask it for itself, then @name. */
static void *rt_sym(const char *name, int version, unsigned long long flags)
{
    gpa2_fn *first = (gpa2_fn *)sym("cuGetProcAddress_v2");
    void *gpa = NULL, *f = NULL;
    int st;

    if (!first || first("cuGetProcAddress", &gpa, 13000, 0, &st) || !gpa ||
        ((gpa2_fn *)gpa)(name, &f, version, flags, &st))
        return NULL;
    return f;
}

static int free_by(const char *mode, unsigned long long d, size_t len)
{
    void *f = NULL, *gpa = NULL;
    int st;

    if (!strcmp(mode, "noctx"))
        return (f = rt_sym("cuMemFree", 3020, 0)) ? ((free_fn *)f)(d) : -1;
    if (!strcmp(mode, "noctx-wrapper"))
        return drc_cuMemFree(d);
    if (!strcmp(mode, "freehost") || !strcmp(mode, "unregister"))
        return (f = rt_sym(mode[0] == 'f' ? "cuMemFreeHost" : "cuMemHostUnregister", 3020, 0))
                   ? ((int (*)(void *))f)((void *)(uintptr_t)d) : -1;
    if (!strcmp(mode, "ipcclose"))
        return (f = rt_sym("cuIpcCloseMemHandle", 4010, 0)) ? ((free_fn *)f)(d) : -1;
    if (!strcmp(mode, "release")) {
        int (*rel)(int) = NULL;

        /* two references (the program's and a library's): the first release frees nothing */
        if (!(f = rt_sym("cuDevicePrimaryCtxRelease", 11000, 0)) || ((int (*)(int))f)(0))
            return -1;
        *(void **)&rel = f;
        return rel(0);  /* the last: the context is reset, its memory goes */
    }
    if (!strcmp(mode, "reset"))
        return (f = rt_sym("cuDevicePrimaryCtxReset", 11000, 0)) ? ((int (*)(int))f)(0) : -1;
    if (!strcmp(mode, "destroy"))
        return (f = rt_sym("cuCtxDestroy", 4000, 0)) ? ((int (*)(void *))f)(FAKE_CUDA_CTX) : -1;

    if (!strcmp(mode, "direct"))
        return cuMemFree_v2(d);
    if (!strcmp(mode, "wrapper"))
        return drc_cuMemFree(d);
    if (!strcmp(mode, "gpa")) {
        if (cuGetProcAddress_v2("cuMemFree", &f, 3020, 0, &st) || !f)
            return -1;
        return ((free_fn *)f)(d);
    }
    if (!strcmp(mode, "runtime") || !strcmp(mode, "runtime-async")) {
        gpa2_fn *first = (gpa2_fn *)sym("cuGetProcAddress_v2");

        if (!first || first("cuGetProcAddress", &gpa, 13000, 0, &st) || !gpa)
            return -1;
        if (!strcmp(mode, "runtime")) {
            if (((gpa2_fn *)gpa)("cuMemFree", &f, 3020, 0, &st) || !f)
                return -1;
            return ((free_fn *)f)(d);
        }
        if (((gpa2_fn *)gpa)("cuMemFreeAsync", &f, 11020, 2, &st) || !f)
            return -1;
        return ((free_async_fn *)f)(d, NULL);
    }
    if (!strcmp(mode, "dlsym"))
        return (f = sym("cuMemFree_v2")) ? ((free_fn *)f)(d) : -1;
    if (!strcmp(mode, "unmap"))
        return (f = sym("cuMemUnmap")) ? ((unmap_fn *)f)(d, len) : -1;
    return -1;
}

static int nocache(void)
{
    static const char *const modes[] = { "direct", "gpa", "runtime", "runtime-async", "dlsym", "unmap" };
    unsigned long long d;
    unsigned i;

    for (i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (cuMemAlloc_v2(&d, 1 << 16) || free_by(modes[i], d, 1 << 16)) {
            printf("nocache: %s failed\n", modes[i]);
            return 1;
        }
    }
    printf("nocache: %u frees\n", fake_cuda_frees());
    return fake_cuda_frees() == i ? 0 : 1;
}

/* dlsym(RTLD_DEFAULT) from a library loaded RTLD_LOCAL, of a symbol of its own dependency. */
static int rtld_default(const char *self)
{
    char path[4096];
    const char *slash = strrchr(self, '/');
    int (*lookup)(void), rc;
    void *h;

    snprintf(path, sizeof(path), "%.*slibrtld_user.so", slash ? (int)(slash - self + 1) : 0, self);
    if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) || !(lookup = (int (*)(void))dlsym(h, "drc_test_rtld_default_lookup")))
        return 1;
    rc = lookup();
    printf("rtld-default: dlsym %s, dlvsym %s\n", rc & 1 ? "NOT found" : "found", rc & 2 ? "NOT found" : "found");
    return rc ? 2 : 0;
}

/* Whose ibv_dereg_mr does a private handle of libibverbs give? */
static int ibv_dlsym(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL), *f, *v;
    Dl_info a, b;

    if (!h)
        return 1;
    f = dlsym(h, "ibv_dereg_mr");
    v = dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.0");
    if (!f || !v || !dladdr(f, &a) || !dladdr(v, &b))
        return 1;
    printf("ibv-dlsym: dlsym from %s, dlvsym from %s\n", a.dli_fname, b.dli_fname);
    if (strstr(a.dli_fname, "libdrc_preload") && strstr(b.dli_fname, "libdrc_preload") &&
        ((int (*)(void *))f)(NULL) == 4242) {
        printf("ibv-dlsym: served by drc\n");
        return 0;
    }
    return 2;
}

/* ---- host memory: new pages over registered ones, without munmap ---- */

/* Put new pages over [h, h+len) the way @mode says; 0 when the call did what the mode expects of it. */
static int replace_pages(const char *mode, char *h, size_t len, int *shm)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *src;

    if (!strcmp(mode, "host-mmap"))
        return mmap(h, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == h ? 0 : -1;
    if (!strcmp(mode, "host-mmap64"))
        return mmap64(h, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == h ? 0 : -1;
    if (!strcmp(mode, "host-noreplace"))
        return mmap(h, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) ==
                           MAP_FAILED && errno == EEXIST ? 0 : -1;
    if (!strcmp(mode, "host-shmat")) {
        if ((*shm = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600)) < 0)
            return -1;
        src = shmat(*shm, h, SHM_REMAP);
        shmctl(*shm, IPC_RMID, NULL);   /* goes with its last detach */
        return src == h ? 0 : -1;
    }
    if (!strcmp(mode, "host-mremap")) {
        src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return src != MAP_FAILED && mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, h) == h ? 0 : -1;
    }
    if (!strcmp(mode, "host-remap-file"))
        return remap_file_pages(h + pg, 2 * pg, 0, 4, 0);   /* pages 1-2 now show file pages 4-5 */
    return -1;
}

static int host(const char *mode)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg, .ctx = NULL };
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 4 * pg;
    int expect = strcmp(mode, "host-noreplace") != 0, fd = -1, shm = -1, held_valid, miss, gone;
    drc_region_t *held, *idle, *again;
    unsigned long d0;
    uintptr_t r0;
    drc_cache_t *c;
    char *h;

    if (!strcmp(mode, "host-remap-file")) {
        /* remap_file_pages works on shared file mappings only */
        if ((fd = memfd_create("hook_child", 0)) < 0 || ftruncate(fd, (off_t)(8 * pg)))
            return 1;
        h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    } else {
        h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (h == MAP_FAILED || drc_cache_create(&be, NULL, &c))
        return 1;
    memset(h, 0x5a, len);
    if (drc_get(c, h + pg, pg, 0x1, &held) || drc_get(c, h + 2 * pg, pg, 0x1, &idle) || drc_put(c, idle))
        return 1;
    r0 = regs;
    d0 = deregs;
    if (replace_pages(mode, h, len, &shm)) {
        printf("%s: the call failed: %s\n", mode, strerror(errno));
        return 1;
    }
    held_valid = drc_region_valid(held);
    gone = deregs - d0 == 1;
    if (drc_get(c, h + 2 * pg, pg, 0x1, &again))
        return 1;
    miss = regs != r0;
    printf("%s: %s (held region valid: %d, idle one deregistered: %d, next registration: %s)\n", mode,
           !held_valid && gone && miss ? "invalidated" : held_valid && !gone && !miss ? "kept" : "partly invalidated",
           held_valid, gone, miss ? "miss" : "hit");
    drc_put(c, again);
    drc_put(c, held);
    drc_cache_destroy(c);
    if (shm >= 0)
        shmdt(h);
    else
        munmap(h, len);
    if (fd >= 0)
        close(fd);
    if (expect)
        return !held_valid && gone && miss ? 0 : 2;
    return held_valid && !gone && !miss ? 0 : 2;
}

/* mremap shrinking in place: only the whole pages past the new end go. */
static int host_mremap_shrink(void)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg, .ctx = NULL };
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    drc_region_t *p0, *p2, *p3, *again;
    int ok1, ok2, p2_valid;
    unsigned long d0;
    uintptr_t r0;
    drc_cache_t *c;
    char *h = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (h == MAP_FAILED || drc_cache_create(&be, NULL, &c))
        return 1;
    if (drc_get(c, h, pg, 0x1, &p0) || drc_put(c, p0) || drc_get(c, h + 2 * pg, pg, 0x1, &p2) ||
        drc_get(c, h + 3 * pg, pg, 0x1, &p3) || drc_put(c, p3))
        return 1;
    /* 4 pages to 2.5: the kernel keeps 3 (page 2 with its region) and frees page 3 */
    d0 = deregs;
    if (mremap(h, 4 * pg, 2 * pg + pg / 2, 0) != h)
        return 1;
    p2_valid = drc_region_valid(p2);
    ok1 = p2_valid && deregs - d0 == 1;
    printf("host-mremap-shrink: to 2.5 pages: page 2's region valid: %d, page 3's deregistered: %d\n", p2_valid,
           deregs - d0 == 1);
    /* 3 pages to 2 with MREMAP_MAYMOVE: shrinking never moves; page 2 goes, page 0 stays */
    d0 = deregs;
    if (mremap(h, 3 * pg, 2 * pg, MREMAP_MAYMOVE) != h)
        return 1;
    r0 = regs;
    if (drc_get(c, h, pg, 0x1, &again))
        return 1;
    ok2 = !drc_region_valid(p2) && deregs == d0 && regs == r0;
    printf("host-mremap-shrink: MAYMOVE to 2 pages: page 2's region valid: %d, page 0's kept: %d\n",
           drc_region_valid(p2), deregs == d0 && regs == r0);
    drc_put(c, again);
    drc_put(c, p2);
    drc_cache_destroy(c);
    munmap(h, 2 * pg);
    return ok1 && ok2 ? 0 : 2;
}

/* ---- dlsym from several objects and threads at once ---- */

enum { RACE_OBJECTS = 8, RACE_THREADS = 8, RACE_CALLS = 400 };

typedef void *lookup_fn(void *, const char *);

static struct {
    lookup_fn *lookup[RACE_OBJECTS];
    void *want[RACE_OBJECTS];       /* the right answer for each object */
    void *cuda;
    unsigned wrong;                 /* atomic */
} race;

static void *race_thread(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg, i, o;

    for (i = 0; i < RACE_CALLS; i++) {
        o = (t + i) % RACE_OBJECTS;
        if (race.lookup[o](race.cuda, "cuMemFree_v2") != race.want[o])
            __atomic_fetch_add(&race.wrong, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int dlsym_race(const char *self)
{
    const char *slash = strrchr(self, '/');
    pthread_t th[RACE_THREADS];
    char path[4096];
    Dl_info a, b;
    unsigned i;
    void *h;

    if (!(race.cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)))
        return 1;
    for (i = 0; i < RACE_OBJECTS; i++) {
        snprintf(path, sizeof(path), "%.*scaller/%s%u.so", slash ? (int)(slash - self + 1) : 0, self,
                 i % 2 ? "app" : "drc", i / 2);
        if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) ||
            !(race.lookup[i] = (lookup_fn *)dlsym(h, "drc_test_caller_lookup")))
            return 1;
        /* one thread: the answer each object must get, from the objects that define it */
        race.want[i] = race.lookup[i](race.cuda, "cuMemFree_v2");
    }
    if (!race.want[0] || !race.want[1] || !dladdr(race.want[0], &a) || !dladdr(race.want[1], &b))
        return 1;
    printf("dlsym-race: drc's objects get %s's, the others %s's\n", a.dli_fname, b.dli_fname);
    if (!strstr(a.dli_fname, "libcuda") || !strstr(b.dli_fname, "libdrc_preload"))
        return 1;   /* the two answers must differ, else a swapped one would not show */
    for (i = 2; i < RACE_OBJECTS; i++)
        if (race.want[i] != race.want[i % 2])
            return 1;
    for (i = 0; i < RACE_THREADS; i++)
        if (pthread_create(&th[i], NULL, race_thread, (void *)(uintptr_t)i))
            return 1;
    for (i = 0; i < RACE_THREADS; i++)
        pthread_join(th[i], NULL);
    printf("dlsym-race: %u wrong answers of %u\n", race.wrong, RACE_THREADS * RACE_CALLS);
    return race.wrong ? 2 : 0;
}

int main(int argc, char **argv)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg, .ctx = NULL };
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 4 * pg, off = pg;
    struct seen s = { 0 };
    unsigned long long d;
    drc_region_t *idle;
    drc_cache_t *c;
    const char *mode = argc > 1 ? argv[1] : "direct";
    int err;

    if (!strcmp(mode, "rtld-next")) {
        void *next = dlsym(RTLD_NEXT, "cuMemFree_v2");

        /* from the executable, the next definition is whichever one the executable itself binds to */
        printf("rtld-next: %s\n", next == (void *)cuMemFree_v2 ? "relative to the caller" : "WRONG object");
        return next == (void *)cuMemFree_v2 ? 0 : 2;
    }
    if (!strcmp(mode, "rtld-default"))
        return rtld_default(argv[0]);
    if (!strcmp(mode, "nocache"))
        return nocache();
    if (!strcmp(mode, "ibv-dlsym"))
        return ibv_dlsym();
    if (!strcmp(mode, "host-mremap-shrink"))
        return host_mremap_shrink();
    if (!strncmp(mode, "host-", 5))
        return host(mode);
    if (!strcmp(mode, "dlsym-race"))
        return dlsym_race(argv[0]);
    if (!strncmp(mode, "noctx", 5)) {
        len = 64 << 20;
        off = 32 << 20;     /* a sub-range far from the pointer freed */
    }
    if (!strcmp(mode, "freehost") || !strcmp(mode, "unregister")) {
        void *h;

        if (cuMemAllocHost_v2(&h, len))
            return 1;
        d = (uintptr_t)h;
    } else {
        void *ctx;

        if (!strcmp(mode, "release") && (cuDevicePrimaryCtxRetain(&ctx, 0) || cuDevicePrimaryCtxRetain(&ctx, 0)))
            return 1;
        if (cuMemAlloc_v2(&d, len))
            return 1;
    }
    if (drc_cache_create(&be, NULL, &c))
        return 1;
    if (drc_get(c, (void *)(uintptr_t)(d + off), pg, 0x1, &s.held) ||
        drc_get(c, (void *)(uintptr_t)(d + off + 2 * pg), pg, 0x1, &idle) || drc_put(c, idle))
        return 1;
    if (!strncmp(mode, "noctx", 5))
        fake_cuda_needs_context(1);     /* this thread has no current context: the range lookup fails */
    fake_cuda_on_free(on_free, &s);
    err = free_by(mode, d, len);
    if (err || !s.called) {
        printf("%s: the free failed (%d)\n", mode, err);
        return 1;
    }
    if (!strcmp(mode, "release")) {
        /* which release is the last is known only after it: drc is told then, not before */
        s.held_valid = drc_region_valid(s.held);
        s.deregs = deregs;
    }
    /* notified = the held region was invalid and the idle one deregistered while the memory still existed */
    printf("%s: %s (held region valid at free: %d, deregs at free: %lu)\n", mode,
           !s.held_valid && s.deregs == 1 ? "notified" : "NOT notified", s.held_valid, s.deregs);
    drc_put(c, s.held);
    drc_cache_destroy(c);
    return !s.held_valid && s.deregs == 1 ? 0 : 2;
}
