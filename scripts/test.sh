#!/bin/sh
# The whole test suite, on a fresh Debian machine with only Rust installed: installs what the
# tests need (ISA-L as the parity oracle), then formatting, clippy with warnings as errors, and
# every test, and a short fuzzing pass over every decoder. CI runs exactly this (.ci/run).
#
# FLASHRAID_FUZZ_SECONDS: seconds per fuzz target (default 15; 0 skips fuzzing).
set -eu
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

# ISA-L: the parity oracle. Then the real NBD clients of the end-to-end test, and Chromium
# (with PIL to look at its screenshot) for the lab's HTML report.
need_packages libisal-dev fio nbdkit libnbd-bin python3-libnbd nbdfuse fuse3 qemu-utils openssl \
    xfsprogs e2fsprogs chromium python3-pil iproute2 postmark
need_rust_components rustfmt clippy

echo "== parity kernels on this CPU (the differential tests cover every supported one)"
cargo run --quiet --locked -p flashraid-cli -- kernels

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

echo "== end to end: flashraid serve with nbdinfo, nbdsh, qemu-io, nbdcopy, fio, XFS and ext4"
cargo build --release --locked -p flashraid-cli
scripts/e2e-nbd.sh target/release/flashraid

echo "== end to end: the benchmark lab (quick SNIA runs, compare, the report in headless Chromium)"
scripts/e2e-lab.sh target/release/flashraid

fuzz_seconds="${FLASHRAID_FUZZ_SECONDS:-15}"
if [ "$fuzz_seconds" != 0 ]; then
    echo "== fuzzing every decoder, ${fuzz_seconds}s each (scripts/fuzz.sh)"
    scripts/fuzz.sh "$fuzz_seconds"
fi

echo "== all tests passed"
