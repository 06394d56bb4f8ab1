/*
 * A number of its own for each thread (tslot.c), for counters kept per
 * thread: a thread writes its own element of an array of counters, in a
 * cache line no other live thread writes, instead of one shared atomic whose
 * line crosses between the cores at every count.
 */
#ifndef DRC_TSLOT_H
#define DRC_TSLOT_H

enum { DRC__TSLOTS = 64 };     /* threads with a slot of their own; the rest share slot DRC__TSLOTS */

extern __thread int drc__my_tslot __attribute__((tls_model("initial-exec")));

int drc__tslot_claim(void);

/*
 * This thread's slot: 0 to DRC__TSLOTS - 1, its own from its first call to
 * its exit (no other live thread has it), or DRC__TSLOTS, shared by every
 * thread that found all taken. A slot freed at a thread's exit is claimed
 * again by a later thread, which then continues the exited one's counts.
 * Lock-free; the first call of a thread may call pthread_once and
 * pthread_setspecific (no allocation after the first thread's).
 */
static inline int drc__tslot(void)
{
    int i = drc__my_tslot;

    return i >= 0 ? i : drc__tslot_claim();
}

#endif
