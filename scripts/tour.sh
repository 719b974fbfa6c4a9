#!/bin/sh
# The main job, on a fresh Debian machine with only Rust installed (about five minutes):
#
#   1. create a RAID 6 over 8 member files and a hot spare (in /dev/shm: tmpfs, where
#      O_DIRECT works; no spare hardware needed),
#   2. serve it over NBD (`flashraid serve`),
#   3. run the same short fio loads through NBD against the array and directly against 8
#      raw files of the same size (the "hardware" column), and print them side by side,
#   4. fail a member under load: the hot spare takes over and is rebuilt (rate-limited while
#      the loads run again, then at full speed), scrub every stripe, run the loads once more,
#      and print the before/during/after figures,
#   5. tell you how to attach the export with nbd-client or qemu, and stop the server,
#   6. end with a quick run of the benchmark lab (`flashraid bench run`: the SNIA IOPS
#      matrix against the raw member files and a RAID 6 over them) and point to its report.
#
#   scripts/tour.sh                  the tour
#   scripts/tour.sh --seconds 10     longer fio runs (default 4 s each)
#   scripts/tour.sh --parity         the parity benchmark against ISA-L instead (issue 2)
#
# Environment: FLASHRAID_TOUR_DIR (default /dev/shm/flashraid-tour) holds the member files;
# it is removed at the end.
set -eu
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

seconds=4
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --parity)
        need_packages libisal-dev ca-certificates
        ./scripts/fetch-isal.sh || echo "(could not fetch ISA-L 2.31; using the system's only)"
        cargo build --release --locked -p flashraid-cli
        mkdir -p results
        exec ./target/release/flashraid bench parity --quick --json results/parity-quick.json
        ;;
    *) echo "usage: $0 [--seconds N] [--parity]" >&2; exit 2 ;;
    esac
done

need_packages fio libnbd-bin python3 qemu-utils
cargo build --release --locked -p flashraid-cli
F="$PWD/target/release/flashraid"
DIR="${FLASHRAID_TOUR_DIR:-/dev/shm/flashraid-tour}"
SOCK="$DIR/tour.sock"
CTL="$DIR/tour.control"
URI="nbd+unix:///tour?socket=$SOCK"
MEMBER_SIZE=384M
SERVER_PID=

cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" || true; fi
    rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
rm -rf "$DIR"
mkdir -p "$DIR" results

echo "== 1. a RAID 6 over 8 member files of $MEMBER_SIZE, and a hot spare, in $DIR"
"$F" create --level 6 --name tour --size "$MEMBER_SIZE" --spare "$DIR/spare" \
    "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 "$DIR"/m4 "$DIR"/m5 "$DIR"/m6 "$DIR"/m7
# The raw column: 8 plain files of the same size (the members hold the array's data).
for i in 0 1 2 3 4 5 6 7; do fallocate -l "$MEMBER_SIZE" "$DIR/raw$i"; done

echo
echo "== 2. serving it: flashraid serve --socket $SOCK --control $CTL ..."
"$F" serve --socket "$SOCK" --control "$CTL" \
    "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 "$DIR"/m4 "$DIR"/m5 "$DIR"/m6 "$DIR"/m7 "$DIR/spare" \
    >"$DIR/serve.log" 2>&1 &
SERVER_PID=$!
i=0
until nbdinfo --size "$URI" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$SERVER_PID" 2>/dev/null; then cat "$DIR/serve.log"; exit 1; fi
    sleep 0.1
done
sed 's/^/   /' "$DIR/serve.log"
echo "   nbdinfo: $(nbdinfo --size "$URI") bytes, block sizes $(nbdinfo --json "$URI" | \
    /usr/bin/python3 -c 'import json,sys; e=json.load(sys.stdin)["exports"][0]; print(e["block_size_minimum"], e["block_size_preferred"], e["block_size_maximum"])')"

RAW_FILES="$DIR/raw0:$DIR/raw1:$DIR/raw2:$DIR/raw3:$DIR/raw4:$DIR/raw5:$DIR/raw6:$DIR/raw7"
# name rw bs jobs qd
LOADS="randread-4k randread 4k 2 32
randwrite-4k randwrite 4k 2 32
seqread-128k read 128k 2 16
seqwrite-1m write 1m 2 8"

