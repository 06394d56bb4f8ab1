"""PyTorch with tensors on two GPUs (issue 13). Needs two devices; with fewer it says SKIP and exits 0.
Prints "test_torch_multi_gpu MODE: N checks, M failed". Usage: test_torch_multi_gpu.py MODE

  pool     segments from the drc pool (drc_torch.Pool, DRC_LIB = libdrc_torch.so), one pool per device
  hooked   PyTorch's default allocator, under LD_PRELOAD=libdrc_hook.so with DRC_LIB = the libdrc.so
           the preload links (one drc in the process); also with expandable segments (cuMemUnmap)
  control  the default allocator with no hook: the freed segment's region must stay valid (the
           stale region the hook prevents), or the hooked checks prove nothing

In each mode a tensor is made on each device and registered while the OTHER device is current:
the registration is the tensor's device's (a dmabuf of it). Then device 1's tensor is freed and
its segment released (del, empty_cache): its region goes, device 0's (alive) stays valid; each
device's free memory comes back (the backend holds a dup of each dmabuf, as an MR would).
No RDMA NIC there: the backend is a recording double, as in test_torch_gpu.py."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
import drc_torch  # noqa: E402

checks = failed = 0
SIZE = 64 << 20


def check(cond, what):
    global checks, failed
    checks += 1
    if not cond:
        failed += 1
        print("  FAIL", what)


class Holder:
    """Records each registration's device and holds a dup of its dmabuf until the deregistration."""

    def __init__(self):
        self.fds, self.next, self.devices = {}, 0, []

    def reg(self, a):
        self.next += 1
        self.devices.append((a.device, a.dmabuf_fd >= 0))
        self.fds[self.next] = os.dup(a.dmabuf_fd) if a.dmabuf_fd >= 0 else -1
        return self.next, self.next, self.next

    def dereg(self, h):
        fd = self.fds.pop(h, -1)
        if fd >= 0:
            os.close(fd)


def free_mem(dev):
    return torch.cuda.mem_get_info(dev)[0]


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "pool"
    name = "test_torch_multi_gpu %s" % mode
    if torch.cuda.device_count() < 2:
        print("SKIP: %d GPU(s); this test needs two" % torch.cuda.device_count())
        print("%s: %d checks, %d failed" % (name, checks, failed))
        return 0
    print("mode %s, LD_PRELOAD=%s, PYTORCH_CUDA_ALLOC_CONF=%s" %
          (mode, os.environ.get("LD_PRELOAD", ""), os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")))
    for d in (0, 1):    # warm up each device (contexts, the fill kernel's module) before measuring
        w = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:%d" % d)
        w.fill_(1)
        torch.cuda.synchronize(d)
        del w
    torch.cuda.empty_cache()
    before = [free_mem(0), free_mem(1)]
    holder = Holder()
    cache = drc_torch.Cache(holder)
    pools = [drc_torch.Pool(), drc_torch.Pool()] if mode == "pool" else None
    x, r = [None, None], [None, None]
    for d in (0, 1):
        with torch.cuda.device(d):
            if pools:
                with pools[d].use():
                    x[d] = torch.empty(SIZE, dtype=torch.uint8, device="cuda:%d" % d)
            else:
                x[d] = torch.empty(SIZE, dtype=torch.uint8, device="cuda:%d" % d)
        x[d].fill_(d + 1)
        torch.cuda.synchronize(d)
    for d in (0, 1):
        torch.cuda.set_device(1 - d)                # the other device is current
        r[d] = cache.register(x[d])
        check(torch.cuda.current_device() == 1 - d, "the current device changed during the registration")
        dev, exported = holder.devices[-1]
        print("tensor on cuda:%d at 0x%x: registered as device %d, %s" %
              (d, x[d].data_ptr(), dev, "dmabuf" if exported else "no dmabuf"))
        check(dev == d, "device %d's tensor registered as device %d's" % (d, dev))
        check(exported, "device %d's tensor was not exported as a dmabuf" % d)
    # free device 1's tensor and release its segment, from device 0
    torch.cuda.set_device(0)
    x[1] = None
    torch.cuda.synchronize(1)
    if pools:
        pools[1] = None     # the pool's segments go with it (drc_torch_free)
    torch.cuda.empty_cache()
    torch.cuda.synchronize(1)
    if mode == "control":
        check(r[1].valid, "control: without a hook the freed segment's region stays valid (the hazard)")
    else:
        check(not r[1].valid, "device 1's freed segment: its region is still valid")
    check(r[0].valid, "device 0's region (its tensor alive) was invalidated by device 1's free")
    r[1].release()
    after1 = free_mem(1)
    print("cuda:1 free memory: before %d MiB, after the free %d MiB" % (before[1] >> 20, after1 >> 20))
    if mode != "control":
        check(after1 + (16 << 20) >= before[1], "device 1's memory was not released (%d MiB short)" %
              ((before[1] - after1) >> 20))
    # device 0 then goes too, and the cache is closed: every dmabuf released, both devices back
    r[0].release()
    x = None
    pools = None
    cache.close()
    torch.cuda.empty_cache()
    check(not holder.fds, "every registration released")
    after = [free_mem(0), free_mem(1)]
    print("free memory: cuda:0 %d -> %d MiB, cuda:1 %d -> %d MiB" %
          (before[0] >> 20, after[0] >> 20, before[1] >> 20, after[1] >> 20))
    for d in (0, 1):
        check(after[d] + (16 << 20) >= before[d], "cuda:%d not back to its free memory (%d MiB short)" %
              (d, (before[d] - after[d]) >> 20))
    print("%s: %d checks, %d failed" % (name, checks, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
