#!/bin/sh
# Late loading (issue 8): a program that loads drc with dlopen after start-up (Python's ctypes, as
# the PyTorch helper does) works. libdrc.so needs no jemalloc, whose initial-exec TLS makes a late
# dlopen fail ("cannot allocate memory in static TLS block"); libdrc_host.so does need it, so it is
# loaded late only with the workaround the README gives (GLIBC_TUNABLES=glibc.rtld.optional_static_tls).
# Usage: tests/pkg/test_late_load.sh BUILD_DIR RESULTS_FILE
B=$1 out=$2
: > "$out"
result() {  # name, then the command; records "name 1 0" or "name 0 1"
    name=$1; shift
    if "$@"; then echo "$name 1 0" >> "$out"; else echo "!! $name failed"; echo "$name 0 1" >> "$out"; fi
}
no_jemalloc() {
    if readelf -d "$B/libdrc.so" | grep NEEDED | grep -q jemalloc; then
        echo "libdrc.so needs jemalloc:"; readelf -d "$B/libdrc.so" | grep NEEDED; return 1
    fi
}
result late-load:libdrc.so-needs-no-jemalloc no_jemalloc
result late-load:ctypes.CDLL-libdrc.so python3 -c "import ctypes; ctypes.CDLL('$B/libdrc.so').drc_version"
result late-load:ctypes.CDLL-libdrc_host.so-with-tunable env LD_LIBRARY_PATH="$B" \
    GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 \
    python3 -c "import ctypes; ctypes.CDLL('$B/libdrc_host.so').drc_host_alloc"
# The preload library is loaded into processes drc does not own (Python with PyTorch, inference
# servers): it must not bring jemalloc, whose libjemalloc.so.2 exports malloc and would replace the
# process's allocator (seen: "munmap_chunk(): invalid pointer" in python3 with PyTorch).
preload_no_jemalloc() {
    maps=$(env LD_PRELOAD="$B/libdrc_preload.so" cat /proc/self/maps) || return 1
    echo "$maps" | grep -q 'libdrc_preload' || { echo "the preload did not load"; return 1; }
    if echo "$maps" | grep -q jemalloc; then echo "LD_PRELOAD=libdrc_preload.so maps jemalloc"; return 1; fi
}
result late-load:preload-brings-no-jemalloc preload_no_jemalloc
exit 0
