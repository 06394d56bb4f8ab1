/*
 * The host part of the preload library (preload.c): the libc calls that take
 * pages away from a range of the address space begin the free of the range
 * in every attached drc first (drc__preload_begin_unmap: invalidated and marked
 * as being freed), then do what was asked, then end it. With the host part
 * off (DRC_PRELOAD without host) they only do what was asked.
 *
 * A registered host MR pins the pages it was registered on. Once the range
 * is unmapped (munmap, mremap moving or shrinking it, brk/sbrk shrinking the
 * heap, shmdt), its pages are dropped (madvise DONTNEED, FREE, REMOVE), or
 * other pages are put in their place without an unmap (mmap and mmap64 with
 * MAP_FIXED, shmat with SHM_REMAP, mremap with MREMAP_FIXED at its target,
 * remap_file_pages), the same addresses show other pages while the cached MR
 * still points the NIC at the old ones: the cache must forget the range
 * before that can happen, so the notification comes before the real call,
 * and the range stays marked as being freed until the call returned (a
 * registration of it meanwhile waits, notify.c): once the call returned, no
 * thread gets the old region.
 *
 * Which range. Each call notifies the range the kernel takes from its
 * current pages, rounded as the kernel rounds it (whole pages; whole huge
 * pages for hugetlb mappings), and nothing where the kernel refuses the call
 * before touching anything (a misaligned address, a zero length, an unknown
 * flag, MAP_FIXED_NOREPLACE, which fails with EEXIST rather than replace).
 * A call that fails later may already have taken the old pages: mmap with
 * MAP_FIXED removed the old mapping before building the new one (older
 * kernels always; current ones still leave a gap on some error paths), and
 * mremap with MREMAP_FIXED unmaps its target before it checks the source. So
 * a failed call is not known to have replaced nothing, and its notification,
 * which must come before the call, stands: over-invalidation is harmless
 * (the next registration misses), a missed one is a stale MR. Likewise
 * where the kernel's effect is known only afterwards (mremap with
 * MREMAP_MAYMOVE growing: moved, or grown in place), the whole old range is
 * notified.
 *
 * Rules for this file: it runs inside allocators (jemalloc purges with
 * madvise and decommits with mmap MAP_FIXED, libnuma frees with munmap), so
 * it allocates nothing and takes no lock an allocator may hold. The next
 * definitions are looked up once, in a constructor; a call that comes before
 * it (from another library's constructor, say) goes to the system call, or
 * for brk/sbrk to glibc's exported __sbrk, which keeps glibc's idea of the
 * break right (a raw brk would not).
 *
 * Not seen: calls that never pass through the dynamic symbol table — glibc's
 * own malloc/free and the dynamic loader reach mmap, munmap, madvise and sbrk
 * through internal aliases, and statically linked or inline system calls
 * (syscall(SYS_mmap, ...), a Go or static binary) do too. Memory that is
 * registered must therefore come from an allocator that calls these through
 * libc's exported names (jemalloc, libnuma, plain mmap), from
 * drc_host_alloc(), or be registered for the life of the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

#include "preload/preload.h"

#define EXPORT __attribute__((visibility("default")))

extern void *__sbrk(intptr_t increment);

static int (*next_munmap)(void *, size_t);
static void *(*next_mremap)(void *, size_t, size_t, int, ...);
static int (*next_madvise)(void *, size_t, int);
static int (*next_brk)(void *);
static void *(*next_sbrk)(intptr_t);
static int (*next_shmdt)(const void *);
static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static void *(*next_mmap64)(void *, size_t, int, int, int, off64_t);
static void *(*next_shmat)(int, const void *, int);
static int (*next_remap_file_pages)(void *, size_t, int, size_t, int);

__attribute__((constructor)) static void hook_host_init(void)
{
    /* each store is atomic so that a thread racing the constructor sees NULL or the function */
