"""End to end over PyTorch tensors on the GPU machine (issue 10): tensors carved by PyTorch's
allocators are registered through drc's verbs cache (drc_torch.Cache.verbs), and bytes move
through the MRs drc handed out, on the loopback provider (LD_LIBRARY_PATH=build/loopnic: RDMA
WRITE/READ with cuMemcpy, key/bounds/access checks, stale uses counted by CUDA buffer id).
One process, two QPs connected to each other (tests/gpu/e2e_nic.c, loaded with ctypes).
Usage: test_torch_e2e_gpu.py MODE; prints "test_torch_e2e_gpu MODE: N checks, M failed".

  pool     segments from drc_torch.Pool (DRC_LIB = libdrc_torch.so); a segment goes when its pool
           is deleted and the cache emptied, and drc_torch_free invalidates it first
  hooked   PyTorch's default allocator (cudaMalloc segments; or expandable segments, or the
           cudaMallocAsync backend, through PYTORCH_CUDA_ALLOC_CONF) under
           LD_PRELOAD=libdrc_hook.so, DRC_LIB = the libdrc.so the preload links
  control  the default allocator, nothing tells drc of the free: the hazard must show (the old
           MR handed back, the bytes not in the new tensor, loopnic counting stale uses), or the
           hooked checks prove nothing

In each mode:
  carved   tensors of several sizes and dtypes, and views, that the allocator packs into shared
           segments and pages, each registered on its own (regions coalesce where pages are
           shared); a WRITE into each lands in its bytes and nowhere else (every other tensor
           keeps its background), a READ brings them back.
  hazard   a 64 MiB tensor (a segment of its own) registered, written, its region put; the tensor
           deleted and the segment released (empty_cache); a new 64 MiB tensor at the same VA
           registered and written: with drc told, a new MR, the bytes land, 0 stale uses.
Then the cache is closed and the PD deallocated: no MR of drc's is left."""
import ctypes
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src", "python"))
import drc_torch  # noqa: E402

ACC = drc_torch.IBV_ACCESS_LOCAL_WRITE | drc_torch.IBV_ACCESS_REMOTE_WRITE | drc_torch.IBV_ACCESS_REMOTE_READ
STAGING = 4 << 20
BIG = 64 << 20
checks = failed = 0


def check(cond, what):
    global checks, failed
    checks += 1
    if not cond:
        failed += 1
        print("  FAIL", what)


def nic_lib():
    path = os.environ.get("E2E_NIC_LIB") or os.path.join(HERE, "..", "..", "build", "gpu", "libe2e_nic.so")
    nic = ctypes.CDLL(path)
    nic.e2e_nic_open.argtypes = [ctypes.c_size_t]
    nic.e2e_nic_pd.restype = ctypes.c_void_p
    nic.e2e_nic_staging.restype = ctypes.c_void_p
    nic.e2e_nic_xfer.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t]
    nic.e2e_nic_counters.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 3
    nic.e2e_nic_counters.restype = None
    return nic


class Nic:
    def __init__(self):
        self.lib = nic_lib()
        rc = self.lib.e2e_nic_open(STAGING)
        if rc != 0:
            raise OSError(-rc, "e2e_nic_open")
        self.pd = self.lib.e2e_nic_pd()
        self.staging = self.lib.e2e_nic_staging()

    def counters(self):
        """(stale uses, live MRs, refused registrations), -1 each where the provider is not loopnic."""
        s, m, f = ctypes.c_longlong(), ctypes.c_longlong(), ctypes.c_longlong()
        self.lib.e2e_nic_counters(ctypes.byref(s), ctypes.byref(m), ctypes.byref(f))
        return s.value, m.value, f.value

    def stale(self):
        return self.counters()[0]

    def write(self, host_bytes, addr, rkey):
        """WRITE a CPU uint8 tensor's bytes to addr through rkey; the completion status."""
        n = host_bytes.numel()
        ctypes.memmove(self.staging, host_bytes.data_ptr(), n)
        return self.lib.e2e_nic_xfer(1, addr, rkey, n)

    def read(self, addr, rkey, n):
        """READ n bytes from addr through rkey: (status, CPU uint8 tensor)."""
        ctypes.memset(self.staging, 0, n)
        st = self.lib.e2e_nic_xfer(0, addr, rkey, n)
        out = torch.empty(n, dtype=torch.uint8)
        ctypes.memmove(out.data_ptr(), self.staging, n)
        return st, out


def pattern(n, seed):
    return ((torch.arange(n, dtype=torch.int64) * (7 + 2 * seed) + seed * 31 + 1) % 251).to(torch.uint8)


def as_bytes(t):
    """The bytes of a contiguous tensor (or view), as a uint8 tensor on its device."""
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def buffer_id(ptr):
    cuda = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_ulonglong()
    return v.value if cuda.cuPointerGetAttribute(ctypes.byref(v), 7, ctypes.c_uint64(ptr)) == 0 else None


