/*
 * A recording registration backend: a test double for struct drc_backend.
 *
 * There is no RDMA device in CI, so the tests plug this in instead of verbs.
 * It registers nothing: every reg() hands out a fresh handle (an id, counting
 * from 1), keys derived from it, and records the arguments; every dereg()
 * records which handle it released. It fails on request (the next reg or
 * dereg returns a chosen errno) and can run a test callback inside reg() and
 * dereg(), the place where a real backend may block or free memory and so
 * call back into the cache.
 *
 * Thread-safe: its own mutex guards the records, and it is never held while
 * a callback runs, so a callback may call anything.
 */
#ifndef DRC_TEST_BACKEND_H
#define DRC_TEST_BACKEND_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drc.h"

enum { TB_MAX = 1 << 20 };  /* handles per backend: reg() fails with -ENOSPC beyond */

struct tb_rec {
    struct drc_reg_args args;   /* what reg() was asked */
    int deregs;                 /* dereg() calls on this handle: must end at exactly 1 */
    int live;                   /* registered and not yet deregistered */
};

struct tb;
typedef int (*tb_hook)(struct tb *b, unsigned long id, void *arg);

struct tb {
    pthread_mutex_t lock;
    struct tb_rec *rec;         /* rec[id - 1] */
    unsigned long nreg;         /* handles handed out (successful reg calls) */
    unsigned long reg_calls;    /* reg() entries, failed ones included (atomic) */
    unsigned long dereg_calls;
    unsigned long bad_deregs;   /* dereg of a handle that is unknown or already released */
    unsigned long live;
    unsigned long order[TB_MAX];/* ids in the order they were deregistered */
    int reg_fail;               /* next reg() returns this (negative) errno, once */
    int reg_fail_all;           /* every reg() returns this, until cleared */
    int dereg_fail;             /* next dereg() returns this, once (the handle is released all the same) */
    /* called inside reg() after the handle is made (id) and inside dereg() (id being released);
     * the return value of reg_hook, if negative, fails the reg (the handle is then released) */
    tb_hook reg_hook, dereg_hook;
    void *reg_arg, *dereg_arg;
    struct drc_backend be;
};

static inline unsigned long tb_id(const void *handle)
{
    return (unsigned long)(uintptr_t)handle;
}

static inline uint32_t tb_lkey(unsigned long id)
{
    return (uint32_t)(0x1000 + id);
}

static inline uint32_t tb_rkey(unsigned long id)
{
    return (uint32_t)(0x80000 + id);
}

static inline int tb_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct tb *b = ctx;
    unsigned long id;
    tb_hook hook;
    int err = 0;

    __atomic_fetch_add(&b->reg_calls, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&b->lock);
    if (b->reg_fail_all) {
        err = b->reg_fail_all;
    } else if (b->reg_fail) {
        err = b->reg_fail;
        b->reg_fail = 0;
    } else if (b->nreg == TB_MAX) {
        err = -ENOSPC;
    }
    if (err) {
        pthread_mutex_unlock(&b->lock);
        return err;
    }
    id = ++b->nreg;
    b->rec[id - 1] = (struct tb_rec){ .args = *a, .deregs = 0, .live = 1 };
    b->live++;
    hook = b->reg_hook;
    pthread_mutex_unlock(&b->lock);

    if (hook && (err = hook(b, id, b->reg_arg)) < 0) {
        pthread_mutex_lock(&b->lock);   /* a failed reg leaves nothing registered */
        b->rec[id - 1].live = 0;
        b->rec[id - 1].deregs = 1;
        b->live--;
        pthread_mutex_unlock(&b->lock);
        return err;
    }
    *handle = (void *)(uintptr_t)id;
    *lkey = tb_lkey(id);
    *rkey = tb_rkey(id);
    return 0;
}

static inline int tb_dereg(void *ctx, void *handle)
{
    struct tb *b = ctx;
    unsigned long id = tb_id(handle);
    tb_hook hook;
    int err;

    pthread_mutex_lock(&b->lock);
    if (id == 0 || id > b->nreg || !b->rec[id - 1].live) {
        b->bad_deregs++;
    } else {
        b->rec[id - 1].live = 0;
        b->live--;
    }
    if (id && id <= b->nreg)
        b->rec[id - 1].deregs++;
    if (b->dereg_calls < TB_MAX)
        b->order[b->dereg_calls] = id;
    b->dereg_calls++;
    err = b->dereg_fail;
    b->dereg_fail = 0;
    hook = b->dereg_hook;
    pthread_mutex_unlock(&b->lock);
    if (hook)
        hook(b, id, b->dereg_arg);
    return err;
}

static inline struct tb *tb_new(void)
{
    struct tb *b = calloc(1, sizeof(*b));

    if (!b)
        abort();
    b->rec = calloc(TB_MAX, sizeof(*b->rec));
    if (!b->rec)
        abort();
    pthread_mutex_init(&b->lock, NULL);
    b->be = (struct drc_backend){ .reg = tb_reg, .dereg = tb_dereg, .ctx = b };
    return b;
}

static inline void tb_free(struct tb *b)
{
    pthread_mutex_destroy(&b->lock);
    free(b->rec);
    free(b);
}

/* A copy of the record of @id (locked read). */
static inline struct tb_rec tb_get(struct tb *b, unsigned long id)
{
    struct tb_rec r = { 0 };

    pthread_mutex_lock(&b->lock);
    if (id && id <= b->nreg)
        r = b->rec[id - 1];
    pthread_mutex_unlock(&b->lock);
    return r;
}

static inline int tb_is_live(struct tb *b, unsigned long id)
{
    return tb_get(b, id).live;
}

static inline unsigned long tb_live(struct tb *b)
{
    unsigned long n;

    pthread_mutex_lock(&b->lock);
    n = b->live;
    pthread_mutex_unlock(&b->lock);
    return n;
}

static inline unsigned long tb_nreg(struct tb *b)
{
    unsigned long n;

    pthread_mutex_lock(&b->lock);
    n = b->nreg;
    pthread_mutex_unlock(&b->lock);
    return n;
}

static inline unsigned long tb_dereg_calls(struct tb *b)
{
    unsigned long n;

    pthread_mutex_lock(&b->lock);
    n = b->dereg_calls;
    pthread_mutex_unlock(&b->lock);
    return n;
}

/*
 * After the cache is destroyed: every handle ever handed out was deregistered
 * exactly once and no unknown handle was. Returns 0, or -1 after printing why.
 */
static inline int tb_all_released_once(struct tb *b)
{
    unsigned long i;
    int bad = 0;

    pthread_mutex_lock(&b->lock);
    for (i = 0; i < b->nreg; i++) {
        if (b->rec[i].deregs != 1) {
            fprintf(stderr, "handle %lu deregistered %d times\n", i + 1, b->rec[i].deregs);
            bad = -1;
        }
    }
    if (b->bad_deregs) {
        fprintf(stderr, "%lu deregs of unknown or released handles\n", b->bad_deregs);
        bad = -1;
    }
    pthread_mutex_unlock(&b->lock);
    return bad;
}

#endif
