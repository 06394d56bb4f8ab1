"""CPU tests of the PyTorch helper (src/python/drc_torch), with torch made unimportable: the module
imports and finds libdrc without torch (only Pool needs it), a tensor view registers its own bytes
(issue 9 item 7: never up to the end of its storage), and a Cache or Region dropped without
close()/release() is destroyed/put, so no callback of a dead Cache stays in the notify table.

Usage: python3 tests/python/test_drc_torch.py [RESULTS_FILE]
The package is imported from src/python unless DRC_TEST_TORCH_PATH names another folder (an installed
copy). The library is $DRC_LIB, else build/libdrc.so of this tree. With RESULTS_FILE, appends
"NAME PASSED FAILED SKIPPED" as tests/run.sh does."""
import ctypes
import gc
import importlib.abc
import mmap
import os
import subprocess
import sys
import tempfile
import unittest

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class _NoTorch(importlib.abc.MetaPathFinder):
    """torch is not installable here; where it is (the GPU machine), hide it all the same."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden by test_drc_torch.py")
        return None


sys.meta_path.insert(0, _NoTorch())
for m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[m]
sys.path.insert(0, os.environ.get("DRC_TEST_TORCH_PATH") or os.path.join(TOP, "src", "python"))
os.environ.setdefault("DRC_LIB", os.path.join(TOP, "build", "libdrc.so"))
import drc_torch  # noqa: E402

PAGE = mmap.PAGESIZE
MiB = 1 << 20


class FakeTensor:
    """What drc_torch reads of a tensor: a view of @elem_size-byte elements at @ptr."""

    def __init__(self, ptr, size, stride=None, elem_size=1):
        self.ptr, self._size, self.es = ptr, tuple(size), elem_size
        if stride is None:
            stride, acc = [], 1
            for s in reversed(self._size):
                stride.insert(0, acc)
                acc *= s
        self._stride = tuple(stride)

    def data_ptr(self):
        return self.ptr

    def numel(self):
        n = 1
        for s in self._size:
            n *= s
        return n

    def element_size(self):
        return self.es

    def size(self):
        return self._size

    def stride(self):
        return self._stride

    def __getitem__(self, k):       # 1-d slices b[a:] only, as in the issue
        assert len(self._size) == 1 and isinstance(k, slice) and k.step is None
        a = k.start or 0
        return FakeTensor(self.ptr + a * self.es * self._stride[0], (self._size[0] - a,), self._stride, self.es)

    def untyped_storage(self):      # what the old code asked: the whole storage
        raise AssertionError("register() must not size a tensor by its storage")


class Recorder:
    """A drc backend in Python: records what it is asked to register."""

    def __init__(self):
        self.live, self.asked, self.next = {}, [], 0

    def reg(self, a):
        self.next += 1
        self.live[self.next] = (a.start, a.len)
        self.asked.append((a.start, a.len))
        return self.next, self.next, self.next

    def dereg(self, h):
        del self.live[h]


class Buffer:
    """@n bytes of page-aligned host memory (its address is what a tensor's data_ptr() would be)."""

    def __init__(self, n):
        self.m = mmap.mmap(-1, n)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.m))

    def close(self):
        self.m.close()


