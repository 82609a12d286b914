#!/usr/bin/env bash
# The first command's time: `ntm train copy` on empty caches (new empty TORCH_EXTENSIONS_DIR and
# TORCHINDUCTOR_CACHE_DIR, so the native library is built as on a fresh machine), the whole
# command timed, then the same again warm (library built); RUNS times (default 2). Prints each
# time, the run's stopping line and its L = 120 row (length, sequences, cost, wrong bits, perfect).
#
#     bash scripts/first_command.sh            # NTM=path/to/ntm to time another install
set -u
NTM=${NTM:-ntm}
for i in $(seq 1 "${RUNS:-2}"); do
    d=$(mktemp -d)
    mkdir -p "$d/ext" "$d/ind" "$d/run"
    for kind in cold warm; do
        rm -rf "$d/run/runs"
        start=$(date +%s.%N)
        (cd "$d/run" && TORCH_EXTENSIONS_DIR="$d/ext" TORCHINDUCTOR_CACHE_DIR="$d/ind" \
            "$NTM" train copy > out.txt 2>&1)
        end=$(date +%s.%N)
        echo "$kind $i: $(echo "$end - $start" | bc) s | $(grep -E '^(converged|stopped)' \
            "$d/run/out.txt" | cut -c1-60) | L=120: $(grep -E '^ +120 ' "$d/run/out.txt" | tr -s ' ')"
    done
    rm -rf "$d"
done
