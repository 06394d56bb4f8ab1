/*
 * drc_strerror: one table from errno to a sentence a user can act on.
 * Everything it returns is static and constant: it is thread-safe, and never
 * calls strerror() (whose text for an unknown value lives in a shared
 * buffer). An -EIO may come from CUDA or from the backend, so its advice
 * names both.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "drc.h"

static const struct {
    int err;
    const char *msg;
} messages[] = {
    { EINVAL, "invalid argument: a NULL pointer, a zero or overflowing length, or access bits outside DRC_ACCESS_MASK" },
    { ENOMEM, "out of memory" },
    { EBUSY, "the cache still has referenced regions or registrations in flight: drc_put every region first" },
    { E2BIG, "the range is larger than the RDMA device's max_mr_size: register it in smaller pieces" },
    { EAGAIN, "the range was invalidated again and again while being registered: the memory is being freed" },
    { ENOSPC, "too many caches in this process (at most 64 subscribe to drc_notify_free)" },
    { EOPNOTSUPP, "the operation is not supported here: for GPU memory, dmabuf needs Linux >= 5.12, "
                  "rdma-core >= 34, a NIC driver with dmabuf support and the NVIDIA open kernel module" },
    { EPROTONOSUPPORT, "the RDMA provider does not support dmabuf registration: update rdma-core and the NIC driver" },
    { ENODEV, "no such device: CUDA or the RDMA device is missing" },
    { EFAULT, "the address is not mapped memory that can be registered" },
    { EPERM, "not permitted: raise the locked-memory limit (ulimit -l) or run with the needed privileges" },
    { EACCES, "access denied: VMM memory must be created with gpuDirectRDMACapable for RDMA" },
    { ENOENT, "not found" },
    { EBADF, "bad file descriptor" },
    { EIO, "an I/O error from the CUDA driver or the RDMA device: run `drc doctor`, and check dmesg for the NIC" },
    { ESTALE, "the cache was created before fork(): in the child it is inert (nothing is registered or "
              "deregistered for it); create a new cache in the child" },
};

const char *drc_strerror(int err)
{
    const char *msg;
    size_t i;

    if (err == 0)
        return "success";
    /* compare as err == -errno: -err overflows for INT_MIN */
    for (i = 0; i < sizeof(messages) / sizeof(messages[0]); i++)
        if (err == -messages[i].err)
            return messages[i].msg;
    if (err > 0)
        return "not an error code: drc errors are negative errno values";
    if (err != INT_MIN && (msg = strerrordesc_np(-err)))
        return msg;     /* glibc's constant text, the same as strerror's for a known value */
    return "unknown error";
}
