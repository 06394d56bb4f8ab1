#!/bin/sh
# make install, and programs outside the tree built against what it installed (issue 8):
#   1. make install DESTDIR=<tmp>/stage PREFIX=/usr (as a distribution does): every file is there
#   2. a consumer built with pkg-config (drc, drc_host) against the staged tree, and run
#   3. the same consumer built with CMake (find_package(drc 0.1): drc::drc, drc::host, drc::static),
#      and run; find_package(drc 1.0) is refused
#   4. libraries by their full version (libdrc.so.X.Y.Z, the soname and the bare name links to it), in
#      the build tree and installed; pkg-config --static names no libibverbs provider (drc dlopens
#      libibverbs); installed under a non-default prefix, libdrc_host.so finds libdrc.so.0 beside it
#   5. the Python package, pip-installed offline (no index, no network, build isolation on) straight
#      from the installed share/drc/python, finds the installed libdrc through pkg-config (no
#      DRC_LIB) and imports without torch
#   6. make uninstall leaves nothing behind
# Usage: tests/pkg/test_install.sh BUILD_DIR RESULTS_FILE (run from the top of the tree)
B=$1 out=$2
top=$(pwd)
: > "$out"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
result() {  # name, then the command; records "name 1 0" or "name 0 1"
    name=$1; shift
    if "$@" > "$T/log" 2>&1; then [ -z "${VERBOSE:-}" ] || cat "$T/log"; echo "ok $name"; echo "$name 1 0" >> "$out"
    else cat "$T/log"; echo "!! $name failed"; echo "$name 0 1" >> "$out"; fi
}
S=$T/stage
P=$S/usr
inst() { make -s --no-print-directory B="$B" WERROR= PREFIX=/usr DESTDIR="$S" "$@"; }

installed() {
    inst install || return 1
    for f in include/drc.h include/drc_verbs.h include/drc_cuda.h include/drc_host.h lib/libdrc.so.0 \
             lib/libdrc.so lib/libdrc.a lib/libdrc_host.so.0 lib/libdrc_host.so lib/pkgconfig/drc.pc \
             lib/pkgconfig/drc_host.pc lib/cmake/drc/drcConfig.cmake lib/cmake/drc/drcConfigVersion.cmake \
             bin/drc share/drc/python/pyproject.toml share/drc/python/drc_build.py \
             share/drc/python/drc_torch/__init__.py; do
        [ -e "$P/$f" ] || { echo "missing after make install: /usr/$f"; return 1; }
    done
    for f in "$B"/libdrc_hook.so "$B"/libdrc_verbs.so; do
        [ ! -e "$f" ] || [ -e "$P/lib/${f##*/}" ] || { echo "preload library not installed: ${f##*/}"; return 1; }
    done
    grep -q '^prefix=/usr$' "$P/lib/pkgconfig/drc.pc" || { echo "drc.pc does not say prefix=/usr"; return 1; }
    ! grep -rq "$S" "$P/lib/pkgconfig" "$P/lib/cmake" || { echo "the staging folder leaked into an installed file"; return 1; }
}
result install:files installed

with_pc() { PKG_CONFIG_SYSROOT_DIR=$S PKG_CONFIG_PATH=$P/lib/pkgconfig "$@"; }
pkgconfig_consumer() {
    with_pc pkg-config --exists --print-errors drc drc_host || return 1
    [ "$(with_pc pkg-config --modversion drc)" = "$(sed -n 's/^version = "\(.*\)"/\1/p' src/python/pyproject.toml)" ] ||
        { echo "drc.pc and pyproject.toml disagree on the version"; return 1; }
    static=$(with_pc pkg-config --static --libs drc drc_host) || return 1
    case " $static " in *" -libverbs "*|*" -lmlx5 "*|*"-rdmav"*|*" -lnl-"*)
        echo "pkg-config --static --libs drc names libibverbs or its providers (drc dlopens it): $static"; return 1;; esac
    ${CC:-cc} -Wall -Wextra -Werror -o "$T/pc_consumer" tests/pkg/consumer/consumer.c $(with_pc pkg-config --cflags --libs drc) &&
    LD_LIBRARY_PATH=$P/lib "$T/pc_consumer" &&
    ${CC:-cc} -Wall -Wextra -Werror -DWITH_HOST -o "$T/pc_consumer_host" tests/pkg/consumer/consumer.c \
        $(with_pc pkg-config --cflags --libs drc_host) &&
    LD_LIBRARY_PATH=$P/lib "$T/pc_consumer_host"
}
result install:pkg-config-consumer pkgconfig_consumer

