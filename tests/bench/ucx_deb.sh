#!/bin/sh
# A UCX prefix for bench_cache's and bench_misses' second UCX column, from Debian's binary packages
# (libucx0, libucx-dev) of a newer suite than the system's: run by hand, never by the build.
#
# Usage: tests/bench/ucx_deb.sh DIR [SUITE]       (SUITE: sid by default; trixie, forky, ...)
#   MIRROR=https://deb.debian.org/debian  ARCH=$(dpkg --print-architecture)  CC=cc
#   DEBS="libucx0_....deb libucx-dev_....deb": these files instead of fetching (nothing is fetched)
#
# It reads the suite's Packages index, fetches the two packages from the pool, checks their SHA256
# against the index, and unpacks them into DIR (include/, lib/<triplet>/). Then it prints the make
# line that builds the column. A package built for a newer glibc than this system's does not load
# here; only then does it make libucs and libucm loadable, the three steps below, which touch
# neither the rcache's code nor its data:
#  1. glibc 2.38 compiles strtol() and sscanf() in C2x mode to new names (__isoc23_strtol, ...).
#     Those undefined symbols (objdump -T) lose their version (patchelf --clear-symbol-version),
#     and tests/bench/isoc23_shim.c, built into DIR/lib/<triplet>/libisoc23.so and linked into the
#     benchmark (UCX_LIBS=-lisoc23), defines them over the older functions. Any other symbol from
#     a newer glibc stops the script: nothing is shimmed that was not checked.
#  2. The newer glibc version the libraries still name as needed (GLIBC_2.38), which no symbol
#     uses after step 1, is taken out of their version-needs list (.gnu.version_r). Marking it weak
#     would load too, but then ld.so prints "weak version `GLIBC_2.38' not found" on every run.
#  3. Nothing else: no rpath or code is changed, the libraries' other symbols bind as built.
set -eu
DIR=${1:?usage: tests/bench/ucx_deb.sh DIR [SUITE]}
SUITE=${2:-sid}
MIRROR=${MIRROR:-https://deb.debian.org/debian}
ARCH=${ARCH:-$(dpkg --print-architecture)}
CC=${CC:-cc}
SHIM_SRC=$(cd "$(dirname "$0")" && pwd)/isoc23_shim.c
PKGS="libucx0 libucx-dev"
need() { for t; do command -v "$t" >/dev/null || { echo "ucx_deb.sh: $t is not installed" >&2; exit 2; }; done; }
fetch() {   # fetch URL FILE
    if command -v curl >/dev/null; then curl -fsSL -o "$2" "$1"; else wget -q -O "$2" "$1"; fi
}
need dpkg-deb objdump sha256sum
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- the packages --------------------------------------------------------------------------------
FROM="the given packages"
if [ -z "${DEBS:-}" ]; then
    FROM="Debian $SUITE"
    command -v curl >/dev/null || need wget
    need xz
    echo "ucx_deb.sh: $MIRROR $SUITE main binary-$ARCH Packages"
    fetch "$MIRROR/dists/$SUITE/main/binary-$ARCH/Packages.xz" "$tmp/Packages.xz"
    DEBS=
    for p in $PKGS; do
        # the package's stanza: Filename, Version, SHA256
        xz -dc "$tmp/Packages.xz" | awk -v p="$p" '
            /^Package: / { on = ($2 == p) }
            on && /^(Version|Filename|SHA256): / { print $1, $2 }
            /^$/ && on { exit }' >"$tmp/$p.stanza"
        file=$(sed -n 's/^Filename: //p' "$tmp/$p.stanza")
        sum=$(sed -n 's/^SHA256: //p' "$tmp/$p.stanza")
        [ -n "$file" ] && [ -n "$sum" ] || { echo "ucx_deb.sh: no $p in $SUITE for $ARCH" >&2; exit 1; }
        deb="$DIR/debs/$(basename "$file")"
        mkdir -p "$DIR/debs"
        # the pool's names carry the version's '~' (1.23.0~rc1): encoded in the URL
        echo "ucx_deb.sh: $file"
        fetch "$MIRROR/$(printf '%s' "$file" | sed 's/~/%7E/g')" "$deb"
        echo "$sum  $deb" | sha256sum -c --quiet - || { echo "ucx_deb.sh: $deb: SHA256 differs from the index" >&2; exit 1; }
        DEBS="$DEBS $deb"
    done
fi
VERSION=
for deb in $DEBS; do
    [ "$(dpkg-deb -f "$deb" Package)" = libucx0 ] && VERSION=$(dpkg-deb -f "$deb" Version)
    dpkg-deb -x "$deb" "$tmp/root"
done
[ -n "$VERSION" ] || { echo "ucx_deb.sh: no libucx0 among $DEBS" >&2; exit 1; }
[ -d "$tmp/root/usr/include/ucs" ] || { echo "ucx_deb.sh: no libucx-dev among $DEBS" >&2; exit 1; }
cp -a "$tmp/root/usr/." "$DIR/"
LIBDIR=$(dirname "$(find "$DIR/lib" -name libucs.so.0 | head -n 1)")
# the .pc files name /usr as their prefix
sed -i "s|^prefix=.*|prefix=$DIR|" "$LIBDIR"/pkgconfig/*.pc
# the upstream version: no epoch, no Debian revision or repack suffix; '~rc1' is '-rc1' upstream
UPSTREAM=$(printf '%s' "$VERSION" | sed 's/^[0-9]*://; s/-[^-]*$//; s/+ds[0-9]*$//; s/~/-/')

# ---- the glibc this system has, against what the libraries need ---------------------------------
SYS=$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')
newer() {   # newer VERSION: VERSION (x.y[.z]) is newer than the system's glibc
    [ "$1" != "$SYS" ] && [ "$(printf '%s\n%s\n' "$SYS" "$1" | sort -V | tail -n 1)" = "$1" ]
}
LIBS_EXTRA=
shim=
for so in "$LIBDIR"/libucs.so.0 "$LIBDIR"/libucm.so.0; do
    so=$(readlink -f "$so")
    # undefined dynamic symbols with their version: "... *UND* ... (GLIBC_2.38) name" / "GLIBC_2.38 name"
    objdump -T "$so" | awk '$0 ~ /\*UND\*/ && $0 ~ /GLIBC_[0-9.]+/ {
            v = $0; sub(/.*GLIBC_/, "", v); sub(/[^0-9.].*/, "", v); print v, $NF }' >"$tmp/und"
    clear=
    while read -r v sym; do
        newer "$v" || continue
        case $sym in
        __isoc23_*) clear="$clear $sym" ;;
        *) echo "ucx_deb.sh: $so needs $sym from glibc $v (this system: $SYS), which no shim here provides" >&2
           exit 1 ;;
        esac
    done <"$tmp/und"
    needs=$(objdump -p "$so" | awk '/GLIBC_[0-9.]+$/ { sub(/.*GLIBC_/, ""); print }' | while read -r v; do
        if newer "$v"; then echo "GLIBC_$v"; fi; done)
    [ -n "$needs" ] || continue
    need patchelf python3
    for sym in $clear; do
        patchelf --clear-symbol-version "$sym" "$so"
    done
    [ -z "$clear" ] || shim=1
    echo "ucx_deb.sh: $(basename "$so"): cleared the version of$clear; dropping the unused need of" $needs
    python3 - "$so" $needs <<'EOF'
