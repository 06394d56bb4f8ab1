#!/bin/sh
# The README's front door works as written (issue 24):
#   1. its first code block gives the two commands a new user types first (make deps demo, make deps test)
#   2. its C example (the ```c block after the "readme-example" marker) compiles and links against
#      the built library with warnings as errors
#   3. the example runs on drc's loopback NIC model: three registrations of one tensor make one NIC
#      registration and two hits
#   4. without the model (no RDMA device here) it stops with its clear message, exit 1; on a machine
#      with a NIC it registers there
#   5. every relative link of README.md names a file or folder of the tree
# Usage: tests/pkg/test_readme.sh BUILD_DIR RESULTS_FILE (run from the top of the tree)
B=$(cd "$1" && pwd) out=$2
: > "$out"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
result() {  # name, then the command; records "name 1 0" or "name 0 1"
    name=$1; shift
    if "$@" > "$T/log" 2>&1; then echo "ok $name"; echo "$name 1 0" >> "$out"
    else cat "$T/log"; echo "!! $name failed"; echo "$name 0 1" >> "$out"; fi
}

two_commands() {
    awk '/^```/ { n++; next } n == 1' README.md > "$T/first"
    grep -q '^make deps demo ' "$T/first" && grep -q '^make deps test ' "$T/first" ||
        { echo "README.md's first code block does not give make deps demo and make deps test:"; cat "$T/first"; return 1; }
}
result readme:two-commands-first two_commands

awk '/<!-- readme-example/ { m = 1; next } m && /^```c/ { on = 1; next } on && /^```/ { exit } on' README.md > "$T/example.c"
compiles() {
    [ -s "$T/example.c" ] || { echo "README.md: no \`\`\`c block after a <!-- readme-example --> marker"; return 1; }
    ${CC:-cc} -Wall -Wextra -Werror -Iinclude -o "$T/example" "$T/example.c" -L"$B" -ldrc -libverbs -Wl,-rpath,"$B"
}
result readme:example-compiles compiles

on_model() {
    LD_LIBRARY_PATH="$B/loopnic" "$T/example" > "$T/out" 2>&1 || { cat "$T/out"; return 1; }
    cat "$T/out"
    grep -qx '1 NIC registration(s), 2 hit(s)' "$T/out"
}
result readme:example-runs-on-the-nic-model on_model

no_nic() {
    env -u LD_LIBRARY_PATH "$T/example" > "$T/out" 2>&1
    rc=$?
    cat "$T/out"
    if [ $rc = 1 ]; then grep -q '^example: no RDMA device to register with' "$T/out"
    else [ $rc = 0 ] && grep -qx '1 NIC registration(s), 2 hit(s)' "$T/out"; fi     # a real NIC here
}
result readme:example-without-a-nic no_nic

links() {
    bad=0
    for l in $(grep -o '](\([^)#:]*\)[)#]' README.md | sed 's/^](//; s/[)#]$//' | sort -u); do
        [ -e "$l" ] || { echo "README.md links to $l, which does not exist"; bad=1; }
    done
    return $bad
}
result readme:relative-links links
exit 0
