#!/bin/sh
# The provider's symbol surface is rdma-core's (issue 25): every (name, version, default or not)
# that the system's libibverbs.so.1 exports, build/loopnic/libibverbs.so.1 exports too, so that any
# program, librdmacm or provider library linked against libibverbs loads with the model in place.
# The provider's extras (its LOOPNIC_1 control API, the unversioned libc interposers) are allowed.
# Usage: tests/loopnic/check_surface.sh PROVIDER RESULTS [SYSTEM_LIBIBVERBS]
prov=$1
out=$2
sys=${3:-$(ldconfig -p | sed -n 's/.*libibverbs\.so\.1 (libc6,x86-64) => //p' | head -1)}
: > "$out"
if [ ! -f "$sys" ]; then
    echo "check_surface: no system libibverbs.so.1 (libibverbs1) to compare with"
    echo "surface 0 1" >> "$out"
    exit 0
fi
# "name version" per defined dynamic symbol; a non-default version is printed in parentheses
syms() { objdump -T "$1" | awk 'NF >= 7 && $0 !~ /\*UND\*/ && $(NF-1) ~ /IBVERBS/ { print $NF, $(NF-1) }' | sort -u; }
syms "$sys" > "$out.sys"
syms "$prov" > "$out.prov"
missing=$(comm -23 "$out.sys" "$out.prov")
extra=$(comm -13 "$out.sys" "$out.prov")
rm -f "$out.sys" "$out.prov"
n=$(objdump -T "$sys" | grep -c IBVERBS)
if [ -z "$missing" ] && [ -z "$extra" ]; then
    echo "check_surface: the provider exports all $n IBVERBS symbols of $sys, with their versions"
    echo "surface 1 0" >> "$out"
else
    [ -n "$missing" ] && printf 'check_surface: missing from %s (add to src/loopnic/loopnic.map and implement or stub):\n%s\n' "$prov" "$missing"
    [ -n "$extra" ] && printf 'check_surface: exported by %s under an IBVERBS node but not by %s:\n%s\n' "$prov" "$sys" "$extra"
    echo "surface 0 1" >> "$out"
fi
exit 0
