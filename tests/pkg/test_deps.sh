#!/bin/sh
# A plain `make` on a machine without a build dependency names the Debian package and the apt-get
# line, and stops before compiling anything (issue 8); it installs nothing. Simulated with a
# compiler that cannot find <uthash.h> and <jemalloc/jemalloc.h>. And `make demo` installs (or, when
# not root, names) only the packages the demo builds with.
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

# `make demo` on a machine with none of the packages, as a user who is not root: it names the three
# packages the demo builds with, not the test set's (cmocka, clang, UCX, cmake ...), and stops.
# dpkg-query answers "not installed" for every package and id says uid 1000, so nothing installs.
mkdir -p "$T/bin"
printf '#!/bin/sh\nexit 1\n' > "$T/bin/dpkg-query"
printf '#!/bin/sh\necho 1000\n' > "$T/bin/id"
chmod +x "$T/bin/dpkg-query" "$T/bin/id"
demo_deps() {
    PATH="$T/bin:$PATH" make --no-print-directory -n B="$T/build" demo > "$T/log" 2>&1 && { echo "make demo went on"; return 1; }
    grep -q 'missing packages: build-essential libibverbs-dev uthash-dev$' "$T/log" ||
        { echo "make demo did not name exactly the demo's packages"; return 1; }
    # the control: make test names the whole set
    PATH="$T/bin:$PATH" make --no-print-directory -n B="$T/build" test > "$T/log2" 2>&1 && { echo "make test went on"; return 1; }
    grep -q 'missing packages: .*libcmocka-dev.*libucx-dev' "$T/log2" || { cat "$T/log2"; echo "make test did not name its packages"; return 1; }
}
if demo_deps; then echo "deps:make-demo-needs-only-its-packages 1 0" >> "$out"
else cat "$T/log"; echo "!! make demo's packages"; echo "deps:make-demo-needs-only-its-packages 0 1" >> "$out"; fi
exit 0
