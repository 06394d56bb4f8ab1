#!/bin/sh
# The exported names of a library, its version script and its public headers agree.
# Usage: tests/abi/check_exports.sh LIBRARY VERSION_SCRIPT HEADER...
# Checks, and says exactly what to change when one fails:
#   - every DRC_API declaration in HEADER... is exported by LIBRARY (a forgotten name);
#   - every name LIBRARY exports is listed in VERSION_SCRIPT and declared in a HEADER, except the
#     internal drc__ names drc's own preload library needs, which sit under a DRC_PRIVATE node;
#   - every name VERSION_SCRIPT lists is exported (a misspelt or unbuilt one);
#   - the script lists names explicitly (no glob but its `local: *;`) and every exported name
#     carries one of its version nodes.
# Prints "ok LIBRARY: N names" or one line per problem; exits 1 on any problem.
set -u
lib=$1 map=$2; shift 2
[ -r "$lib" ] || { echo "check_exports: no $lib (build it first)"; exit 1; }
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
# nm prints "ADDR TYPE name@@NODE"; the node names themselves are absolute (A) symbols
nm -D --defined-only "$lib" | awk 'NF == 3 && $2 != "A" { print $3 }' | sort > "$t/exported_ver"
sed 's/@.*//' "$t/exported_ver" | sort -u > "$t/exported"
# the script without comments; names are the `name;` entries that are not `local: *;`
sed 's:/\*.*\*/::g; /\/\*/,/\*\//d; s/#.*//' "$map" > "$t/map"
tr ' \t{}' '\n\n\n\n' < "$t/map" | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\);$/\1/p' | sort -u > "$t/listed"
nodes=$(sed -n 's/^[[:space:]]*\([A-Za-z_][A-Za-z0-9_.]*\)[[:space:]]*{.*/\1/p' "$t/map")
newest=$(echo "$nodes" | grep -v PRIVATE | tail -n 1)
# every DRC_API declaration, also one spread over lines: without preprocessor lines and comments,
# one declaration per line (split at ";"), the identifier before its first "(", with its header
for h in "$@"; do
    grep -v '^[[:space:]]*#' "$h" | sed 's://.*$::' | tr '\n' ' ' | sed 's:/\*[^*]*\*\+\([^/*][^*]*\*\+\)*/: :g' |
        tr ';' '\n' | grep -w 'DRC_API' | sed 's/(.*//; s/[[:space:]]*$//; s/.*[[:space:]*]//' | sed "s|\$| $h|"
done | sort -u > "$t/declared_where"
cut -d' ' -f1 "$t/declared_where" | sort -u > "$t/declared"
bad=0
say() { echo "check_exports: $*"; bad=1; }
for n in $(comm -23 "$t/declared" "$t/exported"); do
    h=$(awk -v n="$n" '$1 == n { print $2; exit }' "$t/declared_where")
    if grep -qx "$n" "$t/listed"; then
        say "$n is declared DRC_API in $h and listed in $map, but $lib does not define it: link its source into $lib (or fix the spelling)"
    else
        say "$n is declared DRC_API in $h but $lib does not export it: add \"        $n;\" under the node $newest in $map"
    fi
done
for n in $(comm -23 "$t/exported" "$t/listed"); do
    say "$lib exports $n, which $map does not list: add \"        $n;\" under the node $newest in $map, or make it static"
done
# drc__ names are not an API: drc's own preload library calls them; they must sit under a PRIVATE node
for n in $(grep '^drc__' "$t/exported"); do
    grep -qx "$n@@*DRC_PRIVATE[_0-9.]*" "$t/exported_ver" ||
        say "$lib exports the internal name $n outside a DRC_PRIVATE node: move it under DRC_PRIVATE_<version> in $map"
done
for n in $(comm -23 "$t/exported" "$t/declared" | grep -v '^drc__'); do
    say "$lib exports $n, which no header among ($*) declares with DRC_API: declare it there (with its doc comment), or remove it from $map"
done
for n in $(comm -13 "$t/exported" "$t/listed"); do
    grep -qx "$n" "$t/declared" ||
        say "$map lists $n, which $lib does not define and no header declares: remove it from $map"
done
grep -v 'local:[[:space:]]*\*;' "$t/map" | grep -q '[*?[]' &&
    say "$map has a glob pattern: list each exported name explicitly"
grep -q 'local:[[:space:]]*\*;' "$t/map" || say "$map must end its first node with \"local: *;\""
[ -n "$nodes" ] || say "$map has no version node"
while read -r v; do
    node=${v#*@}; node=${node#@}
    [ "$node" != "$v" ] && echo "$nodes" | grep -qx "$node" ||
        say "$lib exports $v, whose version is not a node of $map (is the library linked with --version-script=$map?)"
done < "$t/exported_ver"
[ "$bad" -eq 0 ] && echo "ok $lib: $(wc -l < "$t/exported") names, as $map lists and $* declare"
exit "$bad"
