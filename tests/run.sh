#!/bin/sh
# Run test programs; print a line for each (its whole output when it fails, or always with V=1), and
# append "name passed failed skipped" for each to the results file (tests/summary.sh adds them up).
# The counts are cmocka's; a program that exits non-zero without a failed test counts as one failure.
# Usage: tests/run.sh RESULTS PROGRAM...
out=$1; shift
: > "$out"
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
count() {   # the sum of cmocka's "[  $1 ] N test(s)" summary lines
    sed -n "s/^\[  $1 *\] \([0-9]*\) test.*/\1/p" "$log" | awk '{s+=$1} END {print s+0}'
}
for t in "$@"; do
    "$t" > "$log" 2>&1
    rc=$?
    passed=$(count PASSED) failed=$(count FAILED) skipped=$(count SKIPPED)
    [ "${V:-0}" = 1 ] && cat "$log"
    if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
        [ "${V:-0}" = 1 ] || cat "$log"
        [ "$failed" -ne 0 ] || { failed=1; echo "!! $t exited with status $rc"; }
        status=FAIL
    else
        status=ok
    fi
    printf '  %-4s %-48s %4d passed  %d failed  %d skipped\n' $status "$t" "$passed" "$failed" "$skipped"
    echo "$t $passed $failed $skipped" >> "$out"
done
exit 0
