/*
 * The fork registry (fork.h): one pthread_atfork handler for every layer of
 * libdrc, which runs the layers' handlers in the lock order.
 */
#include "core/fork.h"

#include <pthread.h>

static struct {
    void (*prepare)(void), (*parent)(void), (*child)(void);    /* atomic: set once */
} layer[DRC__FORK_RANKS];

#define GET(r, f) __atomic_load_n(&layer[r].f, __ATOMIC_ACQUIRE)

/* Outermost first: a layer's locks are taken before those of every layer inside it. */
static void run_prepare(void)
{
    void (*f)(void);
    int r;

    for (r = 0; r < DRC__FORK_RANKS; r++)
        if ((f = GET(r, prepare)))
            f();
}

static void run_parent(void)
{
    void (*f)(void);
    int r;

    for (r = DRC__FORK_RANKS - 1; r >= 0; r--)
        if ((f = GET(r, parent)))
            f();
}

/* Only this thread exists. */
static void run_child(void)
{
    void (*f)(void);
    int r;

    for (r = DRC__FORK_RANKS - 1; r >= 0; r--)
        if ((f = GET(r, child)))
            f();
}

static void install(void)
{
    pthread_atfork(run_prepare, run_parent, run_child);
}

void drc__fork_register(enum drc__fork_rank rank, void (*prepare)(void), void (*parent)(void),
                        void (*child)(void))
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    if ((unsigned)rank >= DRC__FORK_RANKS || GET(rank, prepare) || GET(rank, parent) || GET(rank, child))
        return;
    /* child and parent before prepare: a fork that sees the prepare runs the other two */
    __atomic_store_n(&layer[rank].child, child, __ATOMIC_RELEASE);
    __atomic_store_n(&layer[rank].parent, parent, __ATOMIC_RELEASE);
    __atomic_store_n(&layer[rank].prepare, prepare, __ATOMIC_RELEASE);
    pthread_once(&once, install);
}
