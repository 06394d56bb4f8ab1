"""The PyTorch pool on a real GPU (issue 4): segments from drc_torch_malloc
export as dmabufs, and freeing a segment (del pool + empty_cache) invalidates
its registrations before the memory goes, so the memory is really released.
No RDMA NIC there: the backend is a recording double that dup()s the dmabuf
fd, as an MR holds the buffer. Prints "test_torch_gpu: N checks, M failed".

Issue 9 item 7 (views_register_their_own_bytes, dropped_cache_is_destroyed): on the code before
the fix, Cache.register(b[4096:]) registered 4096 bytes past b's storage and a strided view the
whole rest of its storage, and a Cache dropped without close() was never destroyed (its dmabuf
stayed held and its ctypes callbacks dangled in the notify table): those checks fail there."""
import ctypes
import gc
import mmap
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
import drc_torch  # noqa: E402

checks = failed = 0


def check(cond, what):
    global checks, failed
    checks += 1
    if not cond:
        failed += 1
        print("  FAIL", what)


class Holder:
    def __init__(self):
        self.fds, self.next, self.exported, self.asked = {}, 0, 0, []

    def reg(self, a):
        self.asked.append((a.start, a.len))
        self.next += 1
        self.fds[self.next] = os.dup(a.dmabuf_fd) if a.dmabuf_fd >= 0 else -1
        self.exported += a.dmabuf_fd >= 0
        return self.next, self.next, self.next

    def dereg(self, h):
        fd = self.fds.pop(h, -1)
        if fd >= 0:
            os.close(fd)


def mem_free():
    return torch.cuda.mem_get_info()[0]


def page_up(n):
    return (n + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


def views_register_their_own_bytes():
    """Cache.register(view) registers the view's bytes, never past them to the end of the storage."""
    holder = Holder()
    cache = drc_torch.Cache(holder)
    b = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    base = b.data_ptr()
    storage_end = base + b.untyped_storage().nbytes()
    v = b[4096:]
    r = cache.register(v)
    start, n = holder.asked[-1]
    print("b[4096:] of a 1 MiB tensor at 0x%x: registered [0x%x, 0x%x), storage ends 0x%x" %
          (base, start, start + n, storage_end))
    check(start <= v.data_ptr() and start + n >= base + (1 << 20), "b[4096:]'s bytes are registered")
    check(start + n <= page_up(storage_end), "b[4096:] registers nothing past its storage (%d bytes over)" %
          (start + n - page_up(storage_end)))
    r.release()
    cache.close()
    cache = drc_torch.Cache(holder)           # a fresh cache: in the first, the view below would be a hit
    m = b.view(256, 4096)[10:20, 100:200]     # strided: rows 10..19, columns 100..199
    lo, hi = base + 10 * 4096 + 100, base + 19 * 4096 + 200
    r = cache.register(m)
    start, n = holder.asked[-1]
    check(start <= lo and start + n >= hi, "a strided view's bytes are registered")
    check(start + n <= page_up(hi), "a strided view registers up to its last element only (ends 0x%x, not 0x%x)" %
          (start + n, page_up(hi)))
    r.release()
    cache.close()
    del b, v, m


def dropped_cache_is_destroyed():
    """A Cache dropped without close() is destroyed when collected: its registrations released, and
    nothing of it left in the notify table for a later free to call."""
    holder = Holder()
    cache = drc_torch.Cache(holder)
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    cache.register(x).release()
    check(len(holder.fds) == 1, "the idle registration stays cached (its dmabuf held)")
    del cache
    gc.collect()
    check(not holder.fds, "a Cache dropped without close() was destroyed (its dmabuf released)")
    if not holder.fds:   # (on the old code a free here would call the dead cache's freed ctypes callbacks)
        lib = (getattr(drc_torch, "load", None) or drc_torch._load)()
        check(lib.drc_notify_free(ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(x.nbytes)) == 0,
              "a free of its memory finds no cache")
    del x


def main():
    torch.cuda.init()
    size = 256 << 20
    holder = Holder()
    cache = drc_torch.Cache(holder)
    pool = drc_torch.Pool()
    # warm up outside the pool: the fill kernel's module loads lazily and takes memory of its own
    w = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    w.fill_(1)
    torch.cuda.synchronize()
    before = mem_free()
    with pool.use():
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
    x.fill_(7)
    torch.cuda.synchronize()
    cuda = ctypes.CDLL("libcuda.so.1")
    h = ctypes.c_ulonglong()
    vmm = cuda.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(x.data_ptr())) == 0
    if vmm:
        cuda.cuMemRelease(h)
    print("segment kind: %s" % ("VMM (cuMemCreate, gpuDirectRDMACapable)" if vmm else "cuMemAlloc"))
    r = cache.register(x)
    check(holder.exported == 1, "the pool segment exported as a dmabuf")
    old_handle = r.handle
    ptr = x.data_ptr()
    print("segment at 0x%x, registered, handle %d" % (ptr, old_handle))
    del x
    torch.cuda.synchronize()
    check(r.valid, "freeing the tensor keeps the segment (PyTorch caches the block)")
    del pool
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    check(not r.valid, "the segment free invalidated the region before the memory went")
    r.release()     # the region was detached: its last put deregisters it, closing the held dmabuf
    after = mem_free()
    print("mem_get_info free: before %d MiB, after segment free %d MiB" % (before >> 20, after >> 20))
    check(after + (16 << 20) >= before, "the segment's memory was released (%d MiB short)" % ((before - after) >> 20))
    # a new pool: the same size again, registered anew (never the old region)
    pool2 = drc_torch.Pool()
    with pool2.use():
        y = torch.empty(size, dtype=torch.uint8, device="cuda")
    print("second segment at 0x%x (%s VA)" % (y.data_ptr(), "same" if y.data_ptr() == ptr else "different"))
    s0 = cache.stats()
    r2 = cache.register(y)
    check(r2.handle != old_handle and cache.stats()["misses"] == s0["misses"] + 1, "a fresh registration")
    r2.release()
    del y
    del pool2
    torch.cuda.empty_cache()
    cache.close()
    check(not holder.fds, "every registration released")
    views_register_their_own_bytes()
    dropped_cache_is_destroyed()
    print("test_torch_gpu: %d checks, %d failed" % (checks, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