run_loads() { # label [targets]: targets "raw array" (default) or "array"
    targets="${2:-raw array}"
    echo "$LOADS" | while read -r name rw bs jobs qd; do
        for target in $targets; do
            out="$DIR/fio-$1-$name-$target.json"
            if [ "$target" = raw ]; then
                set -- "$1" --ioengine=io_uring --direct=1 --filename="$RAW_FILES" --size=256M
            else
                set -- "$1" --ioengine=nbd --uri="$URI" --size=1G
            fi
            label=$1
            shift
            fio --name="$name" --rw="$rw" --bs="$bs" --numjobs="$jobs" --iodepth="$qd" \
                --time_based --runtime="$seconds" --ramp_time=1 --group_reporting \
                --offset_increment=256M --verify_state_save=0 --output-format=json \
                --output="$out" "$@" >/dev/null
            set -- "$label" "$targets"
        done
    done
    [ "$targets" = array ] && return 0
    /usr/bin/python3 - "$DIR" "$1" <<'EOF'
import json, sys, os
d, label = sys.argv[1], sys.argv[2]
print(f"   {'load':<14} {'raw files':>14} {'flashraid NBD':>14} {'ratio':>7} {'p99 lat (us)':>13}")
for name in ["randread-4k", "randwrite-4k", "seqread-128k", "seqwrite-1m"]:
    cells = []
    for target in ["raw", "array"]:
        j = json.load(open(os.path.join(d, f"fio-{label}-{name}-{target}.json")))["jobs"][0]
        io = j["read"] if j["read"]["io_bytes"] else j["write"]
        iops, bw = io["iops"], io["bw_bytes"]
        p99 = io.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000
        cells.append((iops, bw, p99))
    (ri, rb, _), (ai, ab, ap) = cells
    if name.startswith("rand"):
        print(f"   {name:<14} {ri/1e3:>10.0f}k IOPS {ai/1e3:>8.0f}k IOPS {ai/ri*100:>6.0f}% {ap:>13.0f}")
    else:
        print(f"   {name:<14} {rb/1e9:>9.2f} GB/s {ab/1e9:>9.2f} GB/s {ab/rb*100:>6.0f}% {ap:>13.0f}")
EOF
}

echo
echo "== 3. fio, ${seconds} s per load (2 jobs each), raw files vs the array through NBD"
run_loads healthy
echo "   Raw files take the kernel's fastest path; the array adds RAID 6 (a 4k random write"
echo "   is 3 reads and 3 writes on the members) and the NBD socket. See docs/PERFORMANCE.md."

echo
echo "== 4. a member fails under load: the hot spare takes over, is rebuilt, then scrubbed"
"$F" status --control "$CTL" | sed 's/^/   /'
# Limited so that the rebuild spans the loads below; unlimited, it runs as fast as the
# members allow (step 4b).
"$F" rebuild --control "$CTL" --rate 12M | sed 's/^/   /'
echo "   flashraid fail 5  (while the array is loaded)"
fio --name=bg --ioengine=nbd --uri="$URI" --rw=randrw --bs=16k --iodepth=8 --size=1G \
    --time_based --runtime=2 --output=/dev/null >/dev/null 2>&1 &
