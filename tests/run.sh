#!/bin/sh
# Run test binaries; append "name passed failed" for each to the results file.
# Usage: tests/run.sh RESULTS BINARY...
out=$1; shift
: > "$out"
for t in "$@"; do
    log=$(mktemp)
    "$t" > "$log" 2>&1
    rc=$?
    cat "$log"
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "!! $t exited with status $rc"; fi
    echo "$t $passed $failed" >> "$out"
    rm -f "$log"
done
exit 0
