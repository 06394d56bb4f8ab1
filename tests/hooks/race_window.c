/*
 * The test build of the preload (build/hooktest/race/) compiles preload.c with
 * DRC_PRELOAD_RACE_WINDOW() calling this: a short sleep at each point of
 * from_drc where another thread's step could come between two of this
 * thread's, so that a race there shows in a few thousand calls rather than
 * once in a long while. The product builds it to nothing.
 */
#include <time.h>

__attribute__((visibility("hidden"))) void drc__test_race_window(void);

void drc__test_race_window(void)
{
    struct timespec ts = { 0, 20000 };

    nanosleep(&ts, NULL);
}
