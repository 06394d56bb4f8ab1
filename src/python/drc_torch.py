"""drc for PyTorch: a CUDA memory pool whose segments drc can register for
RDMA, and registration of tensors through a drc cache. ctypes only.

    import torch, drc_torch
    pool = drc_torch.Pool()                  # segments: VMM + gpuDirectRDMACapable, or cuMemAlloc
    with pool.use():
        x = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
    cache = drc_torch.Cache.verbs(pd_address)   # an ibv_pd * (e.g. from pyverbs), or Cache(backend)
    with cache.register(x) as r:                # a drc_get; its drc_put on exit
        post_rdma_write(r.lkey, r.rkey, x.data_ptr(), x.nbytes)

PyTorch still caches blocks inside the pool; drc is called once per segment
(torch.cuda.memory.CUDAPluggableAllocator), and a segment's free (on
`del pool` or torch.cuda.empty_cache()) invalidates every registration of it
before the memory goes, so no MR outlives its memory.

The library is found through DRC_LIB, else next to this file
(../../build/libdrc.so), else as libdrc.so.0 on the loader's path.
"""
import ctypes
import os

import torch

IBV_ACCESS_LOCAL_WRITE = 1
IBV_ACCESS_REMOTE_WRITE = 2
IBV_ACCESS_REMOTE_READ = 4


def lib_path():
    env = os.environ.get("DRC_LIB")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "libdrc.so")
    return os.path.normpath(here) if os.path.exists(here) else "libdrc.so.0"


class _RegArgs(ctypes.Structure):
    _fields_ = [("start", ctypes.c_size_t), ("len", ctypes.c_size_t), ("type", ctypes.c_int),
                ("device", ctypes.c_int), ("dmabuf_fd", ctypes.c_int), ("dmabuf_offset", ctypes.c_uint64),
                ("access", ctypes.c_uint), ("comp_mask", ctypes.c_uint32)]


_STATS_ALL = 1     # DRC_STATS_DETACHED

_REG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_RegArgs), ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32))
_DEREG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _Backend(ctypes.Structure):
    _fields_ = [("reg", _REG), ("dereg", _DEREG), ("ctx", ctypes.c_void_p), ("comp_mask", ctypes.c_uint32)]


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("hits", "misses", "merges", "invalidated", "evicted", "regs", "deregs", "regions", "bytes", "in_use")] + \
               [("comp_mask", ctypes.c_uint32), ("detached", ctypes.c_uint64)]


def _load(path=None):
    lib = ctypes.CDLL(path or lib_path())
    lib.drc_cache_create.argtypes = [ctypes.POINTER(_Backend), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.drc_cache_create_verbs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.drc_cache_destroy.argtypes = [ctypes.c_void_p]
    lib.drc_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint,
                            ctypes.POINTER(ctypes.c_void_p)]
    lib.drc_put.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.drc_region_valid.argtypes = [ctypes.c_void_p]
    lib.drc_region_handle.argtypes = [ctypes.c_void_p]
    lib.drc_region_handle.restype = ctypes.c_void_p
    lib.drc_region_lkey.argtypes = [ctypes.c_void_p]
    lib.drc_region_lkey.restype = ctypes.c_uint32
    lib.drc_region_rkey.argtypes = [ctypes.c_void_p]
    lib.drc_region_rkey.restype = ctypes.c_uint32
    lib.drc_cache_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
    lib.drc_strerror.argtypes = [ctypes.c_int]
    lib.drc_strerror.restype = ctypes.c_char_p
    return lib


def _check(lib, err, what):
    if err < 0:
        raise OSError(-err, "%s: %s" % (what, lib.drc_strerror(err).decode()))
    return err


class Pool:
    """A torch.cuda.MemPool whose segments come from drc_torch_malloc/drc_torch_free."""

    def __init__(self, path=None):
        self.path = path or lib_path()
        self.allocator = torch.cuda.memory.CUDAPluggableAllocator(self.path, "drc_torch_malloc", "drc_torch_free")
        self.pool = torch.cuda.MemPool(self.allocator.allocator())

    def use(self):
        return torch.cuda.use_mem_pool(self.pool)


class Region:
    def __init__(self, cache, handle):
        self.cache, self.r = cache, handle

    @property
    def valid(self):
        return bool(self.cache.lib.drc_region_valid(self.r))

    @property
    def lkey(self):
        return self.cache.lib.drc_region_lkey(self.r)

    @property
    def rkey(self):
        return self.cache.lib.drc_region_rkey(self.r)

    @property
    def handle(self):
        return self.cache.lib.drc_region_handle(self.r)

    def release(self):
        if self.r:
            _check(self.cache.lib, self.cache.lib.drc_put(self.cache.c, self.r), "drc_put")
            self.r = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Cache:
    """A drc cache. backend: an object with reg(args) -> (handle int, lkey, rkey) and dereg(handle);
    args has start, len, device, dmabuf_fd (owned by drc: dup it to keep it), dmabuf_offset, access."""

    def __init__(self, backend=None, path=None, _verbs_pd=None):
        self.lib = _load(path)
        c = ctypes.c_void_p()
        if _verbs_pd is not None:
            _check(self.lib, self.lib.drc_cache_create_verbs(_verbs_pd, None, ctypes.byref(c)),
                   "drc_cache_create_verbs")
        else:
            self._py = backend

            def reg(ctx, a, handle, lkey, rkey):
                try:
                    h, lk, rk = backend.reg(a.contents)
                except OSError as e:
                    return -(e.errno or 5)
                handle[0], lkey[0], rkey[0] = h, lk, rk
                return 0

            def dereg(ctx, h):
                backend.dereg(h)
                return 0

            self._cb = (_REG(reg), _DEREG(dereg))     # kept alive as long as the cache
            self._be = _Backend(self._cb[0], self._cb[1], None)
            _check(self.lib, self.lib.drc_cache_create(ctypes.byref(self._be), None, ctypes.byref(c)),
                   "drc_cache_create")
        self.c = c

    @classmethod
    def verbs(cls, pd_address, path=None):
        return cls(path=path, _verbs_pd=ctypes.c_void_p(pd_address))

    def register(self, tensor_or_ptr, nbytes=None, access=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE):
        if isinstance(tensor_or_ptr, torch.Tensor):
            ptr, nbytes = tensor_or_ptr.data_ptr(), tensor_or_ptr.untyped_storage().nbytes()
        else:
            ptr = tensor_or_ptr
        r = ctypes.c_void_p()
        _check(self.lib, self.lib.drc_get(self.c, ptr, nbytes, access, ctypes.byref(r)), "drc_get")
        return Region(self, r)

    def stats(self):
        s = _Stats(comp_mask=_STATS_ALL)
        self.lib.drc_cache_stats(self.c, ctypes.byref(s))
        return {n: getattr(s, n) for n, _ in _Stats._fields_ if n != "comp_mask"}

    def close(self):
        if self.c:
            _check(self.lib, self.lib.drc_cache_destroy(self.c), "drc_cache_destroy")
            self.c = None