class ImportWithoutTorch(unittest.TestCase):
    def test_imports_and_finds_libdrc_without_torch(self):
        self.assertNotIn("torch", sys.modules)
        with self.assertRaises(ImportError):
            import torch  # noqa: F401
        self.assertTrue(os.path.exists(drc_torch.lib_path()), drc_torch.lib_path())
        v = drc_torch.version()
        with open(os.path.join(TOP, "include", "drc.h")) as f:
            macros = dict(line.split()[1:3] for line in f if line.startswith("#define DRC_VERSION_"))
        self.assertEqual(v, "%s.%s.%s" % (macros["DRC_VERSION_MAJOR"], macros["DRC_VERSION_MINOR"],
                                          macros["DRC_VERSION_PATCH"]))

    def test_pool_is_what_needs_torch(self):
        with self.assertRaises(ImportError):
            drc_torch.Pool()

    def test_pool_says_which_torch_it_needs(self):
        """A torch without torch.cuda.MemPool (before 2.5): Pool says what it needs and what it found."""
        import types
        old = types.ModuleType("torch")
        old.__version__ = "2.4.1"
        old.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(CUDAPluggableAllocator=lambda *a: None))
        sys.modules["torch"] = old
        try:
            with self.assertRaises(RuntimeError) as e:
                drc_torch.Pool()
        finally:
            del sys.modules["torch"]
        self.assertIn("PyTorch 2.5 or later", str(e.exception))
        self.assertIn("2.4.1", str(e.exception))

    def test_missing_library_says_how_to_point_to_it(self):
        """No libdrc anywhere the helper looks: the error names where it looked and DRC_LIB."""
        with tempfile.TemporaryDirectory() as d:
            pkg = os.path.join(d, "pkg")      # the package outside any drc tree
            os.makedirs(os.path.join(pkg, "drc_torch"))
            src = os.path.join(os.path.dirname(drc_torch.__file__), "__init__.py")
            with open(src) as f, open(os.path.join(pkg, "drc_torch", "__init__.py"), "w") as g:
                g.write(f.read())
            env = {k: v for k, v in os.environ.items() if k not in ("DRC_LIB", "LD_LIBRARY_PATH")}
            env.update(PYTHONPATH=pkg, PKG_CONFIG_PATH=d, PKG_CONFIG_LIBDIR=d)
            code = "import drc_torch\ntry:\n drc_torch.version()\nexcept OSError as e:\n print(e)\n"
            for drc_lib, where in ((None, "libdrc.so.0 on the loader's path"),
                                   ("/nonexistent/libdrc.so.0", "DRC_LIB=/nonexistent/libdrc.so.0")):
                if drc_lib:
                    env["DRC_LIB"] = drc_lib
                out = subprocess.run([sys.executable, "-c", code], env=env, cwd=d, capture_output=True,
                                     text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("cannot load libdrc from " + where, out.stdout)
                self.assertIn("DRC_LIB=/path/to/libdrc.so.0", out.stdout)

    def test_lib_path_order(self):
        env = dict(os.environ)
        try:
            os.environ["DRC_LIB"] = "/nonexistent/libdrc.so"
            self.assertEqual(drc_torch.lib_path(), "/nonexistent/libdrc.so")
            del os.environ["DRC_LIB"]
            with tempfile.TemporaryDirectory() as d:    # an installed tree that pkg-config knows
                os.makedirs(os.path.join(d, "lib", "pkgconfig"))
                os.symlink(os.path.join(TOP, "build", "libdrc.so"), os.path.join(d, "lib", "libdrc.so.0"))
                with open(os.path.join(d, "lib", "pkgconfig", "drc.pc"), "w") as f:
                    f.write("prefix=%s\nlibdir=${prefix}/lib\n\nName: drc\nDescription: d\nVersion: 0\n"
                            "Libs: -ldrc\n" % d)
                os.environ["PKG_CONFIG_PATH"] = os.path.join(d, "lib", "pkgconfig")
                if subprocess.run(["pkg-config", "--exists", "drc"]).returncode == 0:
                    self.assertEqual(drc_torch.lib_path(), os.path.join(d, "lib", "libdrc.so.0"))
                    drc_torch.load(drc_torch.lib_path())
        finally:
            os.environ.clear()
            os.environ.update(env)


class Span(unittest.TestCase):
    def test_contiguous(self):
        t = FakeTensor(0x10000, (256, 1024), elem_size=4)
        self.assertEqual(drc_torch.span(t), (0x10000, MiB))

    def test_view_at_an_offset_stops_at_its_last_byte(self):
        b = FakeTensor(0x100000, (MiB,))
        self.assertEqual(drc_torch.span(b[4096:]), (0x100000 + 4096, MiB - 4096))

    def test_non_contiguous_lowest_to_highest_element(self):
        # rows 10..19, columns 100..199 of a (256, 4096) float16 matrix at 0x200000
        v = FakeTensor(0x200000 + (10 * 4096 + 100) * 2, (10, 100), (4096, 1), 2)
        self.assertEqual(drc_torch.span(v), (0x200000 + (10 * 4096 + 100) * 2, ((9 * 4096 + 99) + 1) * 2))
        t = FakeTensor(0x300000, (8, 4), (1, 8))        # a transpose: still 32 elements
        self.assertEqual(drc_torch.span(t), (0x300000, 32))
        s = FakeTensor(0x400000, (5,), (-3,), 4)         # a negative stride: the span reaches down
        self.assertEqual(drc_torch.span(s), (0x400000 - 12 * 4, 13 * 4))
        e = FakeTensor(0x400000, (4, 1), (1, 0), 8)       # an expanded (stride 0) dimension
        self.assertEqual(drc_torch.span(e), (0x400000, 32))

    def test_empty_is_refused(self):
        with self.assertRaises(ValueError):
            drc_torch.span(FakeTensor(0x1000, (0,)))


class RegisterAndLifetime(unittest.TestCase):
    def setUp(self):
        self.buf = Buffer(2 * MiB)

    def tearDown(self):
        gc.collect()
        self.buf.close()

    def test_register_a_view_registers_its_own_bytes(self):
        rec = Recorder()
        cache = drc_torch.Cache(rec)
        b = FakeTensor(self.buf.addr, (MiB,))
        with cache.register(b[4096:]) as r:
            self.assertEqual(rec.asked, [(self.buf.addr + 4096, MiB - 4096)])
            self.assertEqual(r.bounds, (self.buf.addr + 4096, MiB - 4096))
        cache.close()
        self.assertEqual(rec.live, {})

    def test_dropped_cache_is_destroyed(self):
        rec = Recorder()
        cache = drc_torch.Cache(rec)
        cache.register(self.buf.addr, MiB).release()
        self.assertEqual(len(rec.live), 1)      # idle and cached
        del cache
        gc.collect()
        self.assertEqual(rec.live, {}, "a Cache dropped without close() was not destroyed")
        # nothing of it is left in the notify table: a free of that memory calls nothing
        lib = drc_torch.load()
        self.assertEqual(lib.drc_notify_free(self.buf.addr, MiB), 0)

    def test_dropped_region_is_put(self):
        rec = Recorder()
        cache = drc_torch.Cache(rec)
        r = cache.register(self.buf.addr, PAGE)
        self.assertEqual(cache.stats()["in_use"], 1)
        with self.assertRaises(OSError):
            cache.close()                       # -EBUSY: the region is referenced
        del r
        gc.collect()
        self.assertEqual(cache.stats()["in_use"], 0)
        cache.close()
        self.assertEqual(rec.live, {})

    def test_stats_follow_the_abi_rule(self):
        rec = Recorder()
        cache = drc_torch.Cache(rec)
        r = cache.register(self.buf.addr, PAGE)
        lib = drc_torch.load()
        self.assertEqual(lib.drc_notify_free(self.buf.addr, PAGE), 1)
        s = cache.stats()
        self.assertEqual((s["detached"], s["in_use"], s["regions"]), (1, 1, 0))
        r.release()
        cache.close()


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else None
    result = unittest.main(exit=False, argv=[sys.argv[0], "-v"]).result
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    if results:
        with open(results, "a") as f:
            f.write("%s %d %d %d\n" % (os.environ.get("DRC_TEST_NAME", "python/test_drc_torch"),
                                       result.testsRun - failed - skipped, failed, skipped))
    return 1 if failed or not result.testsRun else 0


if __name__ == "__main__":
    sys.exit(main())