BG=$!
sleep 1
"$F" fail --control "$CTL" 5 | sed 's/^/   /'
wait "$BG" || true
echo
echo "== 4a. the same loads on the array while it rebuilds"
run_loads rebuilding array
"$F" rebuild --control "$CTL" | sed 's/^/   /'
echo
echo "== 4b. the rate limit lifted: the rest of the rebuild at full speed"
"$F" rebuild --control "$CTL" --rate 0 >/dev/null
START=$(date +%s.%N)
"$F" rebuild --control "$CTL" --wait | tail -n 1 | sed 's/^/   /'
echo "   done $(/usr/bin/python3 -c "print(round($(date +%s.%N) - $START, 1))") s after lifting the limit"
grep -E "takes over|finished in" "$DIR/serve.log" | sed 's/^/   /'
echo
echo "== 4c. scrub: every stripe read and its parity checked"
"$F" scrub --control "$CTL" --wait | tail -n 1 | sed 's/^/   /'
echo
echo "== 4d. the loads again, rebuilt"
run_loads rebuilt array
/usr/bin/python3 - "$DIR" <<'EOF'
import json, sys, os
d = sys.argv[1]
def figure(label, name, target):
    j = json.load(open(os.path.join(d, f"fio-{label}-{name}-{target}.json")))["jobs"][0]
    io = j["read"] if j["read"]["io_bytes"] else j["write"]
    p99 = io.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000
    value = io["iops"] / 1e3 if name.startswith("rand") else io["bw_bytes"] / 1e9
    return value, p99
print("   before / during / after the rebuild (flashraid through NBD; raw files for reference):")
print(f"   {'load':<14} {'raw files':>11} {'healthy':>11} {'rebuilding':>11} {'rebuilt':>11}   p99 us: healthy / rebuilding")
for name in ["randread-4k", "randwrite-4k", "seqread-128k", "seqwrite-1m"]:
    raw, _ = figure("healthy", name, "raw")
    h, hp = figure("healthy", name, "array")
    r, rp = figure("rebuilding", name, "array")
    a, _ = figure("rebuilt", name, "array")
    if name.startswith("rand"):
        fmt = lambda v: f"{v:>6.0f}k IOPS"
    else:
        fmt = lambda v: f"{v:>6.2f} GB/s"
    print(f"   {name:<14} {fmt(raw)} {fmt(h)} {fmt(r)} {fmt(a)}   {hp:>6.0f} / {rp:.0f}")
EOF
echo "   ('rebuilding' ran with the rebuild limited to 12 MiB/s; 'flashraid bench rebuild'"
echo "   measures degraded and rebuilding ratios in one run: docs/PERFORMANCE.md)"
echo

echo "== 5. use it yourself: while 'flashraid serve' runs,"
echo "   qemu:        qemu-system-x86_64 -drive file=nbd+unix:///NAME?socket=SOCKET,format=raw,cache=none ..."
echo "   nbd-client:  nbd-client -unix SOCKET -N NAME -b 4096 /dev/nbd0   (needs the nbd module;"
echo "                this machine has none, so the tests reach the kernel through nbdfuse + a loop device)"
echo "   libnbd:      nbdsh -u 'nbd+unix:///NAME?socket=SOCKET', nbdcopy, nbdfuse"
echo "   fio:         fio --ioengine=nbd --uri='nbd+unix:///NAME?socket=SOCKET' ..."
echo
echo "stopping the server: flashraid stop --control $CTL (as SIGTERM: in-flight IO finishes,"
echo "the array is flushed and marked clean; refused while a client is connected, unless --force)"
"$F" stop --control "$CTL" | sed 's/^/   /'
wait "$SERVER_PID" || true
SERVER_PID=
tail -n 2 "$DIR/serve.log" | sed 's/^/   /'

echo
echo "== 6. the benchmark lab, quick: flashraid bench run --profile snia-iops --member-size 32M"
echo "   (raw member files vs a RAID 6 over them through NBD: purge, preconditioning, rounds"
echo "   of the IOPS matrix until steady state or 6 rounds; a smoke run that claims nothing)"
LAB_OUT="results/lab-tour"
rm -rf "$LAB_OUT"
if ! "$F" bench run --profile snia-iops --member-size 32M --dir "$DIR/lab" --out "$LAB_OUT" \
    >"$DIR/lab.out" 2>"$DIR/lab.log"; then
    tail -n 20 "$DIR/lab.log"
    exit 1
fi
sed -n '/^#### Comparison/,$p' "$DIR/lab.out" | grep -v '^report:' | sed 's/^/   /'
echo "   report: $LAB_OUT/snia-iops/report.html (charts), report.md, results.csv, raw fio JSON;"
echo "   full SNIA runs: --mode full; other targets: --target path:/dev/md0 --destroy-data"
