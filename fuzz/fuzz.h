/*
 * Helpers shared by the fuzz targets.
 *
 * FUZZ_ASSERT is always on (NDEBUG does not remove it): a broken property
 * aborts with the line, which libFuzzer and the standalone replayer both
 * report as a crash. struct fuzz_in draws parameters from the input; once the
 * input is used up every draw returns 0, so any input is a valid program.
 */
#ifndef DRC_FUZZ_H
#define DRC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_ASSERT(cond)                                                                 \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: FUZZ_ASSERT(%s) failed\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

struct fuzz_in {
    const uint8_t *p;
    size_t n;
};

static inline int fuzz_more(const struct fuzz_in *in)
{
    return in->n > 0;
}

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fuzz_u32(struct fuzz_in *in)
{
    uint32_t v = 0;
    int i;

    for (i = 0; i < 4; i++)
        v = v << 8 | fuzz_u8(in);
    return v;
}

/* A value in [lo, hi] (hi >= lo), from as few bytes as the span needs. */
static inline uint64_t fuzz_range(struct fuzz_in *in, uint64_t lo, uint64_t hi)
{
    uint64_t span = hi - lo, v = 0;

    if (span == 0)
        return lo;
    if (span < 0xff)
        v = fuzz_u8(in);
    else if (span < 0xffff)
        v = (uint64_t)fuzz_u8(in) << 8 | fuzz_u8(in);
    else
        v = fuzz_u32(in);
    return span == UINT64_MAX ? v : lo + v % (span + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