#define NEXT(name) drc__preload_real_dlsym(RTLD_NEXT, name)
    __atomic_store_n(&next_munmap, (int (*)(void *, size_t))NEXT("munmap"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_mremap, (void *(*)(void *, size_t, size_t, int, ...))NEXT("mremap"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_madvise, (int (*)(void *, size_t, int))NEXT("madvise"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_brk, (int (*)(void *))NEXT("brk"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_sbrk, (void *(*)(intptr_t))NEXT("sbrk"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_shmdt, (int (*)(const void *))NEXT("shmdt"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_mmap, (void *(*)(void *, size_t, int, int, int, off_t))NEXT("mmap"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_mmap64, (void *(*)(void *, size_t, int, int, int, off64_t))NEXT("mmap64"),
                     __ATOMIC_RELEASE);
    __atomic_store_n(&next_shmat, (void *(*)(int, const void *, int))NEXT("shmat"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_remap_file_pages, (int (*)(void *, size_t, int, size_t, int))NEXT("remap_file_pages"),
                     __ATOMIC_RELEASE);
#undef NEXT
}

/* Begin the free of [addr, addr+len) in every attached drc, if the host part is on: tickets or -1. */
static int begin(const void *addr, size_t len)
{
    return drc__preload_part(DRC__PRELOAD_HOST) ? drc__preload_begin_unmap((uintptr_t)addr, len) : -1;
}

static uintptr_t page_size(void)
{
    static uintptr_t page;
    uintptr_t p = __atomic_load_n(&page, __ATOMIC_RELAXED);

    if (!p) {
        p = (uintptr_t)sysconf(_SC_PAGESIZE);
        __atomic_store_n(&page, p, __ATOMIC_RELAXED);
    }
    return p;
}

/* [addr, addr+len) as the kernel treats it: len rounded up to whole @unit. Tickets or -1. */
static int notify_units(const void *addr, size_t len, uintptr_t unit)
{
    uintptr_t a = (uintptr_t)addr;

    if ((a & (page_size() - 1)) || !len || len > UINTPTR_MAX - a - unit)
        return -1;  /* the kernel will refuse the call (EINVAL); nothing goes */
    return begin(addr, (len + unit - 1) & ~(unit - 1));
}

static int notify_pages(const void *addr, size_t len)
{
    return notify_units(addr, len, page_size());
}

/* Return a libc-style result for a raw system call. */
static long sys_result(long r)
{
    if (r < 0 && r > -4096) {
        errno = (int)-r;
        return -1;
    }
    return r;
}

EXPORT int munmap(void *addr, size_t len)
{
    int (*f)(void *, size_t) = __atomic_load_n(&next_munmap, __ATOMIC_ACQUIRE);
    int t = notify_pages(addr, len), r;

    r = f ? f(addr, len) : (int)sys_result(syscall(SYS_munmap, addr, len));
    drc__preload_end(t);
    return r;
}

/*
 * mremap: with MREMAP_FIXED, whatever was mapped at the target goes first;
 * the source goes when the pages move (MREMAP_FIXED, MREMAP_DONTUNMAP, or
 * MREMAP_MAYMOVE growing, which may move: known only afterwards); shrinking
 * in place (which MREMAP_MAYMOVE alone never moves) frees the whole pages
 * past the new end. An old size of 0 (a second mapping of shared pages)
 * frees nothing.
 */
EXPORT void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
    void *(*f)(void *, size_t, size_t, int, ...) = __atomic_load_n(&next_mremap, __ATOMIC_ACQUIRE);
    uintptr_t p = page_size(), keep = (new_size + p - 1) & ~(p - 1), had = (old_size + p - 1) & ~(p - 1);
    void *new_addr = NULL, *r;
    int t1 = -1, t2 = -1, moving = (flags & MREMAP_MAYMOVE) != 0;
    va_list ap;

    if (flags & MREMAP_FIXED) {
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
        if (moving)     /* without MREMAP_MAYMOVE the kernel refuses it */
            t1 = notify_pages(new_addr, new_size);
    }
    if (moving && ((flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) || keep > had))
        t2 = notify_pages(old, old_size);
    else if (!(flags & ~MREMAP_MAYMOVE) && keep < had && !((uintptr_t)old & (p - 1)))
        t2 = begin((char *)old + keep, had - keep);
    if (f) {
        r = (flags & MREMAP_FIXED) ? f(old, old_size, new_size, flags, new_addr) : f(old, old_size, new_size, flags);
    } else {
        long s = syscall(SYS_mremap, old, old_size, new_size, flags, new_addr);

        r = sys_result(s) == -1 ? MAP_FAILED : (void *)s;
    }
    drc__preload_end(t2);
    drc__preload_end(t1);
    return r;
}

static int drops_pages(int advice)
{
    switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_REMOVE:
#ifdef MADV_DONTNEED_LOCKED
    case MADV_DONTNEED_LOCKED:
#endif
        return 1;
    default:
        return 0;
    }
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
    int (*f)(void *, size_t, int) = __atomic_load_n(&next_madvise, __ATOMIC_ACQUIRE);
    int t = drops_pages(advice) ? notify_pages(addr, len) : -1, r;

    r = f ? f(addr, len, advice) : (int)sys_result(syscall(SYS_madvise, addr, len, advice));
    drc__preload_end(t);
    return r;
}

/* The heap shrinks from @cur down to @to: begin the free of the whole pages that leave it. */
static int heap_shrinks(uintptr_t to, uintptr_t cur)
{
    uintptr_t p = page_size(), lo = (to + p - 1) & ~(p - 1), hi = (cur + p - 1) & ~(p - 1);

    return to < cur && lo < hi ? begin((const void *)lo, hi - lo) : -1;
}

static void *current_break(void)
{
    void *(*f)(intptr_t) = __atomic_load_n(&next_sbrk, __ATOMIC_ACQUIRE);

    return f ? f(0) : __sbrk(0);
}

EXPORT int brk(void *addr)
{
    int (*f)(void *) = __atomic_load_n(&next_brk, __ATOMIC_ACQUIRE);

    uintptr_t cur = (uintptr_t)current_break();
    int t = heap_shrinks((uintptr_t)addr, cur), r;

    r = f ? f(addr) : __sbrk((intptr_t)((uintptr_t)addr - cur)) == (void *)-1 ? -1 : 0;
    drc__preload_end(t);
    return r;
}

EXPORT void *sbrk(intptr_t increment)
{
    void *(*f)(intptr_t) = __atomic_load_n(&next_sbrk, __ATOMIC_ACQUIRE);
    uintptr_t cur;
    int t = -1;
    void *r;

    if (increment < 0) {
        cur = (uintptr_t)current_break();
        if ((uintptr_t)-increment <= cur)
            t = heap_shrinks(cur - (uintptr_t)-increment, cur);
    }
    r = f ? f(increment) : __sbrk(increment);
    drc__preload_end(t);
    return r;
}

/* Parse one hexadecimal digit; -1 if @ch is not one. */
static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/*
 * The end of the mapping that starts at @addr, read from /proc/self/maps
 * with a buffer on the stack (shmdt gives no length, and no allocation is
 * allowed here); 0 if there is none. A segment split in several mappings
 * (mprotect on part of it) is reported up to its first split.
 */
static uintptr_t mapping_end(uintptr_t addr)
{
    char buf[4096];
    uintptr_t start = 0, end = 0;
    int fd, field = 0, found = 0, d;   /* field: 0 start, 1 end, 2 rest of the line */
    ssize_t n, i;

    fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    while (!found && (n = (ssize_t)syscall(SYS_read, fd, buf, sizeof(buf))) > 0) {
        for (i = 0; i < n && !found; i++) {
            char ch = buf[i];

            if (ch == '\n') {
                field = 0;
                start = end = 0;
            } else if (field == 0) {
                if (ch == '-')
                    field = 1;
                else if ((d = hexval(ch)) >= 0)
                    start = start << 4 | (uintptr_t)d;
            } else if (field == 1) {
                if ((d = hexval(ch)) >= 0) {
                    end = end << 4 | (uintptr_t)d;
                } else {
                    field = 2;
                    found = start == addr;
                }
            }
        }
    }
    syscall(SYS_close, fd);
    return found ? end : 0;
}

EXPORT int shmdt(const void *addr)
{
    int (*f)(const void *) = __atomic_load_n(&next_shmdt, __ATOMIC_ACQUIRE);
    uintptr_t end = drc__preload_part(DRC__PRELOAD_HOST) ? mapping_end((uintptr_t)addr) : 0;
    int t = end > (uintptr_t)addr ? begin(addr, end - (uintptr_t)addr) : -1, r;

    r = f ? f(addr) : (int)sys_result(syscall(SYS_shmdt, addr));
    drc__preload_end(t);
    return r;
}

/* ---- calls that put new pages over a range without unmapping it first -------- */

/* The kernel's default huge page size ("Hugepagesize:" of /proc/meminfo, read once); 1 GiB if unknown. */
static uintptr_t default_huge_page(void)
{
    static uintptr_t huge;
    static const char key[] = "Hugepagesize:";
    uintptr_t h = __atomic_load_n(&huge, __ATOMIC_RELAXED), kb = 0;
    char buf[4096], *at;
    ssize_t n, got = 0;
    int fd;

    if (h)
        return h;
    fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        while (got < (ssize_t)sizeof(buf) - 1 &&
               (n = (ssize_t)syscall(SYS_read, fd, buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
            got += n;
        syscall(SYS_close, fd);
    }
    buf[got > 0 ? got : 0] = 0;
    if ((at = strstr(buf, key)))
        for (at += sizeof(key) - 1; *at == ' '; at++)
            ;
    for (; at && *at >= '0' && *at <= '9'; at++)
        kb = kb * 10 + (uintptr_t)(*at - '0');
    h = kb ? kb << 10 : (uintptr_t)1 << 30;
    __atomic_store_n(&huge, h, __ATOMIC_RELAXED);
    return h;
}

/* The unit the kernel rounds a mapping's length to: a huge page for hugetlb, else a page. */
static uintptr_t map_unit(int flags, int fd)
{
    struct statfs fs;
    int shift;

    if (flags & MAP_ANONYMOUS) {
        if (!(flags & MAP_HUGETLB))
            return page_size();
        shift = (flags >> MAP_HUGE_SHIFT) & MAP_HUGE_MASK;
        return shift ? (uintptr_t)1 << shift : default_huge_page();
    }
    if (syscall(SYS_fstatfs, fd, &fs) == 0 && (unsigned long)fs.f_type == HUGETLBFS_MAGIC && fs.f_bsize > 0)
        return (uintptr_t)fs.f_bsize;   /* a file of hugetlbfs */
    return page_size();
}

/*
 * mmap and mmap64 with MAP_FIXED replace what was mapped in the range; with
 * MAP_FIXED_NOREPLACE (alone or with MAP_FIXED) they fail with EEXIST
 * instead, and without either the kernel picks free addresses: neither
 * replaces anything.
 */
static int notify_fixed(void *addr, size_t len, int flags, int fd)
{
    if (!(flags & MAP_FIXED) || (flags & MAP_FIXED_NOREPLACE) || !drc__preload_part(DRC__PRELOAD_HOST))
        return -1;
    return notify_units(addr, len, map_unit(flags, fd));
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    void *(*f)(void *, size_t, int, int, int, off_t) = __atomic_load_n(&next_mmap, __ATOMIC_ACQUIRE);
    int t = notify_fixed(addr, len, flags, fd);
    void *r;

    r = f ? f(addr, len, prot, flags, fd, off)
          : (void *)sys_result(syscall(SYS_mmap, addr, len, (long)prot, (long)flags, (long)fd, (long)off));
    drc__preload_end(t);
    return r;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
    void *(*f)(void *, size_t, int, int, int, off64_t) = __atomic_load_n(&next_mmap64, __ATOMIC_ACQUIRE);
    int t = notify_fixed(addr, len, flags, fd);
    void *r;

    r = f ? f(addr, len, prot, flags, fd, off)
          : (void *)sys_result(syscall(SYS_mmap, addr, len, (long)prot, (long)flags, (long)fd, (long)off));
    drc__preload_end(t);
    return r;
}

/*
 * shmat with SHM_REMAP maps the segment over whatever is at @addr (rounded
 * down to SHMLBA with SHM_RND): its size, shm_segsz, comes from IPC_STAT,
 * which succeeds wherever the attach can (both need read permission). The
 * mapping of a hugetlb segment is longer (whole huge pages, which IPC_STAT
 * does not say): the rest is notified once the mapping shows its end. For
 * those segments alone, a lookup of that rest between the kernel's remap
 * and this notification can still find the old region.
 */
EXPORT void *shmat(int id, const void *addr, int flags)
{
    void *(*f)(int, const void *, int) = __atomic_load_n(&next_shmat, __ATOMIC_ACQUIRE);
    uintptr_t p = page_size(), a = (uintptr_t)addr, end = 0, real;
    struct shmid_ds ds;
    int t = -1, t2;
    void *r;

    if ((flags & SHM_REMAP) && a && drc__preload_part(DRC__PRELOAD_HOST)) {
        if ((flags & SHM_RND) && (a & ((uintptr_t)SHMLBA - 1)))
            a &= ~((uintptr_t)SHMLBA - 1);
        if (shmctl(id, IPC_STAT, &ds) == 0 && (t = notify_pages((void *)a, ds.shm_segsz)) >= 0)
            end = a + ((ds.shm_segsz + p - 1) & ~(p - 1));
    }
    r = f ? f(id, addr, flags) : (void *)sys_result(syscall(SYS_shmat, (long)id, addr, (long)flags));
    if (end && r == (void *)a && (real = mapping_end(a)) > end) {
        t2 = begin((void *)end, real - end);
        drc__preload_end(t2);
    }
    drc__preload_end(t);
    return r;
}

/*
 * remap_file_pages (deprecated; emulated since Linux 4.0 by a MAP_FIXED
 * mapping of the file at the new offset) replaces the pages of [addr,
 * addr+size), both rounded DOWN to pages as the kernel does; it refuses a
 * nonzero @prot and any flag but MAP_NONBLOCK.
 */
EXPORT int remap_file_pages(void *addr, size_t size, int prot, size_t pgoff, int flags)
{
    int (*f)(void *, size_t, int, size_t, int) = __atomic_load_n(&next_remap_file_pages, __ATOMIC_ACQUIRE);
    uintptr_t p = page_size(), a = (uintptr_t)addr & ~(p - 1), n = size & ~(p - 1);
    int t = !prot && !(flags & ~MAP_NONBLOCK) && n && a + n > a ? begin((void *)a, n) : -1, r;

    r = f ? f(addr, size, prot, pgoff, flags)
          : (int)sys_result(syscall(SYS_remap_file_pages, addr, size, (long)prot, pgoff, (long)flags));
    drc__preload_end(t);
    return r;
}
