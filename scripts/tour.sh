#!/bin/sh
# The main job, on a fresh Debian machine with only Rust installed. Until the array engine
# lands (issue 3) that is the parity benchmark: flashraid's kernels against Intel ISA-L (the
# system's 2.30 and Debian 13's 2.31 with GFNI, unpacked side by side) and the memory.
#
#   scripts/tour.sh          a quick run (about a minute): a first look, not a result
#   scripts/tour.sh --full   the full matrix of docs/PERFORMANCE.md (about 7 minutes)
set -eu
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

need_packages libisal-dev ca-certificates
./scripts/fetch-isal.sh || echo "(could not fetch ISA-L 2.31; comparing with the system's ISA-L only)"
cargo build --release --locked -p flashraid-cli

mkdir -p results
if [ "${1:-}" = "--full" ]; then
    ./target/release/flashraid bench parity --cpu 1 --json results/parity.json
else
    ./target/release/flashraid bench parity --quick --json results/parity-quick.json
    echo
    echo "That was a quick run. The full one (median of 5 x 150 ms per figure, 2 GiB cold pool):"
    echo "  scripts/tour.sh --full"
fi
echo
echo "Arrays (create, serve over NBD, fail and rebuild members) are not built yet: see README.md."
