#!/bin/sh
# Dependencies (issue 8, issue 24): only `make deps` installs Debian packages.
#   1. A plain `make` on a machine without a build dependency names the Debian package and the
#      apt-get line, and stops before compiling anything; it installs nothing. Simulated with a
#      compiler that cannot find <uthash.h> and <jemalloc/jemalloc.h>.
#   2. `make demo` names only the packages the demo builds with (make test, the control, names the
#      whole set), and stops.
#   3. `make test` installs nothing, even as root: it names what is missing and `make deps`, and stops.
#      The control: `make deps` as root runs apt-get install with the whole set, `make deps demo`
#      with the demo's packages only, and as another user it goes through sudo.
# The machine is simulated: dpkg-query answers "not installed" for every package, id, apt-get and sudo
# are stand-ins that record how they were called, so nothing is installed here.
# Usage: tests/pkg/test_deps.sh RESULTS_FILE (run from the top of the tree)
out=$1
: > "$out"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
result() {  # name, then the command; records "name 1 0" or "name 0 1"
    name=$1; shift
    if "$@" > "$T/why" 2>&1; then echo "ok $name"; echo "$name 1 0" >> "$out"
    else cat "$T/why" "$T/log" 2>/dev/null; echo "!! $name failed"; echo "$name 0 1" >> "$out"; fi
    rm -f "$T/log"
}

cat > "$T/cc" <<'CC'
#!/bin/sh
# cc, except that uthash.h and jemalloc/jemalloc.h are missing
src=$(cat)
case $src in *uthash.h*|*jemalloc/jemalloc.h*) echo "fatal error: no such header" >&2; exit 1;; esac
printf '%s\n' "$src" | exec cc "$@"
CC
chmod +x "$T/cc"
plain_make() {
    make --no-print-directory CC="$T/cc" B="$T/build" all > "$T/log" 2>&1 && { echo "make succeeded"; return 1; }
    grep -q 'sudo apt-get install -y libjemalloc-dev uthash-dev$' "$T/log" || { echo "no apt-get line"; return 1; }
    ! grep -q 'libibverbs-dev' "$T/log" || { echo "named a package that is present"; return 1; }
    grep -q 'missing build dependencies' "$T/log" || { echo "make did not stop cleanly"; return 1; }
    [ ! -e "$T/build" ] || { echo "make compiled something"; return 1; }
}
result deps:plain-make-names-missing-packages plain_make

mkdir -p "$T/bin"
printf '#!/bin/sh\nexit 1\n' > "$T/bin/dpkg-query"
printf '#!/bin/sh\necho "${FAKE_UID:-1000}"\n' > "$T/bin/id"
printf '#!/bin/sh\necho "apt-get $*" >> "%s/calls"\n' "$T" > "$T/bin/apt-get"
printf '#!/bin/sh\necho "sudo $*" >> "%s/calls"\n' "$T" > "$T/bin/sudo"
chmod +x "$T/bin/dpkg-query" "$T/bin/id" "$T/bin/apt-get" "$T/bin/sudo"
on_bare() { PATH="$T/bin:$PATH" "$@"; }

# `make demo` as a user on a machine with none of the packages: the three packages the demo builds
# with, not the test set's (cmocka, clang, UCX, cmake ...); the control: make test names the whole set.
demo_deps() {
    on_bare make --no-print-directory -n B="$T/build" demo > "$T/log" 2>&1 && { echo "make demo went on"; return 1; }
    grep -q 'missing packages: build-essential libibverbs-dev uthash-dev$' "$T/log" ||
        { echo "make demo did not name exactly the demo's packages"; return 1; }
    on_bare make --no-print-directory -n B="$T/build" test > "$T/log" 2>&1 && { echo "make test went on"; return 1; }
    grep -q 'missing packages: .*libcmocka-dev.*libucx-dev' "$T/log" || { echo "make test did not name its packages"; return 1; }
}
result deps:make-demo-needs-only-its-packages demo_deps

# `make test` as root installs nothing and points at make deps; `make deps` installs (the control).
only_deps_installs() {
    rm -f "$T/calls"
    FAKE_UID=0 on_bare make --no-print-directory -n B="$T/build" test > "$T/log" 2>&1 && { echo "make test went on"; return 1; }
    [ ! -e "$T/calls" ] || { echo "make test installed:"; cat "$T/calls"; return 1; }
    grep -q 'install them with: make deps ' "$T/log" || { echo "make test did not say make deps"; return 1; }
    FAKE_UID=0 on_bare make --no-print-directory B="$T/build" deps > "$T/log" 2>&1 || { echo "make deps failed"; return 1; }
    grep -q '^apt-get install .*build-essential.*libcmocka-dev.*libucx-dev' "$T/calls" ||
        { echo "make deps did not install the test set:"; cat "$T/calls"; return 1; }
    [ ! -e "$T/build" ] || { echo "make deps built something"; return 1; }
}
result deps:only-make-deps-installs only_deps_installs

# `make deps demo` asks for the demo's packages; as a user, make deps goes through sudo.
deps_demo_and_sudo() {
    on_bare make --no-print-directory -n B="$T/build" deps demo > "$T/log" 2>&1 || { echo "make -n deps demo failed"; return 1; }
    grep -q '\.ci/deps --install --demo$' "$T/log" || { echo "make deps demo does not ask for the demo's set"; return 1; }
    rm -f "$T/calls"
    FAKE_UID=0 on_bare sh .ci/deps --install --demo > "$T/log" 2>&1 || { echo ".ci/deps --install --demo failed"; return 1; }
    grep -q '^apt-get install .* build-essential libibverbs-dev uthash-dev$' "$T/calls" ||
        { echo "not the demo's packages:"; cat "$T/calls"; return 1; }
    rm -f "$T/calls"
    on_bare make --no-print-directory B="$T/build" deps > "$T/log" 2>&1 || { echo "make deps as a user failed"; return 1; }
    grep -q '^sudo .*apt-get install .*libcmocka-dev' "$T/calls" || { echo "no sudo apt-get:"; cat "$T/calls"; return 1; }
}
result deps:make-deps-demo-and-sudo deps_demo_and_sudo
exit 0
