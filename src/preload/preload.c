/*
 * build/libdrc_preload.so: drc in front of a program that knows nothing of
 * it. One LD_PRELOAD; it links libdrc.so (NEEDED libdrc.so.0) and has three
 * parts, chosen by DRC_PRELOAD (preload.h):
 *
 *   cuda   the CUDA frees, unmaps and teardowns (preload_cuda.c), or with
 *          DRC_MONITOR=cupti the CUPTI monitor (preload_cupti.c)
 *   host   the libc calls that unmap host memory (preload_host.c)
 *   verbs  the ibv_reg_mr front for transfer engines (preload_verbs.c)
 *
 * libdrc_hook.so and libdrc_verbs.so are links to this library, so existing
 * command lines keep working, and preloading both loads it once (the
 * dynamic loader knows a file it has loaded).
 *
 * This file holds what the parts share:
 *
 * The drcs to tell. A drc attaches on its first cache (notify.c calls the
 * exported drc_hook_attach with its struct drc__preload_ops). A process may
 * hold several copies of drc (the libdrc.so this library links, and a
 * static libdrc.a inside the program): each attaches, and every begin goes
 * to each that has a cache. Their tickets are packed into one int, a byte
 * each (ticket + 1; notify.c's tickets are 0..64).
 *
 * dlsym and dlvsym. The CUDA runtime finds the driver's entry points with
 * dlsym, and some transfer engines find libibverbs's the same way on a
 * handle of their own (dlopen RTLD_LOCAL): both are answered here, with
 * drc's wrappers where a part serves the name. drc's own lookups (an object
 * that exports drc_notify_free) get the real functions.
 *
 * Finding libc's dlsym. Asking dlvsym for a version string would tie us to
 * one architecture (GLIBC_2.2.5 exists on x86-64 only; dlsym moved to
 * libc.so.6 as GLIBC_2.34), so the dynamic symbol table of libc.so.6 (or of
 * libdl.so.2 before glibc 2.34) is read instead, with dl_iterate_phdr and
 * its GNU hash table: whatever the version nodes, there is one dlsym.
 *
 * RTLD_NEXT. libc resolves it from its caller's return address; an
 * interposer that forwards the call is that caller unless the compiler
 * turned the forward into a tail call, which it does only when optimising.
 * So RTLD_NEXT is resolved here, for our caller: its object is found with
 * dladdr1(RTLD_DL_LINKMAP), and the objects after it in the link map are
 * asked in turn, each through a handle of its own; the first that defines
 * the name wins. This holds at -O0 and on every architecture.
 *
 * RTLD_DEFAULT is the caller's too: libc searches the global scope and then
 * the caller's local one (default_for).
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/preload_abi.h"    /* struct drc__preload_ops: what each drc attaches with */
#include "preload/preload.h"

#define EXPORT __attribute__((visibility("default")))

/*
 * A test build (tests/hooks/race_window.c) widens the windows of from_drc's
 * cache with a sleep, so that the race test sees a torn answer at once where
 * there is one; the product compiles it to nothing.
 */
#ifdef DRC_PRELOAD_RACE_WINDOW
void drc__test_race_window(void);
#else
#define DRC_PRELOAD_RACE_WINDOW() ((void)0)
#endif

enum { MAX_DRCS = 4 };

static const struct drc__preload_ops *drcs[MAX_DRCS];  /* atomic: filled in order, never emptied */
static int parts = -1;                         /* atomic: DRC__PRELOAD_* bits, -1 until decided */

typedef void *dlsym_fn(void *, const char *);
typedef void *dlvsym_fn(void *, const char *, const char *);
static dlsym_fn *libc_dlsym;                   /* atomic */
static dlvsym_fn *libc_dlvsym;                 /* atomic */

/* ---- the parts ------------------------------------------------------------- */

