/*
 * loopnic's record: every registration, deregistration, dmabuf probe, ibv_query_device,
 * ibv_rereg_mr and ibv_dealloc_pd of the process, with the exact arguments, and what a test wants
 * to know about the memory at that moment (at a deregistration: is the range still mapped, and
 * one byte of it; at a dmabuf registration: what the fd is and how large), plus controls to make
 * those calls fail. The tests that check drc's exact arguments (tests/verbs/, tests/preload/,
 * the engine children tests/engine/, tests/bench/bench_engine.c) read it; loopnic is the one libibverbs
 * double (issue 8). Exported by build/loopnic/libibverbs.so.1 and libloopnic.so under LOOPNIC_1;
 * a program linked against the real libibverbs finds these with dlsym. Thread-safe.
 *
 * What the record adds to loopnic's rules (README.md): the buffer-less dmabuf probe drc makes,
 * ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0), is recorded as IBVD_PROBE and fails with
 * ibvd_set_probe_errno's errno (EBADF, "this NIC does dmabuf", by default) instead of being
 * checked as a registration; ibv_rereg_mr(IBV_REREG_MR_CHANGE_ACCESS) of one of loopnic's MRs
 * changes its access; ibv_dereg_mr of a copy of an MR (a cache's caller MR) is recorded as
 * IBVD_DEREG_UNKNOWN (and deregisters by handle, as the kernel does).
 */
#ifndef LOOPNIC_RECORD_H
#define LOOPNIC_RECORD_H

#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

enum ibvd_op {
    IBVD_REG_VA = 1, IBVD_REG_DMABUF = 2, IBVD_DEREG = 3,
    IBVD_DEREG_UNKNOWN = 4, /* ibv_dereg_mr of an ibv_mr loopnic did not hand out (a copy, or garbage) */
    IBVD_PROBE = 5,         /* ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0): drc's buffer-less dmabuf probe */
    IBVD_QUERY = 6,         /* ibv_query_device */
    IBVD_REREG = 7,         /* ibv_rereg_mr, whatever it answered */
    IBVD_DEALLOC_PD = 8,    /* ibv_dealloc_pd, whatever it answered */
    IBVD_NOPS
};

struct ibvd_call {
    enum ibvd_op op;
    const struct ibv_pd *pd;
    const void *ctx;            /* QUERY: the context asked */
    const struct ibv_mr *mr;    /* the MR made, released or re-registered */
    int ret;                    /* QUERY, REREG, DEALLOC_PD, DEREG: what the call returned; PROBE: its errno */
    uintptr_t addr;             /* REG_VA: the address; REG_DMABUF: the iova; DEREG: what the MR covered */
    size_t len;
    uint64_t iova, offset;      /* offset: REG_DMABUF only */
    int fd;                     /* REG_DMABUF */
    unsigned access;
    uint32_t lkey, rkey;
    int kind;                   /* DEREG: the op that made the MR; REREG: the flags */
    int mapped;                 /* DEREG of a VA MR: 1 if every page of the range was still mapped */
    int first_byte;             /* DEREG of a VA MR, with IBVD_READ_AT_DEREG=1 in the environment: the byte
                                 * ibvd_probe() named if the MR covers it, else the range's first byte,
                                 * as it was then; -1 if unmapped or not asked */
    char fd_link[48];           /* REG_DMABUF: readlink of /proc/self/fd/<fd> ("/dmabuf:" for a real one) */
    long long fd_size;          /* REG_DMABUF: lseek(fd, 0, SEEK_END), -1 if it cannot seek */
};

/* Calls recorded so far (the first 65,536); ibvd_call copies the i-th (0 if there is none). */
size_t ibvd_ncalls(void);
int ibvd_call(size_t i, struct ibvd_call *out);
/* Forget the record (MRs stay registered) and put every control below back to its default. */
void ibvd_reset(void);
/* The next registration (VA or dmabuf, not the probe) fails with errno @err (0: none fails). */
void ibvd_fail_next_reg(int err);
/* The errno of drc's buffer-less dmabuf probe: EBADF (the default) says "this NIC does dmabuf". */
void ibvd_set_probe_errno(int err);
/* ibv_dereg_mr releases the MR and returns @ret (default 0). */
void ibvd_set_dereg_ret(int ret);
/* ibv_query_device returns @ret, and reports @max_mr_size (0: loopnic's own, LOOPNIC_MAX_MR_SIZE). */
void ibvd_set_query(int ret, unsigned long long max_mr_size);
/* MRs registered now, and whether @lkey is one of them. */
size_t ibvd_live(void);
int ibvd_lkey_live(uint32_t lkey);
/* The byte that deregistrations of VA MRs covering it record (NULL: their first byte). */
void ibvd_probe(const void *addr);
/* Calls of kind @op since the start or ibvd_reset (counted past the record's cap), and bytes registered. */
size_t ibvd_count(enum ibvd_op op);
unsigned long long ibvd_reg_bytes(void);

#endif