cmake_consumer() {
    cmake -S tests/pkg/consumer -B "$T/cmake" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" &&
    cmake --build "$T/cmake" &&
    LD_LIBRARY_PATH=$P/lib "$T/cmake/consumer_shared" &&
    LD_LIBRARY_PATH=$P/lib "$T/cmake/consumer_host" &&
    "$T/cmake/consumer_static" || return 1
    mkdir -p "$T/too_new" && printf 'cmake_minimum_required(VERSION 3.13)\nproject(n C)\nfind_package(drc 1.0 REQUIRED)\n' \
        > "$T/too_new/CMakeLists.txt"
    if cmake -S "$T/too_new" -B "$T/too_new/b" -DCMAKE_PREFIX_PATH="$P" > "$T/too_new.log" 2>&1; then
        echo "find_package(drc 1.0) accepted drc $(sed -n 's/^version = "\(.*\)"/\1/p' src/python/pyproject.toml)"; return 1
    fi
}
result install:cmake-consumer cmake_consumer

# libdrc.so.X.Y.Z is the file, libdrc.so.0 (the soname) and libdrc.so links to it, in folder $1
versioned() {
    v=$(sed -n 's/^version = "\(.*\)"/\1/p' src/python/pyproject.toml)
    for l in libdrc libdrc_host; do
        [ -f "$1/$l.so.$v" ] && [ ! -L "$1/$l.so.$v" ] || { echo "$1/$l.so.$v: not a file"; return 1; }
        [ "$(readlink "$1/$l.so.0")" = "$l.so.$v" ] || { echo "$1/$l.so.0 is not a link to $l.so.$v"; return 1; }
        [ "$(readlink "$1/$l.so")" = "$l.so.0" ] || { echo "$1/$l.so is not a link to $l.so.0"; return 1; }
        readelf -d "$1/$l.so.$v" | grep -q "SONAME.*\[$l.so.0\]" || { echo "$l.so.$v: soname is not $l.so.0"; return 1; }
    done
}
result build:versioned-libraries versioned "$B"
result install:versioned-libraries versioned "$P/lib"

# The installed tree somewhere no loader looks, without DESTDIR (so that pkg-config's libdir is
# real): libdrc_host.so finds the libdrc.so.0 installed beside it (RUNPATH $ORIGIN), as ldd shows.
prefixed() {
    make -s --no-print-directory B="$B" WERROR= PREFIX="$T/prefix" install || return 1
    deps=$(env -u LD_LIBRARY_PATH ldd "$T/prefix/lib/libdrc_host.so") || return 1
    echo "$deps" | grep -q "libdrc.so.0 => $T/prefix/lib/libdrc.so.0 " ||
        { echo "libdrc_host.so from $T/prefix does not find its libdrc.so.0:"; echo "$deps"; return 1; }
}
result install:host-finds-libdrc-in-its-prefix prefixed

# pip offline: no index and, where this user may make one, a network namespace without network.
# Build isolation stays on, as for a user who types the README's line: the package's build backend
# must need nothing pip would have to fetch.
offline() { if unshare -n true 2>/dev/null; then unshare -n "$@"; else "$@"; fi; }
python_package() {
    py=python3
    "$py" -m pip --version >/dev/null 2>&1 || { echo "no pip for python3: apt-get install python3-pip"; return 1; }
    listing() { (cd "$T/prefix/share/drc/python" && find . ! -path '*__pycache__*' | sort); }
    before=$(listing)
    PIP_ROOT_USER_ACTION=ignore offline "$py" -m pip install --no-deps --no-index --no-cache-dir \
        --disable-pip-version-check --target "$T/site" "$T/prefix/share/drc/python" || return 1
    [ "$(listing)" = "$before" ] || { echo "pip wrote into the installed package folder:"; listing; return 1; }
    ( cd "$T" && env -u DRC_LIB PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" PYTHONPATH="$T/site" "$py" -c '
import sys
sys.modules["torch"] = None     # importing torch fails, as where it is not installed
import drc_torch
want = sys.argv[1] + "/lib/libdrc.so.0"
assert drc_torch.__file__.startswith(sys.argv[2]), drc_torch.__file__
assert drc_torch.lib_path() == want, (drc_torch.lib_path(), want)
print("drc_torch from", drc_torch.__file__, "loads", drc_torch.lib_path(), "version", drc_torch.version())
' "$T/prefix" "$T/site" )
}
result install:python-package python_package

uninstalled() {
    inst uninstall || return 1
    left=$(find "$S" -type f -o -type l)
    [ -z "$left" ] || { echo "left after make uninstall:"; echo "$left"; return 1; }
}
result install:uninstall uninstalled
exit 0