int drc__preload_part(int part)
{
    int p = __atomic_load_n(&parts, __ATOMIC_ACQUIRE);
    const char *pre;

    if (p < 0) {
        pre = getenv("LD_PRELOAD");
        if (drc__env_state(DRC__ENV_PRELOAD) != DRC__ENV_UNSET)
            p = (int)drc__env(DRC__ENV_PRELOAD);     /* set wrong: all (config.c said so) */
        else if (pre && (strstr(pre, "libdrc_hook") || strstr(pre, "libdrc_verbs") || strstr(pre, "libdrc_preload")))
            p = (strstr(pre, "libdrc_hook") ? DRC__PRELOAD_CUDA : 0) |
                (strstr(pre, "libdrc_verbs") || strstr(pre, "libdrc_preload")
                     ? DRC__PRELOAD_CUDA | DRC__PRELOAD_HOST | DRC__PRELOAD_VERBS : 0);
        else
            p = DRC__PRELOAD_CUDA | DRC__PRELOAD_HOST | DRC__PRELOAD_VERBS;
        __atomic_store_n(&parts, p, __ATOMIC_RELEASE);
    }
    return (p & part) != 0;
}

/* The verbs front's seam, until preload_verbs.c defines it: no ibv_* name is served. */
__attribute__((weak)) void *drc__preload_verbs_symbol(const char *name, const char *version)
{
    (void)name;
    (void)version;
    return NULL;
}

__attribute__((weak)) int drc__preload_verbs_enabled(void)
{
    return 0;
}

/* ---- the drcs to tell -------------------------------------------------------- */

/* Called by drc (notify.c) when its first cache is created. */
EXPORT void drc_hook_attach(const struct drc__preload_ops *o)
{
    int i;

    if (!o || o->version < 2)
        return;
    for (i = 0; i < MAX_DRCS; i++) {
        const struct drc__preload_ops *cur = NULL;

        if (__atomic_compare_exchange_n(&drcs[i], &cur, o, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) || cur == o)
            break;
    }
    if (drc__env(DRC__ENV_HOOK_DEBUG))
        fprintf(stderr, "drc preload: %s drc %p (parts:%s%s%s)\n", i < MAX_DRCS ? "attached to" : "no room for",
                (const void *)o, drc__preload_part(DRC__PRELOAD_CUDA) ? " cuda" : "",
                drc__preload_part(DRC__PRELOAD_HOST) ? " host" : "",
                drc__preload_part(DRC__PRELOAD_VERBS) ? " verbs" : "");
}

/* Each attached drc that has a cache now begins its part; the tickets, packed. */
#define EACH_BEGIN(call)                                                                  \
    int i, t, all = 0;                                                                    \
    for (i = 0; i < MAX_DRCS; i++) {                                                      \
        const struct drc__preload_ops *o = __atomic_load_n(&drcs[i], __ATOMIC_ACQUIRE);          \
        if (!o)                                                                           \
            break;                                                                        \
        if (!__atomic_load_n(o->caches, __ATOMIC_ACQUIRE))                               \
            continue;                                                                     \
        t = (call);                                                                       \
        if (t >= 0 && t < 255)                                                            \
            all |= (t + 1) << (8 * i);                                                    \
    }                                                                                     \
    return all ? all : -1

int drc__preload_begin_free(unsigned long long ptr)
{
    EACH_BEGIN(o->begin_free ? o->begin_free(ptr) : o->begin((const void *)(uintptr_t)ptr, 1));
}

int drc__preload_begin_unmap(unsigned long long ptr, size_t size)
{
    EACH_BEGIN(ptr && size ? o->begin((const void *)(uintptr_t)ptr, size) : -1);
}

int drc__preload_begin_teardown(int device)
{
    EACH_BEGIN(o->begin_teardown ? o->begin_teardown(device) : -1);
}

int drc__preload_ctx_device(void *ctx)
{
    const struct drc__preload_ops *o = __atomic_load_n(&drcs[0], __ATOMIC_ACQUIRE);

    return o && o->ctx_device ? o->ctx_device(ctx) : -1;
}

void drc__preload_primary_released(int device)
{
    int i;

    for (i = 0; i < MAX_DRCS; i++) {
        const struct drc__preload_ops *o = __atomic_load_n(&drcs[i], __ATOMIC_ACQUIRE);

        if (!o)
            break;
        if (o->primary_released && __atomic_load_n(o->caches, __ATOMIC_ACQUIRE))
            o->primary_released(device);
    }
}

void drc__preload_end(int tickets)
{
    int i, t;

    if (tickets < 0)
        return;
    for (i = 0; i < MAX_DRCS; i++) {
        const struct drc__preload_ops *o = __atomic_load_n(&drcs[i], __ATOMIC_ACQUIRE);

        t = (int)(((unsigned)tickets >> (8 * i)) & 0xff);
        if (o && t)
            o->end(t - 1);
    }
}

