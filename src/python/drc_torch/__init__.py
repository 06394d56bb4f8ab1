"""drc for PyTorch: a CUDA memory pool whose segments drc can register for
RDMA, and registration of tensors through a drc cache. ctypes only.

    import torch, drc_torch
    pool = drc_torch.Pool()                  # segments: VMM + gpuDirectRDMACapable, or cuMemAlloc
    with pool.use():
        x = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
    cache = drc_torch.Cache.verbs(pd_address)   # an ibv_pd * (e.g. from pyverbs), or Cache(backend)
    with cache.register(x) as r:                # a drc_get of x's own bytes; its drc_put on exit
        post_rdma_write(r.lkey, r.rkey, x.data_ptr(), x.nbytes)

PyTorch still caches blocks inside the pool; drc is called once per segment
(torch.cuda.memory.CUDAPluggableAllocator), and a segment's free (on
`del pool` or torch.cuda.empty_cache()) invalidates every registration of it
before the memory goes, so no MR outlives its memory.

The library (libdrc.so, which needs libc only, so a late
ctypes load works) is found through, in order: $DRC_LIB; the libdir that
`pkg-config --variable=libdir drc` names; the build/ folder of the drc source
tree this file sits in; the loader's path (libdrc.so.0); where none has it,
the error says how to point to it (DRC_LIB). Importing this module needs
neither torch nor the library: Pool needs torch 2.5 or later
(torch.cuda.MemPool), and each call that needs the library loads it then.
"""
import ctypes
import os
import subprocess
import weakref

__all__ = ["lib_path", "load", "version", "Pool", "Cache", "Region", "span",
           "IBV_ACCESS_LOCAL_WRITE", "IBV_ACCESS_REMOTE_WRITE", "IBV_ACCESS_REMOTE_READ"]

IBV_ACCESS_LOCAL_WRITE = 1
IBV_ACCESS_REMOTE_WRITE = 2
IBV_ACCESS_REMOTE_READ = 4

_SONAME = "libdrc.so.0"


def _pkg_config_libdir():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "drc"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    d = out.stdout.strip()
    return d if out.returncode == 0 and d else None


def lib_path():
    """The libdrc to load: $DRC_LIB, pkg-config's libdir, this source tree's build/, or the soname."""
    env = os.environ.get("DRC_LIB")
    if env:
        return env
    d = _pkg_config_libdir()
    if d:
        for name in (_SONAME, "libdrc.so"):
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
    top = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    built = os.path.join(top, "build", "libdrc.so")
    if os.path.exists(built) and os.path.exists(os.path.join(top, "include", "drc.h")):
        return built
    return _SONAME


class _RegArgs(ctypes.Structure):
    _fields_ = [("start", ctypes.c_size_t), ("len", ctypes.c_size_t), ("type", ctypes.c_int),
                ("device", ctypes.c_int), ("dmabuf_fd", ctypes.c_int), ("dmabuf_offset", ctypes.c_uint64),
                ("access", ctypes.c_uint), ("comp_mask", ctypes.c_uint32)]


_REG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_RegArgs), ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32))
_DEREG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _Backend(ctypes.Structure):
    _fields_ = [("reg", _REG), ("dereg", _DEREG), ("ctx", ctypes.c_void_p), ("comp_mask", ctypes.c_uint32)]


_STATS_ALL = 1     # DRC_STATS_DETACHED: the later fields _Stats has (drc.h's ABI rule)


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("hits", "misses", "merges", "invalidated", "evicted", "regs", "deregs", "regions", "bytes", "in_use")] + \
               [("comp_mask", ctypes.c_uint32), ("detached", ctypes.c_uint64)]


_libs = {}


def _not_found(path, err):
    """What to tell a user whose libdrc did not load: where it looked and how to point to it."""
    if os.environ.get("DRC_LIB"):
        where = "DRC_LIB=%s" % os.environ["DRC_LIB"]
    elif os.sep in path:
        where = path
    else:
        where = "%s on the loader's path (no DRC_LIB, no drc.pc for pkg-config, no drc build tree)" % path
    return ("drc_torch: cannot load libdrc from %s: %s\n"
            "drc_torch: build drc (make) or install it (make install: pkg-config then finds it), or point to "
            "the library with DRC_LIB=/path/to/libdrc.so.0" % (where, err))


def load(path=None):
    """The libdrc at @path (default lib_path()) with its prototypes set, loaded once per path."""
    path = path or lib_path()
    lib = _libs.get(path)
    if lib is not None:
        return lib
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise OSError(_not_found(path, e)) from None
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    lib.drc_cache_create.argtypes = [ctypes.POINTER(_Backend), vp, ctypes.POINTER(vp)]
    lib.drc_cache_create_verbs.argtypes = [vp, vp, ctypes.POINTER(vp)]
    lib.drc_cache_destroy.argtypes = [vp]
    lib.drc_get.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_uint, ctypes.POINTER(vp)]
    lib.drc_put.argtypes = [vp, vp]
    lib.drc_region_valid.argtypes = [vp]
    lib.drc_region_bounds.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    lib.drc_region_bounds.restype = None
    lib.drc_region_handle.argtypes = [vp]
    lib.drc_region_handle.restype = vp
    lib.drc_region_lkey.argtypes = [vp]
    lib.drc_region_lkey.restype = u32
    lib.drc_region_rkey.argtypes = [vp]
    lib.drc_region_rkey.restype = u32
    lib.drc_cache_stats.argtypes = [vp, ctypes.POINTER(_Stats)]
    lib.drc_cache_stats.restype = None
    lib.drc_notify_free.argtypes = [vp, ctypes.c_size_t]
    lib.drc_strerror.argtypes = [ctypes.c_int]
    lib.drc_strerror.restype = ctypes.c_char_p
    lib.drc_version.argtypes = [vp, vp, vp]
    lib.drc_version.restype = ctypes.c_char_p
    _libs[path] = lib
    return lib


