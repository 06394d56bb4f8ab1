/*
 * A recording DOUBLE of libibverbs.so.1 (there is no RDMA NIC in CI, nor on
 * the GPU test machine). Built as build/engine/libibverbs.so.1 with the same
 * soname and symbol versions, and put in front of the real one through
 * LD_LIBRARY_PATH.
 *
 * It has one device ("drc_double0"), whose PDs and MRs are plain memory.
 * Like rdma-core 44, its exported ibv_reg_mr and ibv_reg_mr_iova call
 * ibv_reg_mr_iova2 through the PLT, and ibv_reg_dmabuf_mr leaves the dmabuf
 * offset in mr->addr. ibv_reg_dmabuf_mr(fd -1) fails with EBADF, as a NIC
 * with dmabuf support does. Every registration and deregistration is
 * recorded, with what a test wants to know about the memory at that moment
 * (at a deregistration: is the range still mapped, and its first byte; at a
 * dmabuf registration: what the fd is and how large). ibv_dereg_mr of an MR
 * it did not make is recorded and refused with EINVAL (the real library
 * would corrupt memory). ibv_dealloc_pd fails with EBUSY while MRs of the PD
 * are registered, as the kernel does. Thread-safe.
 */
#ifndef IBVERBS_DOUBLE_H
#define IBVERBS_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

enum ibvd_op { IBVD_REG_VA = 1, IBVD_REG_DMABUF = 2, IBVD_DEREG = 3, IBVD_DEREG_UNKNOWN = 4 };

struct ibvd_call {
    enum ibvd_op op;
    const struct ibv_pd *pd;
    const struct ibv_mr *mr;    /* the MR made or released */
    uintptr_t addr;             /* REG_VA: the address; REG_DMABUF: the iova; DEREG: what the MR covered */
    size_t len;
    uint64_t iova, offset;      /* offset: REG_DMABUF only */
    int fd;                     /* REG_DMABUF */
    unsigned access;
    uint32_t lkey, rkey;
    int kind;                   /* DEREG: the op that made the MR */
    int mapped;                 /* DEREG of a VA MR: 1 if every page of the range was still mapped */
    int first_byte;             /* DEREG of a VA MR: the byte ibvd_probe() named if the MR covers it, else
                                 * the range's first byte, as it was then; -1 if unmapped */
    char fd_link[48];           /* REG_DMABUF: readlink of /proc/self/fd/<fd> ("/dmabuf:" for a real one) */
    long long fd_size;          /* REG_DMABUF: lseek(fd, 0, SEEK_END), -1 if it cannot seek */
};

/* Calls recorded so far (the first 65,536); ibvd_call copies the i-th (0 if there is none). */
size_t ibvd_ncalls(void);
int ibvd_call(size_t i, struct ibvd_call *out);
/* Forget the record (MRs stay registered). */
void ibvd_reset(void);
/* MRs registered now, and whether @lkey is one of them. */
size_t ibvd_live(void);
int ibvd_lkey_live(uint32_t lkey);
/* The byte that deregistrations of VA MRs covering it record (NULL: their first byte). */
void ibvd_probe(const void *addr);
/* Calls of kind @op since the start or ibvd_reset (counted past the record's cap), and bytes registered. */
size_t ibvd_count(enum ibvd_op op);
unsigned long long ibvd_reg_bytes(void);

#endif