/* ---- libc's dlsym and dlvsym -------------------------------------------------- */

struct lookup {
    const char *name;
    void *found;
};

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;

    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* A dynamic-section address: relocated by the loader on most architectures, not on all. */
static uintptr_t dyn_addr(const struct dl_phdr_info *info, ElfW(Addr) p)
{
    return p < info->dlpi_addr ? info->dlpi_addr + p : p;
}

static int find_in_libc(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct lookup *l = arg;
    const char *base = strrchr(info->dlpi_name, '/');
    const ElfW(Sym) *symtab = NULL;
    const uint32_t *gh = NULL, *buckets, *chain;
    const char *strtab = NULL;
    uint32_t h, i, nb, symoff;
    int k;

    (void)size;
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, "libc.so", 7) && strncmp(base, "libdl.so", 8))
        return 0;
    for (k = 0; k < info->dlpi_phnum; k++) {
        const ElfW(Dyn) *d;

        if (info->dlpi_phdr[k].p_type != PT_DYNAMIC)
            continue;
        for (d = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[k].p_vaddr); d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB)
                symtab = (const ElfW(Sym) *)dyn_addr(info, d->d_un.d_ptr);
            else if (d->d_tag == DT_STRTAB)
                strtab = (const char *)dyn_addr(info, d->d_un.d_ptr);
            else if (d->d_tag == DT_GNU_HASH)
                gh = (const uint32_t *)dyn_addr(info, d->d_un.d_ptr);
        }
    }
    if (!symtab || !strtab || !gh)
        return 0;
    nb = gh[0];
    symoff = gh[1];
    buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + gh[2]);
    chain = buckets + nb;
    h = gnu_hash(l->name);
    for (i = nb ? buckets[h % nb] : 0; i >= symoff && i; i++) {
        uint32_t ch = chain[i - symoff];
        const ElfW(Sym) *s = &symtab[i];

        if ((ch | 1) == (h | 1) && s->st_shndx != SHN_UNDEF && s->st_value && !strcmp(strtab + s->st_name, l->name)) {
            l->found = (void *)(info->dlpi_addr + s->st_value);
            return 1;
        }
        if (ch & 1)
            break;
    }
    return 0;
}

static void *libc_function(void **cache, const char *name)
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    struct lookup l = { name, NULL };

    if (!p) {
        dl_iterate_phdr(find_in_libc, &l);
        p = l.found;
        __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    }
    return p;
}

void *drc__preload_real_dlsym(void *handle, const char *name)
{
    dlsym_fn *f = (dlsym_fn *)libc_function((void **)&libc_dlsym, "dlsym");

    return f ? f(handle, name) : NULL;
}

void *drc__preload_real_dlvsym(void *handle, const char *name, const char *version)
{
    dlvsym_fn *f = (dlvsym_fn *)libc_function((void **)&libc_dlvsym, "dlvsym");

    return f ? f(handle, name, version) : NULL;
}

/* ---- dlsym and dlvsym ----------------------------------------------------------- */

/* RTLD_NEXT for the code at @ra: the first object after its own, in link-map order, defining @name. */
static void *next_after(const void *ra, const char *name, const char *version)
{
    struct link_map *self = NULL, *l, *owner;
    Dl_info info;

    if (!dladdr1(ra, &info, (void **)&self, RTLD_DL_LINKMAP) || !self)
        return NULL;
    for (l = self->l_next; l; l = l->l_next) {
        void *h = dlopen(l->l_name && l->l_name[0] ? l->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD), *p;

        if (!h)
            continue;
        p = version ? drc__preload_real_dlvsym(h, name, version) : drc__preload_real_dlsym(h, name);
        dlclose(h);     /* drops the reference NOLOAD took */
        owner = NULL;
        if (p && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == l)
            return p;
    }
    return NULL;
}

/*
 * RTLD_DEFAULT for the code at @ra. libc searches the global scope, then the
 * caller's own local scope: an object loaded RTLD_LOCAL (every ctypes.CDLL,
 * most plugins) sees its own dependencies. Forwarded from here, the caller
 * would be this library, whose local scope is not the caller's, and such a
 * lookup of a symbol of the caller's own dependency would answer NULL. So when
 * the global scope has no answer, the caller's object is asked through a
 * handle of its own, which searches it and its dependencies.
 */
