/*
 * Thread slots (tslot.h). A thread claims the lowest free bit of a 64-bit
 * mask on its first call and keeps it until it exits, when a thread-specific
 * key's destructor clears the bit. The claim is a CAS (seq_cst) on the mask
 * and so is the release, so the next owner of a slot sees everything its last
 * owner counted there: per-thread counters that are written with a plain
 * load and store by their one owner stay exact across owners. A thread that
 * finds all 64 taken gets DRC__TSLOTS, shared, where counts need atomic adds.
 */
#include "core/tslot.h"

#include <pthread.h>
#include <stdint.h>

__thread int drc__my_tslot __attribute__((tls_model("initial-exec"))) = -1;

static uint64_t taken;              /* atomic bit mask */
static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* At thread exit, in the exiting thread. A later destructor that counts again claims anew. */
static void release(void *v)
{
    drc__my_tslot = -1;
    __atomic_fetch_and(&taken, ~(1ull << ((uintptr_t)v - 1)), __ATOMIC_SEQ_CST);
}

static void key_create(void)
{
    pthread_key_create(&key, release);
}

int drc__tslot_claim(void)
{
    uint64_t m;
    int i;

    pthread_once(&once, key_create);
    m = __atomic_load_n(&taken, __ATOMIC_RELAXED);
    while (~m) {
        i = __builtin_ctzll(~m);
        if (__atomic_compare_exchange_n(&taken, &m, m | (1ull << i), 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
            pthread_setspecific(key, (void *)(uintptr_t)(i + 1));
            return drc__my_tslot = i;
        }
    }
    return drc__my_tslot = DRC__TSLOTS;
}