def version(path=None):
    """The loaded library's version, e.g. "0.1.0"."""
    return load(path).drc_version(None, None, None).decode()


def _check(lib, err, what):
    if err < 0:
        raise OSError(-err, "%s: %s" % (what, lib.drc_strerror(err).decode()))
    return err


def span(t):
    """(address, nbytes) of the bytes a tensor (or view) occupies: from its lowest to its highest
    element, inclusive. For a contiguous tensor that is data_ptr() .. + numel() * element_size();
    a view's span stays inside its storage (its storage's size says nothing about it). Only
    data_ptr(), numel(), element_size(), size() and stride() are used."""
    n, es, ptr = t.numel(), t.element_size(), t.data_ptr()
    if n == 0:
        raise ValueError("drc_torch: an empty tensor has no bytes to register")
    lo = hi = 0
    for size, stride in zip(t.size(), t.stride()):
        ext = (size - 1) * stride
        if ext >= 0:
            hi += ext
        else:
            lo += ext
    return ptr + lo * es, (hi - lo + 1) * es


class Pool:
    """A torch.cuda.MemPool whose segments come from drc_torch_malloc/drc_torch_free."""

    def __init__(self, path=None):
        import torch    # only here: the rest of the module works without torch

        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError("drc_torch.Pool needs PyTorch 2.5 or later (torch.cuda.MemPool); this is torch %s"
                               % getattr(torch, "__version__", "of unknown version"))
        self.path = path or lib_path()
        self.allocator = torch.cuda.memory.CUDAPluggableAllocator(self.path, "drc_torch_malloc", "drc_torch_free")
        self.pool = torch.cuda.MemPool(self.allocator.allocator())

    def use(self):
        import torch

        return torch.cuda.use_mem_pool(self.pool)


def _put(lib, c, r):
    lib.drc_put(c, r)


class Region:
    """A reference on a cached region; release() (or leaving the with block) is its drc_put. A Region
    dropped unreleased is put when it is collected."""

    def __init__(self, cache, handle):
        self.cache, self.r = cache, handle
        self._fin = weakref.finalize(self, _put, cache.lib, cache.c, handle)

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

    @property
    def bounds(self):
        """(start, len) of the page-aligned range the region registered."""
        s, n = ctypes.c_size_t(), ctypes.c_size_t()
        self.cache.lib.drc_region_bounds(self.r, ctypes.byref(s), ctypes.byref(n))
        return s.value, n.value

    def release(self):
        if self.r:
            self._fin.detach()
            _check(self.cache.lib, self.cache.lib.drc_put(self.cache.c, self.r), "drc_put")
            self.r = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


# Callbacks of caches whose destroy failed at collection (regions still referenced): the C cache
# still points at them, so they must live as long as the process.
_stranded = []


def _destroy(lib, c, keep):
    """A Cache's finalizer: destroy the C cache, after which nothing calls its callbacks (@keep)."""
    if lib.drc_cache_destroy(c) != 0:
        _stranded.append(keep)


class Cache:
    """A drc cache. backend: an object with reg(args) -> (handle int, lkey, rkey) and dereg(handle);
    args has start, len, device, dmabuf_fd (owned by drc: dup it to keep it), dmabuf_offset, access.
    close() destroys it; a Cache dropped without close() is destroyed when it is collected, so its
    callbacks never outlive it in the process's notify table."""

    def __init__(self, backend=None, path=None, _verbs_pd=None):
        self.lib = load(path)
        c = ctypes.c_void_p()
        keep = None
        if _verbs_pd is not None:
            _check(self.lib, self.lib.drc_cache_create_verbs(_verbs_pd, None, ctypes.byref(c)),
                   "drc_cache_create_verbs")
        else:
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

            cb = (_REG(reg), _DEREG(dereg))
            be = _Backend(cb[0], cb[1], None, 0)
            keep = (cb, be, backend)      # alive until the C cache is destroyed (the finalizer holds them)
            _check(self.lib, self.lib.drc_cache_create(ctypes.byref(be), None, ctypes.byref(c)), "drc_cache_create")
        self.c = c.value
        self._fin = weakref.finalize(self, _destroy, self.lib, self.c, keep)

    @classmethod
    def verbs(cls, pd_address, path=None):
        return cls(path=path, _verbs_pd=ctypes.c_void_p(pd_address))

    def register(self, tensor_or_ptr, nbytes=None, access=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE):
        """A Region for a tensor's own bytes (span(): a view registers the view, never the rest of its
        storage), or for [ptr, ptr + nbytes)."""
        if hasattr(tensor_or_ptr, "data_ptr"):
            ptr, n = span(tensor_or_ptr)
            nbytes = n if nbytes is None else nbytes
        else:
            ptr = tensor_or_ptr
        r = ctypes.c_void_p()
        _check(self.lib, self.lib.drc_get(self.c, ptr, nbytes, access, ctypes.byref(r)), "drc_get")
        return Region(self, r.value)

    def stats(self):
        s = _Stats(comp_mask=_STATS_ALL)
        self.lib.drc_cache_stats(self.c, ctypes.byref(s))
        return {n: getattr(s, n) for n, _ in _Stats._fields_ if n != "comp_mask"}

    def close(self):
        """Destroy the cache: OSError(EBUSY) while a Region of it is not released."""
        if self.c:
            _check(self.lib, self.lib.drc_cache_destroy(self.c), "drc_cache_destroy")
            self._fin.detach()
            self.c = None
