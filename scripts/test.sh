#!/bin/sh
# The whole test suite, on a fresh Debian machine with only Rust installed: installs what the
# tests need (ISA-L as the parity oracle), then formatting, clippy with warnings as errors, and
# every test. CI runs exactly this (.ci/run).
set -eu
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

need_packages libisal-dev
need_rust_components rustfmt clippy

echo "== parity kernels on this CPU (the differential tests cover every supported one)"
cargo run --quiet --locked -p flashraid-cli -- kernels

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

echo "== all tests passed"
