#!/bin/sh
# Sum what tests/run.sh recorded in every results file of a folder; fail if anything failed.
dir=$1
cat "$dir"/* | awk '
    $3 > 0 { print "FAILED: " $1 }
    { p += $2; f += $3 }
    END { printf "test: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }'
