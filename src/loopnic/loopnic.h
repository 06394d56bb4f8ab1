/* loopnic: a loopback verbs provider for tests (see README.md in this folder).
 *
 * The control API below is exported by build/loopnic/libibverbs.so.1 and build/loopnic/libloopnic.so
 * under the version node LOOPNIC_1. A test looks each function up with dlsym(RTLD_DEFAULT, ...) so
 * that it still runs (and skips what needs loopnic) against a real libibverbs. The typedefs are the
 * types of those functions.
 */
#ifndef LOOPNIC_H
#define LOOPNIC_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct loopnic_counters {
    uint64_t live_mrs;        /* MRs registered and not yet deregistered */
    uint64_t total_regs;      /* successful ibv_reg_mr* and ibv_reg_dmabuf_mr */
    uint64_t dmabuf_regs;     /* successful ibv_reg_dmabuf_mr */
    uint64_t dmabuf_inodes;   /* distinct dmabuf (st_dev, st_ino) ever registered */
    uint64_t deregs;          /* successful ibv_dereg_mr */
    uint64_t reg_failures;    /* registrations refused (bad arguments, GPU memory, injected) */
    uint64_t wrs;             /* send work requests executed or flushed */
    uint64_t wr_errors;       /* completions with a status other than IBV_WC_SUCCESS */
    uint64_t prot_errors;     /* IBV_WC_LOC_PROT_ERR + IBV_WC_REM_ACCESS_ERR completions */
    uint64_t stale_uses;      /* work requests through an MR whose memory was freed or remapped */
    uint64_t bytes_moved;     /* payload bytes really copied */
    uint64_t foreign_deregs;  /* ibv_dereg_mr of a copy of one of our ibv_mr (deregistered by handle) */
    uint64_t dmabuf_held;     /* live dmabuf MRs: each holds an fd of its dmabuf, as the kernel's MR holds the file */
    uint64_t recvs;           /* receive WQEs consumed (at a peer too) by SENDs and WRITE_WITH_IMM executed here */
    uint64_t atomics;         /* atomic WRs executed */
    uint64_t rnr_naks;        /* attempts that found no receive posted at the responder (retried or failed) */
};

/* Counters of device dev (0 .. loopnic_num_devices()-1), or of all devices with dev = -1.
 * Returns 0, or -1 for a device out of range. Counters are per process. */
int loopnic_get_counters(int dev, struct loopnic_counters *out);
typedef int loopnic_get_counters_fn(int dev, struct loopnic_counters *out);

/* Zero every counter but live_mrs and dmabuf_held; forget the dmabuf inodes seen. */
void loopnic_reset_counters(void);
typedef void loopnic_reset_counters_fn(void);

/* Failure injection: the n-th call from now (1 = the next one) fails; n = 0 cancels.
 * loopnic_fail_reg counts ibv_reg_mr, ibv_reg_mr_iova, ibv_reg_mr_iova2 (errno err, ENOMEM if 0);
 * loopnic_fail_dmabuf_reg counts ibv_reg_dmabuf_mr (errno err, ENOMEM if 0);
 * loopnic_fail_wr counts send work requests: that one completes with status (IBV_WC_RETRY_EXC_ERR
 * if 0), moves no data, and its QP goes to the error state.
 * The environment variables LOOPNIC_FAIL_REG, LOOPNIC_FAIL_DMABUF_REG and LOOPNIC_FAIL_WR give
 * the same from the start of the process. */
void loopnic_fail_reg(unsigned long n, int err);
void loopnic_fail_dmabuf_reg(unsigned long n, int err);
void loopnic_fail_wr(unsigned long n, int status);
typedef void loopnic_fail_fn(unsigned long n, int err_or_status);

/* Queue an asynchronous event on ctx, read back by ibv_get_async_event() (ctx->async_fd becomes
 * readable). element is the ibv_qp / ibv_cq / ibv_srq the event is about, or the port number cast
 * with (void *)(uintptr_t) for port events. Returns 0 or an errno value. */
int loopnic_raise_async_event(struct ibv_context *ctx, enum ibv_event_type type, void *element);
typedef int loopnic_raise_async_event_fn(struct ibv_context *ctx, enum ibv_event_type type, void *element);

/* Number of devices (LOOPNIC_DEVICES, default 2). */
int loopnic_num_devices(void);
typedef int loopnic_num_devices_fn(void);

/* max_mr_size reported by ibv_query_device and enforced by registration (LOOPNIC_MAX_MR_SIZE). */
void loopnic_set_max_mr_size(uint64_t size);
typedef void loopnic_set_max_mr_size_fn(uint64_t size);

/* Declare [start, start+len) device memory, for a CUDA double that is not a libcuda.so.1 (drc's
 * fake driver table in an in-process test): ibv_reg_mr* of it then needs LOOPNIC_PEERMEM=1, as GPU
 * memory does. len 0 forgets every range. Returns 0, or ENOMEM beyond 16 ranges. Not thread-safe
 * against registrations. */
int loopnic_add_device_memory(uint64_t start, uint64_t len);
typedef int loopnic_add_device_memory_fn(uint64_t start, uint64_t len);

/* 1 if the MR saw its memory freed or remapped since it was registered (whole or in part). */
int loopnic_mr_is_stale(struct ibv_mr *mr);
typedef int loopnic_mr_is_stale_fn(struct ibv_mr *mr);

#ifdef __cplusplus
}
#endif
#endif