static void *default_for(const void *ra, const char *name, const char *version)
{
    void *p = version ? drc__preload_real_dlvsym(RTLD_DEFAULT, name, version) : drc__preload_real_dlsym(RTLD_DEFAULT, name);
    struct link_map *self = NULL;
    Dl_info info;
    void *h;

    if (p || !dladdr1(ra, &info, (void **)&self, RTLD_DL_LINKMAP) || !self || !self->l_name || !self->l_name[0])
        return p;       /* found, or the caller is the executable: its scope is the global one */
    h = dlopen(self->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
        p = version ? drc__preload_real_dlvsym(h, name, version) : drc__preload_real_dlsym(h, name);
        dlclose(h);     /* drops the reference NOLOAD took */
    }
    return p;
}

/*
 * 1 if the code at @ra belongs to a drc (an object that exports drc_notify_free).
 *
 * The answer per object is kept in a few slots, each ONE word: the object's
 * base (where its first mapping starts: page-aligned) with the answer in bit
 * 0, stored and loaded whole. A slot so always pairs a base with that
 * object's own answer, whatever the threads do; the worst a race does is
 * replace an entry another thread just wrote, and the next call for that
 * object asks again. With the base and the answer in two words, a thread
 * could pair them across objects:
 *
 *   thread A (object X, slot i)          thread B (object Y, slot i)
 *   known_drc[i] = X's answer
 *                                        known_drc[i] = Y's answer
 *                                        known_base[i] = Y
 *   known_base[i] = X                    -> X now reads Y's answer
 *
 * and a program then got the provider's real ibv_dereg_mr (freeing a struct
 * it never allocated when handed drc's MR), or drc's own lookups got drc's
 * wrappers (re-entry).
 */
static int from_drc(const void *ra)
{
    static uintptr_t known[4];          /* atomic: base | answer, 0 for none */
    static unsigned next_slot;          /* atomic */
    Dl_info self, found;
    uintptr_t base, k;
    void *h, *p;
    int i, yes = 0;

    if (!dladdr(ra, &self) || !self.dli_fbase)
        return 0;
    base = (uintptr_t)self.dli_fbase;
    for (i = 0; i < 4; i++) {
        k = __atomic_load_n(&known[i], __ATOMIC_RELAXED);
        DRC_PRELOAD_RACE_WINDOW();
        if ((k & ~(uintptr_t)1) == base)
            return (int)(k & 1);
    }
    h = self.dli_fname && self.dli_fname[0] ? dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (h) {
        p = drc__preload_real_dlsym(h, "drc_notify_free");
        yes = p && dladdr(p, &found) && found.dli_fbase == self.dli_fbase;
        dlclose(h);
    }
    DRC_PRELOAD_RACE_WINDOW();
    if (!(base & 1))    /* always so: a base is where a mapping starts */
        __atomic_store_n(&known[__atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED) % 4], base | (uintptr_t)yes,
                         __ATOMIC_RELAXED);
    return yes;
}

/* What a program asking for @name gets instead of @p (the real answer), or @p. */
static void *answer(const char *name, const char *version, void *p, const void *ra)
{
    void *ours;

    if (name[0] == 'i' && !strncmp(name, "ibv_", 4) && drc__preload_verbs_enabled() && !from_drc(ra) &&
        (ours = drc__preload_verbs_symbol(name, version)))
        return ours;
    if (p && name[0] == 'c' && name[1] == 'u' && drc__preload_part(DRC__PRELOAD_CUDA))
        return drc__preload_cuda_symbol(name, p, from_drc(ra));
    return p;
}

EXPORT void *dlsym(void *handle, const char *name)
{
    const void *ra = __builtin_return_address(0);

    if (handle == RTLD_NEXT)
        return next_after(ra, name, NULL);
    return answer(name, NULL, handle == RTLD_DEFAULT ? default_for(ra, name, NULL) : drc__preload_real_dlsym(handle, name),
                  ra);
}

EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
    const void *ra = __builtin_return_address(0);

    if (handle == RTLD_NEXT)
        return next_after(ra, name, version);
    return answer(name, version, handle == RTLD_DEFAULT ? default_for(ra, name, version) :
                  drc__preload_real_dlvsym(handle, name, version), ra);
}