def explain(t, nic_refused):
    """Why a registration of t may have failed: the driver's view of its allocation and exports."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr, n = drc_torch.span(t)
    pg = 4096
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    print("    tensor [0x%x, +%d); cuMemGetAddressRange %d: [0x%x, +%d); NIC refusals %d" %
          (ptr, n, rc, base.value, size.value, nic_refused))
    ranges = [("its pages", ptr & ~(pg - 1), (ptr + n + pg - 1) & ~(pg - 1))]
    mb = ctypes.c_uint64()
    if cuda.cuPointerGetAttribute(ctypes.byref(mb), 19, ctypes.c_uint64(ptr)) == 0:     # MAPPING_BASE_ADDR
        ranges.append(("its mapping's base to its end", mb.value, (ptr + n + pg - 1) & ~(pg - 1)))
    if rc == 0:
        ranges.append(("its allocation's pages", base.value & ~(pg - 1), (base.value + size.value + pg - 1) & ~(pg - 1)))
    for what, lo, hi in ranges:
        fd = ctypes.c_int(-1)
        x = cuda.cuMemGetHandleForAddressRange(ctypes.byref(fd), ctypes.c_uint64(lo), ctypes.c_size_t(hi - lo), 1,
                                               ctypes.c_ulonglong(0))
        fsize = os.lseek(fd.value, 0, os.SEEK_END) if x == 0 and fd.value >= 0 else -1
        if fd.value >= 0:
            os.close(fd.value)
        print("    export of %s [0x%x, 0x%x): %d, dmabuf size %d" % (what, lo, hi, x, fsize))


def register(cache, t, what, nic=None):
    """cache.register(t), or None with the failure counted (and explained)."""
    refused = nic.counters()[2] if nic else -1
    try:
        return cache.register(t, access=ACC)
    except OSError as e:
        check(False, "%s: registration refused: %s" % (what, e))
        explain(t, nic.counters()[2] - refused if nic else -1)
        return None


def carved(nic, cache, alloc, label):
    """Tensors packed by the allocator, each registered; a WRITE into each lands there only."""
    specs = [(1000, torch.uint8), (4096, torch.uint8), (5000, torch.uint8), (777, torch.float16),
             (300 << 10, torch.uint8), (12345, torch.int32), (1 << 20, torch.uint8), ((2 << 20) + 123, torch.uint8)]
    ts = [alloc(n, dt) for n, dt in specs]
    big = ts[-1]
    ts.append(big[4096 + 100:4096 + 1100])            # a view inside another tensor
    ts.append(ts[5][100:300])                         # a view of the int32 tensor, not at its start
    owners = list(range(len(specs))) + [len(specs) - 1, 5]
    base = [pattern(as_bytes(t).numel(), i) for i, t in enumerate(ts[:len(specs)])]

    def reset():
        for t, b in zip(ts[:len(specs)], base):
            as_bytes(t).copy_(b)
        torch.cuda.synchronize()

    pages = sorted({(t.data_ptr() >> 12) for t in ts})
    print("  %s: %d tensors and views over %d distinct pages, lowest 0x%x" %
          (label, len(ts), len(pages), min(t.data_ptr() for t in ts)))
    s0 = cache.stats()
    for i, t in enumerate(ts):
        reset()
        tb = as_bytes(t)
        n = tb.numel()
        r = register(cache, t, "%s: tensor %d" % (label, i), nic)
        if r is None:
            continue
        with r:
            want = pattern(n, 50 + i)
            st = nic.write(want, t.data_ptr(), r.rkey)
            torch.cuda.synchronize()
            check(st == 0, "%s: WRITE into tensor %d (%d bytes): status %d" % (label, i, n, st))
            check(torch.equal(tb.cpu(), want), "%s: tensor %d does not hold what was written" % (label, i))
            # every other tensor's bytes unchanged, apart from those of the tensor this one is a view of
            for j, (u, b) in enumerate(zip(ts[:len(specs)], base)):
                ub = as_bytes(u).cpu()
                if j == owners[i]:
                    off = t.data_ptr() - u.data_ptr()
                    ub = torch.cat([ub[:off], ub[off + n:]])
                    b = torch.cat([b[:off], b[off + n:]])
                check(torch.equal(ub, b), "%s: WRITE into tensor %d changed tensor %d" % (label, i, j))
            st, got = nic.read(t.data_ptr(), r.rkey, n)
            check(st == 0 and torch.equal(got, want), "%s: READ of tensor %d: status %d, %s" %
                  (label, i, st, "same bytes" if torch.equal(got, want) else "other bytes"))
    s1 = cache.stats()
    print("  %s: %d registrations for %d tensors (regions coalesce where pages are shared), %d hits" %
          (label, s1["regs"] - s0["regs"], len(ts), s1["hits"] - s0["hits"]))
    check(0 < s1["regs"] - s0["regs"] <= len(ts), "%s: registrations made" % label)
    del ts, big


def hazard(nic, cache, alloc, release, tell, label):
    """Register, write, free the segment, allocate the same size, register, write."""
    t = alloc(BIG, torch.uint8)
    ptr = t.data_ptr()
    id1 = buffer_id(ptr)
    one = 1 << 20
    r = register(cache, t, label, nic)
    if r is None:
        return
    with r:
        rkey1 = r.rkey
        check(nic.write(pattern(one, 1), ptr, rkey1) == 0, "%s: first WRITE" % label)
        torch.cuda.synchronize()
        check(torch.equal(t[:one].cpu(), pattern(one, 1)), "%s: first WRITE landed" % label)
    del t
    release()
    t2 = alloc(BIG, torch.uint8)
    id2 = buffer_id(t2.data_ptr())
    if t2.data_ptr() != ptr:
        print("  %s: the new tensor is at another VA (0x%x, was 0x%x): hazard not exercised" % (label, t2.data_ptr(), ptr))
        check(tell, "%s: the control needs the same VA again" % label)
        return
    t2.zero_()
    torch.cuda.synchronize()
    s0 = nic.stale()
    r2 = register(cache, t2, label + ", again", nic)
    if r2 is None:
        return
    with r2:
        same_key = r2.rkey == rkey1
        st = nic.write(pattern(one, 2), ptr, r2.rkey)
        torch.cuda.synchronize()
        landed = torch.equal(t2[:one].cpu(), pattern(one, 2))
    stale = nic.stale() - s0
    print("  %s: same VA 0x%x, buffer id %s -> %s, rkey %s, WRITE status %d, bytes %s, stale uses %d" %
          (label, ptr, id1, id2, "the old one" if same_key else "new", st, "landed" if landed else "did NOT land",
           stale))
    if tell:
        check(not same_key, "%s: drc handed back the freed segment's MR" % label)
        check(st == 0 and landed, "%s: the WRITE after the re-allocation did not land" % label)
        check(stale == 0, "%s: %d stale uses with drc" % (label, stale))
    elif id1 != id2:
        check(same_key, "%s control: drc was not told, yet registered anew" % label)
        check(not landed, "%s control: the bytes reached the new tensor through the old MR" % label)
        check(nic.stale() < 0 or stale > 0, "%s control: loopnic counted no stale use" % label)
    else:
        print("  %s control: same buffer id, the allocator kept the memory: no hazard to see" % label)
    del t2
    release()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "hooked"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    label = mode + (" (%s)" % conf if conf else "")
    torch.cuda.init()
    torch.empty(1, device="cuda").fill_(1)            # the context and the fill kernel, before anything is timed
    nic = Nic()
    print("test_torch_e2e_gpu %s: NIC %s; drc %s from %s" % (label, "loopnic" if nic.stale() >= 0 else "the system's",
          drc_torch.version(), drc_torch.lib_path()))
    if os.environ.get("E2E_EXPECT_LOOPNIC"):
        # e2e.sh runs on loopnic: unreadable counters would make every stale-use check vacuous
        check(nic.stale() >= 0, "%s: loopnic's counters are not reachable (dlsym RTLD_DEFAULT)" % label)
    cache = drc_torch.Cache.verbs(nic.pd)
    pools = []

    if mode == "pool":
        def alloc(n, dt):
            if not pools:
                pools.append(drc_torch.Pool())
            with pools[0].use():
                return torch.empty(n // torch.tensor([], dtype=dt).element_size() or 1, dtype=dt, device="cuda")

        def release():
            torch.cuda.synchronize()
            pools.clear()                             # the pool's segments go with it
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
    else:
        def alloc(n, dt):
            return torch.empty(n // torch.tensor([], dtype=dt).element_size() or 1, dtype=dt, device="cuda")

        def release():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.synchronize()

    carved(nic, cache, alloc, label)
    release()
    hazard(nic, cache, alloc, release, mode != "control", label)
    s = cache.stats()
    print("  %s: cache stats: %d regs, %d deregs, %d hits, %d misses, %d invalidated" %
          (label, s["regs"], s["deregs"], s["hits"], s["misses"], s["invalidated"]))
    cache.close()
    stale, live, _ = nic.counters()
    check(live < 0 or live == 1, "%s: %d MRs live after the cache was closed (1: the staging buffer's)" % (label, live))
    check(nic.lib.e2e_nic_close() == 0, "%s: verbs teardown (ibv_dealloc_pd refuses while MRs are left)" % label)
    print("test_torch_e2e_gpu %s: %d checks, %d failed" % (label, checks, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
