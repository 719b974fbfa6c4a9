#!/bin/sh
# Fuzz every target in fuzz/ for SECONDS each (default 30) with libFuzzer, on the stable
# toolchain. Installs cargo-fuzz the first time. Exits non-zero if any target crashes (or hangs,
# or runs out of memory), after printing the input that did it.
#
#   scripts/fuzz.sh [SECONDS]
#
# Environment:
#   FLASHRAID_FUZZ_SANITIZER  none (default) or address. The targets' code is safe Rust, so
#                             AddressSanitizer adds little and costs 3-4x the speed; `address`
#                             needs nightly flags, which RUSTC_BOOTSTRAP=1 unlocks on stable.
#   CARGO_TARGET_DIR          default fuzz/target (gitignored)
#
# The growing corpus is kept in fuzz/corpus/<target> and crashes in fuzz/artifacts/<target>
# (both gitignored); the committed seeds in fuzz/seeds/<target> are read, never written.
# See fuzz/README.md for running one target and turning a crash into a regression test.
set -eu
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

seconds="${1:-30}"
case "$seconds" in
    '' | *[!0-9]*)
        echo "usage: $0 [SECONDS]  (whole seconds per target, default 30)" >&2
        exit 2
        ;;
esac
sanitizer="${FLASHRAID_FUZZ_SANITIZER:-none}"
case "$sanitizer" in
    none) ;;
    address) export RUSTC_BOOTSTRAP=1 ;;
    *)
        echo "FLASHRAID_FUZZ_SANITIZER must be none or address, not $sanitizer" >&2
        exit 2
        ;;
esac
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/fuzz/target}"

# libfuzzer-sys compiles libFuzzer itself (C++).
need_packages g++
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

echo "== building the fuzz targets (sanitizer: $sanitizer)"
cargo fuzz build --fuzz-dir fuzz --sanitizer "$sanitizer"

failed=""
for target in $(cargo fuzz list --fuzz-dir fuzz); do
    corpus="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    log="fuzz/artifacts/$target.log"
    mkdir -p "$corpus" "$artifacts"
    seeds=""
    if [ -d "fuzz/seeds/$target" ]; then
        seeds="fuzz/seeds/$target"
    fi
    echo "== $target: ${seconds}s (log: $log)"
    # $seeds is empty or one path without spaces: split on purpose so that empty means absent.
    # shellcheck disable=SC2086
    if cargo fuzz run --fuzz-dir fuzz --sanitizer "$sanitizer" "$target" "$corpus" $seeds -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
        echo "   ok: ${runs:-?} runs, ${rate:-?} exec/s, corpus $(find "$corpus" -type f | wc -l) inputs"
    else
        failed="$failed $target"
        echo "   FAILED: $target"
        grep -E -A 3 "panicked at|ERROR: (libFuzzer|AddressSanitizer)" "$log" \
            | grep -v -E "^--|stack backtrace" | head -n 6 | sed 's/^/   /' || true
        input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        if [ -n "$input" ]; then
            echo "   crashing input: $input"
            echo "   reproduce: cargo fuzz run --sanitizer $sanitizer $target $input"
            echo "   minimize:  cargo fuzz tmin --sanitizer $sanitizer $target $input"
        else
            echo "   no input written; see $log"
        fi
    fi
done

if [ -n "$failed" ]; then
    echo "== fuzzing FAILED:$failed"
    exit 1
fi
echo "== every fuzz target ran ${seconds}s without a crash"
