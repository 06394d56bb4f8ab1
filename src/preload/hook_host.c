/*
 * The host part of the preload library (preload.c): the libc calls that take
 * pages away from a range of the address space begin the free of the range
 * in every attached drc first (drc__hook_begin_unmap: invalidated and marked
 * as being freed), then do what was asked, then end it. With the host part
 * off (DRC_PRELOAD without host) they only do what was asked.
 *
 * A registered host MR pins the pages it was registered on. Once the range
 * is unmapped (munmap, mremap moving or shrinking it, brk/sbrk shrinking the
 * heap, shmdt), or its pages are dropped (madvise DONTNEED, FREE, REMOVE),
 * the same addresses get other pages on the next touch while the cached MR
 * still points the NIC at the old ones: the cache must forget the range
 * before that can happen, so the notification comes before the real call.
 * Over-invalidation is harmless (the next registration misses), so where
 * the kernel's exact effect is hard to know (mremap with MREMAP_MAYMOVE) the
 * whole old range is notified.
 *
 * Rules for this file: it runs inside allocators (jemalloc purges with
 * madvise, libnuma frees with munmap), so it allocates nothing and takes no
 * lock an allocator may hold. The next definitions are looked up once, in a
 * constructor; a call that comes before it (from the dynamic loader's own
 * malloc, say) goes to the system call, or for brk/sbrk to glibc's exported
 * __sbrk, which keeps glibc's idea of the break right (a raw brk would not).
 *
 * Not seen: calls that never pass through the dynamic symbol table — glibc's
 * own malloc/free reach munmap, madvise and sbrk through internal aliases,
 * and statically linked or inline system calls do too. Memory that is
 * registered must therefore come from an allocator that calls these through
 * libc's exported names (jemalloc, libnuma, plain mmap), from
 * drc_host_alloc(), or be registered for the life of the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload/hook_preload.h"

#define EXPORT __attribute__((visibility("default")))

extern void *__sbrk(intptr_t increment);

static int (*next_munmap)(void *, size_t);
static void *(*next_mremap)(void *, size_t, size_t, int, ...);
static int (*next_madvise)(void *, size_t, int);
static int (*next_brk)(void *);
static void *(*next_sbrk)(intptr_t);
static int (*next_shmdt)(const void *);

__attribute__((constructor)) static void hook_host_init(void)
{
    /* each store is atomic so that a thread racing the constructor sees NULL or the function */
#define NEXT(name) drc__hook_real_dlsym(RTLD_NEXT, name)
    __atomic_store_n(&next_munmap, (int (*)(void *, size_t))NEXT("munmap"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_mremap, (void *(*)(void *, size_t, size_t, int, ...))NEXT("mremap"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_madvise, (int (*)(void *, size_t, int))NEXT("madvise"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_brk, (int (*)(void *))NEXT("brk"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_sbrk, (void *(*)(intptr_t))NEXT("sbrk"), __ATOMIC_RELEASE);
    __atomic_store_n(&next_shmdt, (int (*)(const void *))NEXT("shmdt"), __ATOMIC_RELEASE);
#undef NEXT
}

/* Begin the free of [addr, addr+len) in every attached drc, if the host part is on: tickets or -1. */
static int begin(const void *addr, size_t len)
{
    return drc__preload_part(DRC__PRELOAD_HOST) ? drc__hook_begin_unmap((uintptr_t)addr, len) : -1;
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

/* [addr, addr+len) as the kernel treats it: len rounded up to whole pages. Tickets or -1. */
static int notify_pages(const void *addr, size_t len)
{
    uintptr_t p = page_size(), a = (uintptr_t)addr;

    if (!len || len > UINTPTR_MAX - a - p)
        return -1;  /* the kernel will refuse the call (EINVAL); nothing goes */
    return begin(addr, (len + p - 1) & ~(p - 1));
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
    drc__hook_end(t);
    return r;
}

EXPORT void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
    void *(*f)(void *, size_t, size_t, int, ...) = __atomic_load_n(&next_mremap, __ATOMIC_ACQUIRE);
    void *new_addr = NULL, *r;
    int t1 = -1, t2 = -1;
    va_list ap;

    if (flags & MREMAP_FIXED) {
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
        t1 = notify_pages(new_addr, new_size);      /* whatever was mapped at the target goes */
    }
    if (flags & (MREMAP_MAYMOVE | MREMAP_FIXED))
        t2 = notify_pages(old, old_size);           /* the pages may leave these addresses */
    else if (new_size < old_size)
        t2 = notify_pages((char *)old + new_size, old_size - new_size);
    if (f) {
        r = (flags & MREMAP_FIXED) ? f(old, old_size, new_size, flags, new_addr) : f(old, old_size, new_size, flags);
    } else {
        long s = syscall(SYS_mremap, old, old_size, new_size, flags, new_addr);

        r = sys_result(s) == -1 ? MAP_FAILED : (void *)s;
    }
    drc__hook_end(t2);
    drc__hook_end(t1);
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
    drc__hook_end(t);
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
    drc__hook_end(t);
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
    drc__hook_end(t);
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
    drc__hook_end(t);
    return r;
}