# Take version needs that no symbol uses out of an ELF64 little-endian shared object's
# .gnu.version_r: each Vernaux entry named in argv[2:] is unlinked from its Verneed's chain.
import struct, sys
path, names = sys.argv[1], set(sys.argv[2:])
b = bytearray(open(path, 'rb').read())
if b[:4] != b'\x7fELF' or b[4] != 2 or b[5] != 1:
    sys.exit('%s: not ELF64 little-endian' % path)
shoff, = struct.unpack_from('<Q', b, 0x28)
shentsize, shnum = struct.unpack_from('<HH', b, 0x3a)
secs = [struct.unpack_from('<IIQQQQIIQQ', b, shoff + i * shentsize) for i in range(shnum)]
SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6ffffffe, 0x6fffffff
vn = [s for s in secs if s[1] == SHT_GNU_VERNEED][0]
vs = [s for s in secs if s[1] == SHT_GNU_VERSYM][0]
strtab = secs[vn[6]][4]         # sh_link: .dynstr's offset
def name(off):
    end = b.index(0, strtab + off)
    return b[strtab + off:end].decode()
used = {struct.unpack_from('<H', b, vs[4] + 2 * i)[0] & 0x7fff for i in range(vs[5] // 2)}
removed = []
need = vn[4]
while True:
    vn_version, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from('<HHIII', b, need)
    prev, aux = None, need + vn_aux
    while True:
        h, flags, other, vna_name, vna_next = struct.unpack_from('<IHHII', b, aux)
        nxt = aux + vna_next if vna_next else None
        if name(vna_name) in names:
            if other in used:
                sys.exit('%s: %s is still used by a symbol' % (path, name(vna_name)))
            if vn_cnt == 1:
                sys.exit('%s: %s is the only version needed from %s' % (path, name(vna_name), name(vn_file)))
            # unlink: the previous entry (or the Verneed) skips this one
            if prev is None:
                struct.pack_into('<I', b, need + 8, (nxt - need) if nxt else 0)
            else:
                struct.pack_into('<I', b, prev + 12, (nxt - prev) if nxt else 0)
            vn_cnt -= 1
            struct.pack_into('<H', b, need + 2, vn_cnt)
            removed.append(name(vna_name))
        else:
            prev = aux
        if nxt is None:
            break
        aux = nxt
    if not vn_next:
        break
    need += vn_next
if set(removed) != names:
    sys.exit('%s: found %s of %s' % (path, sorted(set(removed)), sorted(names)))
open(path, 'wb').write(b)
EOF
done
if [ -n "$shim" ]; then
    $CC -shared -fPIC -O2 -o "$LIBDIR/libisoc23.so" "$SHIM_SRC"
    LIBS_EXTRA=" UCX_LIBS=-lisoc23"
    echo "ucx_deb.sh: built $LIBDIR/libisoc23.so from $SHIM_SRC"
fi
echo "ucx_deb.sh: UCX $VERSION ($FROM) in $DIR; the second UCX column:"
echo "  make bench UCX_PREFIX=$DIR$LIBS_EXTRA UCX_NAME=\"UCX $UPSTREAM\""
echo "  make bench-counts UCX_PREFIX=$DIR$LIBS_EXTRA UCX_NAME=\"UCX $UPSTREAM\""
