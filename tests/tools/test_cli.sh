#!/bin/sh
# The drc program's command line, as a new user tries it (issue 24): `drc --help` prints the usage
# and exits 0, `drc --version` prints the library's version, and an unknown command or argument is
# refused with exit 2 and the usage on stderr, not taken for another command.
# Usage: tests/tools/test_cli.sh BUILD_DIR RESULTS_FILE (run from the top of the tree)
B=$1 out=$2
: > "$out"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
result() {  # name, then the command; records "name 1 0" or "name 0 1"
    name=$1; shift
    if "$@" > "$T/log" 2>&1; then echo "ok $name"; echo "$name 1 0" >> "$out"
    else cat "$T/log"; echo "!! $name failed"; echo "$name 0 1" >> "$out"; fi
}
# run ARGS...: $rc, $T/out (stdout), $T/err (stderr)
run() { "$B/drc" "$@" > "$T/out" 2> "$T/err"; rc=$?; }

help() {
    run --help
    [ $rc = 0 ] || { echo "drc --help exited $rc"; return 1; }
    grep -q '^usage: drc demo' "$T/out" && grep -q 'drc doctor \[--check\]' "$T/out" &&
        grep -q 'drc --version' "$T/out" || { echo "drc --help printed:"; cat "$T/out" "$T/err"; return 1; }
    [ ! -s "$T/err" ] || { echo "drc --help wrote to stderr:"; cat "$T/err"; return 1; }
}
result cli:help-exits-0 help

version() {
    want=$(sed -n 's/^#define DRC_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' include/drc.h | paste -sd.)
    run --version
    [ $rc = 0 ] && [ "$(cat "$T/out")" = "drc $want" ] || { echo "drc --version: exit $rc:"; cat "$T/out" "$T/err"; return 1; }
}
result cli:version version

refused() {  # ARGS...: exit 2, the usage on stderr, nothing on stdout
    run "$@"
    [ $rc = 2 ] || { echo "drc $*: exit $rc, not 2"; return 1; }
    grep -q '^usage: drc demo' "$T/err" || { echo "drc $*: no usage on stderr:"; cat "$T/err"; return 1; }
    [ ! -s "$T/out" ] || { echo "drc $*: ran something:"; cat "$T/out"; return 1; }
}
result cli:no-command-refused refused
result cli:unknown-command-refused refused --hlep
result cli:unknown-doctor-argument-refused refused doctor --chek
result cli:demo-argument-refused refused demo --fast
exit 0
