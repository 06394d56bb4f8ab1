#!/bin/sh
# A plain `make` on a machine without a build dependency names the Debian package and the apt-get
# line, and stops before compiling anything (issue 8); it installs nothing. Simulated with a
# compiler that cannot find <uthash.h> and <jemalloc/jemalloc.h>.
# Usage: tests/pkg/test_deps.sh RESULTS_FILE (run from the top of the tree)
out=$1
: > "$out"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
cat > "$T/cc" <<'CC'
#!/bin/sh
# cc, except that uthash.h and jemalloc/jemalloc.h are missing
src=$(cat)
case $src in *uthash.h*|*jemalloc/jemalloc.h*) echo "fatal error: no such header" >&2; exit 1;; esac
printf '%s\n' "$src" | exec cc "$@"
CC
chmod +x "$T/cc"
check() {
    make --no-print-directory CC="$T/cc" B="$T/build" all > "$T/log" 2>&1 && { echo "make succeeded"; return 1; }
    grep -q 'sudo apt-get install -y libjemalloc-dev uthash-dev$' "$T/log" || { echo "no apt-get line"; return 1; }
    ! grep -q 'libibverbs-dev' "$T/log" || { echo "named a package that is present"; return 1; }
    grep -q 'missing build dependencies' "$T/log" || { echo "make did not stop cleanly"; return 1; }
    [ ! -e "$T/build" ] || { echo "make compiled something"; return 1; }
}
if check; then echo "deps:plain-make-names-missing-packages 1 0" >> "$out"
else cat "$T/log"; echo "!! plain make with missing packages"; echo "deps:plain-make-names-missing-packages 0 1" >> "$out"; fi
exit 0
