#!/bin/sh
# Add up what the phases of make test recorded in a folder, one file per phase, one line per test
# program or check: "name passed failed [skipped]" (tests/run.sh, and the scripts of the other phases).
# Prints a table of the phases, the programs that failed, and the closing line
# "test: N passed, M failed, K skipped"; fails if anything failed or nothing passed.
dir=$1
for f in "$dir"/*; do
    awk -v phase="$(basename "$f")" '{ p += $2; f += $3; s += $4 } END { print phase, p + 0, f + 0, s + 0 }' "$f"
done | awk 'BEGIN { printf "\n%-16s %8s %8s %8s\n", "phase", "passed", "failed", "skipped" }
            { printf "%-16s %8d %8d %8d\n", $1, $2, $3, $4 }'
cat "$dir"/* | awk '
    $3 > 0 { print "FAILED: " $1 }
    { p += $2; f += $3; s += $4 }
    END { printf "test: %d passed, %d failed, %d skipped\n", p, f, s; exit (f > 0 || p == 0) }'
