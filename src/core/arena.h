/*
 * A cache's own memory: region chunks, index nodes and hint table headers,
 * carved from large anonymous mappings, and the hint slots' address space
 * (see arena.c).
 */
#ifndef DRC_ARENA_H
#define DRC_ARENA_H

#include <pthread.h>
#include <stddef.h>

struct drc__arena_map;

struct drc__arena {
    pthread_mutex_t lock;           /* the fields below; held only for the pointer arithmetic, no call */
    struct drc__arena_map *maps;    /* every mapping of the arena, newest first */
    struct drc__arena_rest {        /* what is left to carve: of the newest mapping and of another, which */
        char *cur, *end;            /* a request too large for it left behind; each [cur, end) */
        int dirty;                  /* in a reused mapping: zero what is carved */
        int huge;                   /* its huge pages are collapsed as the carve passes them (arena.c) */
    } rest[2];
    size_t next;                    /* the size of the next mapping */
    size_t mapped;                  /* bytes mapped, all mappings */
    int lazy;                       /* drc__arena_init_lazy */
};

/* An empty arena (no memory yet). */
void drc__arena_init(struct drc__arena *a);

/*
 * An empty arena for memory that most of its users never write (the region
 * records' second lines, cache_int.h): the arena writes nothing it hands out,
 * in any build, so a page of it is resident only once its caller writes it.
 * Its mappings are never kept for, nor taken from, other arenas: fresh, or
 * kept from an earlier lazy arena with their pages given back, so what it
 * hands out reads zero; and advised MADV_NOHUGEPAGE, so a write makes 4 KiB
 * resident, not 2 MiB. Only each mapping's first page is written (its
 * header). drc__arena_alloc and drc__arena_alloc_raw are then the same.
 * drc__arena_keep(0) unmaps the kept ones too.
 */
void drc__arena_init_lazy(struct drc__arena *a);

/*
 * @size bytes, zeroed, 64-byte aligned, or NULL without memory. Never with a
 * cache lock held (it may map memory). The memory stays until
 * drc__arena_fini(): there is no free.
 */
void *drc__arena_alloc(struct drc__arena *a, size_t size);

/*
 * The same without the zeroing: the contents are whatever a destroyed arena
 * left (zero in a fresh mapping). For memory the caller initialises anyway
 * (pool chunks: pool_get sets every field a free region must have).
 * DRC_DEBUG builds fill it with 0xa5, so that the tests catch a caller that
 * counts on zero.
 */
void *drc__arena_alloc_raw(struct drc__arena *a, size_t size);

/*
 * Address space for a table that grows in place (the hint table's slots,
 * cache_hint.c): @size bytes (a power of two, at least DRC__ARENA_HUGE),
 * DRC__ARENA_HUGE-aligned, resident only where written. Its first
 * DRC__ARENA_HUGE bytes are advised MADV_NOHUGEPAGE, so that the table of a
 * small cache stays small; the rest MADV_HUGEPAGE. *dirty: how many of its
 * first bytes may not read zero, which the caller zeroes before it uses
 * them: 0 for a fresh mapping, what its last owner wrote for a kept one.
 * NULL without memory. Never with a cache lock held (it may map memory).
 */
void *drc__arena_table(size_t size, size_t *dirty);

/*
 * Give back a table from drc__arena_table() of which the first @dirty bytes
 * may have been written: kept for a later one (DRC__ARENA_KEEP counts
 * @dirty), or unmapped. Never with a cache lock held.
 */
void drc__arena_table_fini(void *p, size_t size, size_t dirty);

/* Give every mapping back: kept for the next arena (within the process-wide bound) or unmapped. */
void drc__arena_fini(struct drc__arena *a);

/* In a fork() child: the arena's lock may have been held by a thread the child does not have. */
void drc__arena_forked(struct drc__arena *a);

/*
 * The bound on bytes kept for later arenas, process-wide (default
 * DRC__ARENA_KEEP; DRC_DEBUG builds keep none, so that memory used after
 * drc_cache_destroy() faults). Lowering it unmaps what is kept beyond it
 * (tables last); 0 unmaps every kept mapping and table.
 * Returns the bytes kept now.
 */
size_t drc__arena_keep(size_t max);

enum { DRC__ARENA_HUGE = 2 << 20 };     /* mappings this large or larger take huge pages as they fill (arena.c) */
#define DRC__ARENA_KEEP ((size_t)64 << 20)

#endif