/* ---- at load: do the names served here resolve to this library? ------------- */

/*
 * An interposer works only where the dynamic linker resolves its names to it.
 * The global scope is searched in order: the executable, the objects of
 * LD_PRELOAD in their order, then the program's libraries. An object
 * preloaded before this one that defines ibv_reg_mr (a provider, another
 * interposer) takes every such call, and drc would see none of them, in
 * silence. Objects loaded later (libibverbs, libcuda, by NEEDED or by
 * dlopen) come after this library, so everything that can stand in front of
 * it is there when its constructor runs: the check is made once, then. (An
 * object opened with RTLD_DEEPBIND binds to its own definitions first, which
 * no check here can see; those that open libibverbs privately are served by
 * the dlsym interposer above.)
 *
 * The names are read from this library's own dynamic symbol table, so a hook
 * added to any part is checked with no list to keep. A name counts when its
 * part is on: ibv_* the verbs front, cu* the CUDA hooks (DRC_MONITOR=hook),
 * dlsym/dlvsym always, any other function the host part; drc_* are not
 * interposers.
 */
static int name_in_use(const char *name)
{
    if (name[0] == '_' || !strncmp(name, "drc_", 4))
        return 0;
    if (!strcmp(name, "dlsym") || !strcmp(name, "dlvsym"))
        return 1;
    if (!strncmp(name, "ibv_", 4))
        return drc__preload_verbs_enabled();
    if (!strncmp(name, "cu", 2))
        return drc__preload_part(DRC__PRELOAD_CUDA) && drc__env(DRC__ENV_MONITOR) == DRC__MONITOR_HOOK;
    return drc__preload_part(DRC__PRELOAD_HOST);
}

static void check_shadowing(void)
{
    struct link_map *self = NULL;
    const ElfW(Dyn) *d;
    const ElfW(Sym) *symtab = NULL;
    const uint32_t *gh = NULL, *buckets, *chain;
    const char *strtab = NULL, *me, *other = NULL;
    char names[400];
    uint32_t i, n, nb, symoff;
    size_t used = 0;
    int count = 0;
    Dl_info info;

    if (!dladdr1((void *)check_shadowing, &info, (void **)&self, RTLD_DL_LINKMAP) || !self || !self->l_ld)
        return;
    for (d = self->l_ld; d->d_tag != DT_NULL; d++) {
        uintptr_t p = d->d_un.d_ptr < self->l_addr ? self->l_addr + d->d_un.d_ptr : d->d_un.d_ptr;

        if (d->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)p;
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)p;
        else if (d->d_tag == DT_GNU_HASH)
            gh = (const uint32_t *)p;
    }
    if (!symtab || !strtab || !gh)
        return;
    /* the GNU hash holds the exported symbols symoff..n; n ends the last chain (ELF64_ST_* = ELF32_ST_*) */
    nb = gh[0];
    symoff = gh[1];
    buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + gh[2]);
    chain = buckets + nb;
    for (n = 0, i = 0; i < nb; i++)
        if (buckets[i] > n)
            n = buckets[i];
    if (n >= symoff)
        while (!(chain[n - symoff] & 1))
            n++;
    names[0] = 0;
    for (i = symoff; i <= n && n >= symoff; i++) {
        const ElfW(Sym) *s = &symtab[i];
        const char *name = strtab + s->st_name;
        void *found;

        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
            ELF64_ST_VISIBILITY(s->st_other) != STV_DEFAULT || !name_in_use(name))
            continue;
        found = drc__preload_real_dlsym(RTLD_DEFAULT, name);
        if (!found || found == (void *)(self->l_addr + s->st_value) || !dladdr(found, &info))
            continue;
        if (!other)
            other = info.dli_fname && info.dli_fname[0] ? info.dli_fname : "the program";
        if (used < sizeof(names))
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s", count ? ", " : "", name);
        count++;
    }
    if (!count)
        return;
    me = self->l_name && strrchr(self->l_name, '/') ? strrchr(self->l_name, '/') + 1 : "libdrc_preload.so";
    fprintf(stderr, "drc: %s does not see the program's calls to %s: %s, loaded before it, defines %s; put %s "
            "first in LD_PRELOAD\n", me, names, other, count > 1 ? "them" : "it", me);
}

__attribute__((constructor)) static void preload_init(void)
{
    check_shadowing();
}
