#!/bin/sh
# End-to-end test of the benchmark lab (`flashraid bench run` / `compare`): quick runs of
# every SNIA profile, vm-images and degraded-rebuild against raw member files and a flashraid
# array served over NBD, a run against a file named as a target, a comparison of the two,
# the refusals that protect other people's data, and the HTML report opened in headless
# Chromium, which must draw its charts (the screenshot is kept in target/test-artifacts/lab/).
#
# Usage: scripts/e2e-lab.sh path/to/flashraid
set -eu
bin=$(realpath "$1")
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/flashraid-e2e-lab.XXXXXX)
members=$(mktemp -d /dev/shm/flashraid-e2e-lab.XXXXXX)
artifacts=target/test-artifacts/lab
# Two load hosts for the fio client/server test: network namespaces with veth pairs.
ns_prefix="flab$$"
netns_cleanup() {
    for i in 1 2; do
        if [ -f "$work/fio-server-$i.pid" ]; then kill "$(cat "$work/fio-server-$i.pid")" 2>/dev/null || true; fi
        ip netns del "$ns_prefix$i" 2>/dev/null || true
        ip link del "${ns_prefix}v$i" 2>/dev/null || true
    done
}
trap 'netns_cleanup; rm -rf "$work" "$members"' EXIT
# dash runs the EXIT trap on exit only: make a signal an exit, so namespaces and fio servers go.
trap 'exit 1' INT TERM HUP
mkdir -p "$artifacts"

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_refusal() { # expect_refusal "what the message must say" command...
    want="$1"; shift
    if "$@" >"$work/refusal.out" 2>&1; then fail "accepted: $*"; fi
    grep -q "$want" "$work/refusal.out" || { cat "$work/refusal.out"; fail "no '$want' in the refusal"; }
}

echo "-- refusals: named targets need --destroy-data, foreign directories, unknown targets"
truncate -s 64M "$work/victim"
expect_refusal "destroy-data" "$bin" bench run --target "path:$work/victim" --out "$work/x"
mkdir "$work/foreign" && echo precious > "$work/foreign/keep"
expect_refusal "did not make" "$bin" bench run --dir "$work/foreign" --out "$work/x"
[ "$(cat "$work/foreign/keep")" = precious ] || fail "a foreign file was touched"
ln -s "$work/foreign" "$work/link"
expect_refusal "symlinks are refused" "$bin" bench run --dir "$work/link" --out "$work/x"
mkdir -m 777 "$work/open"
expect_refusal "writable by others" "$bin" bench run --dir "$work/open" --out "$work/x"
expect_refusal "destroy-data" "$bin" bench run --profile small-files --target "path:$work/victim" --out "$work/x"
expect_refusal "needs the flashraid target" "$bin" bench run --profile degraded-rebuild --target members --out "$work/x"
expect_refusal "xfs needs at least 300.0 MiB" "$bin" bench run --profile small-files --fs xfs \
    --members 4 --member-size 32M --dir "$members/m" --target members --out "$work/x"
expect_refusal "unknown target" "$bin" bench run --target floppy --out "$work/x"

echo "-- quick run of every SNIA profile: raw members and flashraid RAID 6 over NBD"
"$bin" bench run --profile snia-iops,snia-latency,snia-throughput --members 6 \
    --member-size 32M --dir "$members/m" --out "$work/run1" >"$work/run1.out" 2>"$work/run1.err" \
    || { tail -30 "$work/run1.err"; fail "bench run"; }
# The run's member files (RAM on tmpfs) go when it ends; the marked directory stays.
if ls "$members"/m/member* 2>/dev/null; then fail "the run left its member files"; fi
[ -e "$members/m/.flashraid-lab" ] || fail "the lab's directory marker is gone"
for profile in snia-iops snia-latency snia-throughput; do
    d="$work/run1/$profile"
    for f in run.json results.csv report.md report.html manifest.json; do
        [ -s "$d/$f" ] || fail "$d/$f missing"
    done
    grep -q "quick-smoke" "$d/report.md" || fail "$profile: no conformance label"
    grep -q "Steady state determination" "$d/report.md" || fail "$profile: no SS table"
    grep -q "ratio to members" "$d/report.md" || fail "$profile: no comparison"
    grep -q "Server CPU .* on flashraid" "$d/report.md" || fail "$profile: no server CPU per IO"
    ls "$d"/0-members/*/round-1.json "$d"/1-flashraid/*/round-1.json >/dev/null \
        || fail "$profile: raw fio JSON not kept"
    grep -q '"fio"' "$d/manifest.json" || fail "$profile: manifest without fio version"
    # One CSV row per element per round per target: check against run.json.
    /usr/bin/python3 - "$d" <<'EOF'
import json, sys, csv
d = sys.argv[1]
run = json.load(open(f"{d}/run.json"))
rows = list(csv.DictReader(open(f"{d}/results.csv")))
want = sum(len(r["elements"]) for t in run["targets"] for test in t["tests"] for r in test["rounds"])
assert len(rows) == want > 0, (len(rows), want)
names = [t["name"] for t in run["targets"]]
assert names == ["members", "flashraid"], names
for t in run["targets"]:
    for test in t["tests"]:
        assert test["rounds"], f"{t['name']} {test['plan']['name']}: no rounds"
        for r in test["rounds"]:
            for e in r["elements"]:
                assert e["read"]["ios"] + e["write"]["ios"] > 0, (t["name"], e["name"])
print(f"   {d.rsplit('/',1)[1]}: {want} element results, CSV consistent")
EOF
done
grep -q "IOPS" "$work/run1.out" || fail "no results printed"

echo "-- the array in process (flashraid's own load generator, no NBD) beside it over NBD"
"$bin" bench run --profile snia-latency --target flashraid --target flashraid-inproc --members 4 \
    --member-size 32M --dir "$members/m" --out "$work/run7" >"$work/run7.out" 2>"$work/run7.err" \
    || { tail -30 "$work/run7.err"; fail "bench run flashraid-inproc"; }
/usr/bin/python3 - "$work/run7/snia-latency/run.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
assert [t["name"] for t in run["targets"]] == ["flashraid", "flashraid-inproc"]
inproc = run["targets"][1]
assert "not fio" in inproc["description"], inproc["description"]
for test in inproc["tests"]:
    assert test["rounds"], test["plan"]["name"]
    for r in test["rounds"]:
        for e in r["elements"]:
            busy = [d for d in (e["read"], e["write"]) if d["ios"] > 0]
            assert busy, e["name"]
            for d in busy:
                assert d["percentiles"]["latency_us_p99"] is not None, e["name"]
print(f"   flashraid-inproc: {sum(len(t['rounds']) for t in inproc['tests'])} rounds with latencies")
EOF
expect_refusal "SNIA profiles only" "$bin" bench run --profile vm-images --target flashraid-inproc \
    --out "$work/x"

echo "-- vm-images: 32 VMs of mixed random IO, each its own NBD connection; fairness and tails"
"$bin" bench run --profile vm-images --members 6 --member-size 32M --dir "$members/m" \
    --out "$work/run3" >"$work/run3.out" 2>"$work/run3.err" \
    || { tail -30 "$work/run3.err"; fail "bench run vm-images"; }
grep -q "Jain fairness" "$work/run3/vm-images/report.md" || fail "vm-images: no fairness"
grep -q "IOPS over time, all VMs" "$work/run3/vm-images/report.html" || fail "vm-images: no timeline"
grep -q "Mean latency over time" "$work/run3/vm-images/report.html" || fail "vm-images: no latency timeline"
/usr/bin/python3 - "$work/run3/vm-images/vm-run.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
assert [t["name"] for t in run["targets"]] == ["members", "flashraid"]
for t in run["targets"]:
    for rep in t["repetitions"]:
        assert len(rep) == 32, (t["name"], len(rep))
        assert all(j["read"]["ios"] > 0 and j["write"]["ios"] > 0 for j in rep), t["name"]
    # One IOPS timeline per repetition, from fio's 1-s logs of every VM.
    assert len(t["timelines"]) == len(t["repetitions"]), t["name"]
    for line in t["timelines"]:
        assert line is not None, (t["name"], "fio's IOPS logs were not read")
        assert line["bin_ms"] == 1000 and len(line["total_iops"]) >= 10, (t["name"], line)
        assert sum(line["total_iops"]) > 0, (t["name"], line)
        assert max(line["slowest_vm_iops"]) > 0, (t["name"], "every VM stalled in every second")
        lat = line["worst_vm_latency_us"]
        assert len(lat) == len(line["total_iops"]) and max(lat) > 0, (t["name"], "no latency over time")
print("   vm-images: 32 VMs did reads and writes on both targets; IOPS over time drawn")
EOF
"$bin" bench compare "$work/run3" "$work/run3/vm-images" --out "$work/cmp3" >/dev/null \
    || fail "compare vm-images runs"
[ "$(grep -c '^| run3-vm-images: ' "$work/cmp3/compare.md")" -ge 4 ] || fail "vm-images compare rows"

echo "-- degraded-rebuild: healthy, a member failed, rebuilding onto a spare, rebuilt; data verified"
"$bin" bench run --profile degraded-rebuild --members 6 --member-size 64M --rebuild-busy-rate 16M \
    --dir "$members/m" --out "$work/run4" >"$work/run4.out" 2>"$work/run4.err" \
    || { tail -30 "$work/run4.err"; fail "bench run degraded-rebuild"; }
/usr/bin/python3 - "$work/run4/degraded-rebuild/degraded-run.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
loads = [l["load_percent"] for l in run["levels"]]
assert loads == [100, 50, 0], loads
for level in run["levels"]:
    assert level["verified"], f"load {level['load_percent']}: data not verified"
    assert level["rebuild_seconds"] > 0 and level["rebuild_bytes"] > 0, level
phases = dict((p, runs) for p, runs in run["levels"][0]["phases"])
assert all(len(phases[p]) >= 1 for p in ["healthy", "degraded", "rebuilding", "rebuilt"]), \
    {p: len(r) for p, r in phases.items()}
print(f"   degraded-rebuild: data intact at every level; {len(phases['rebuilding'])} runs while rebuilding")
# The paced level runs at about half the healthy maximum the 100% level measured.
def healthy_iops(level):
    runs = dict((p, r) for p, r in level["phases"])["healthy"]
    return sum(j["read"]["iops"] + j["write"]["iops"] for j in runs) / len(runs)
full, half = healthy_iops(run["levels"][0]), healthy_iops(run["levels"][1])
assert 0.3 * full <= half <= 0.7 * full, (full, half)
assert run["levels"][1].get("drill") is not None, "the paced level has no drill"
print(f"   paced level: {half:.0f} IOPS healthy against {full:.0f} at saturation")
drill = run["levels"][0]["drill"]
steps = [m["what"] for m in drill["markers"]]
assert steps == ["member 0 failed", "spare added", "rebuilt"], steps
times = [m["at_s"] for m in drill["markers"]]
assert 0 < times[0] < times[1] <= times[2] < len(drill["iops"]) * drill["bin_ms"] / 1000, times
assert sum(1 for v in drill["iops"] if v > 0) >= len(drill["iops"]) - 2, drill["iops"]
assert run["levels"][2].get("drill") is None, "the unloaded level has no drill"
print(f"   drill: {len(drill['iops'])} s of 1-s IOPS, steps at {times}")
EOF
grep -q "one continuous run through a failure and a rebuild" "$work/run4/degraded-rebuild/report.md" \
    || fail "degraded-rebuild drill table"
for chart in "IOPS per second through the drill" "mean latency per second through the drill"; do
    grep -q "$chart" "$work/run4/degraded-rebuild/report.html" || fail "degraded-rebuild: no $chart"
done
# The run beside itself (as a run folder and as its report file): one row per run per level.
"$bin" bench compare "$work/run4" "$work/run4/degraded-rebuild/degraded-run.json" --out "$work/cmp4" \
    >/dev/null || fail "compare degraded-rebuild runs"
[ "$(grep -c '^| run4-degraded-rebuild: flashraid | .* | intact |$' "$work/cmp4/compare.md")" -eq 6 ] \
    || fail "degraded-rebuild compare rows"
grep -q "No foreground load" "$work/cmp4/compare-degraded-rebuild-1.html" \
    || fail "degraded-rebuild compare page"
# The drills compare too: a row per run, and their IOPS on one chart aligned at the failure.
[ "$(grep -c '^| run4-degraded-rebuild: flashraid | [0-9]* | [0-9]*% |' "$work/cmp4/compare.md")" -eq 4 ] \
    || fail "degraded-rebuild compare: drill rows"
grep -q "0 s = the failure" "$work/cmp4/compare-degraded-rebuild-1.html" \
    || fail "degraded-rebuild compare: drill chart"

echo "-- video-frames and small-files: a filesystem made on each target, frames and small files"
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ] || ! losetup --find >/dev/null 2>&1; then
    echo "SKIPPED: the filesystem profiles need root, /dev/fuse and free loop devices"
else
"$bin" bench run --profile video-frames,small-files --members 6 --member-size 640M \
    --dir "$members/m" --out "$work/run5" >"$work/run5.out" 2>"$work/run5.err" \
    || { tail -30 "$work/run5.err"; fail "bench run video-frames,small-files"; }
/usr/bin/python3 - "$work/run5" <<'EOF'
import json, sys
d = sys.argv[1]
frames = json.load(open(f"{d}/video-frames/files-run.json"))
assert [t["name"] for t in frames["targets"]] == ["members", "flashraid"]
# P5a's quick ladder is 256 MiB and 1 GiB files: a member's filesystem (640 MiB) has room
# for the first only, the array's for both.
large_fit = {"members": [256], "flashraid": [256, 1024]}
for t in frames["targets"]:
    skipped = sorted(s["test"] for s in t["skipped"])
    assert skipped == ([] if t["name"] == "flashraid" else
                       ["large file 1024 MiB QD1", "large file 1024 MiB QD4"]), (t["name"], skipped)
    large = {(r["file_bytes"] >> 20, r["iodepth"], r["run"]["phase"]) for r in t["large_files"]}
    want = {(m, q, p) for m in large_fit[t["name"]] for q in [1, 4] for p in ["write", "read"]}
    assert large == want, (t["name"], large ^ want)
    for r in t["large_files"]:
        assert r["run"]["format"]["name"] == "DCI-4K" and r["run"]["frames"] == (r["file_bytes"] // 35389440)
        assert 0 < r["min_mb_per_s"] <= r["run"]["mb_per_s"] * 1.000001, r
    keys = {(r["format"]["name"], r["streams"], r["phase"]) for r in t["frames"]}
    want = {(f, s, p) for f in ["SD", "DCI-4K"] for s in [1, 2] for p in ["write", "read"]}
    assert keys == want, (t["name"], keys ^ want)
    for r in t["frames"]:
        assert r["frames"] >= 4 * r["streams"] and r["mb_per_s"] > 0, r
        assert r["timeline_mb_per_s"] and max(r["timeline_mb_per_s"]) > 0, r
    assert "loop direct IO on" in t["filesystem"], t["filesystem"]
    # P5c: 4 batches up to nearly 95% full, 2 rewritten into the holes, the oldest read.
    steps = [(b["step"], b["batch"]) for b in t["fill"]]
    assert steps == [("fill", 0), ("fill", 1), ("fill", 2), ("fill", 3), ("rewrite", 4),
                     ("rewrite", 5), ("read-oldest", 0)], (t["name"], steps)
    full = [b["fill_percent"] for b in t["fill"] if b["step"] == "fill"]
    assert full == sorted(full) and 75 <= full[-1] <= 96, (t["name"], full)
    assert all(b["run"]["mb_per_s"] > 0 and b["run"]["format"]["name"] == "DCI-4K"
               for b in t["fill"]), t["fill"]
assert "nbdfuse" in frames["targets"][1]["filesystem"]
small = json.load(open(f"{d}/small-files/files-run.json"))
for t in small["targets"]:
    ops = {(m["op"], m["jobs"]) for m in t["metadata"]}
    assert ops == {(o, j) for o in ["create", "stat", "delete"] for j in [1, 16]}, ops
    assert all(m["files"] >= 9984 and m["ops_per_s"] > 0 for m in t["metadata"]), t["metadata"]
    data = t["data"]
    assert data and data["read"]["ios"] > 0 and data["write"]["ios"] > 0, t["name"]
    assert data["sync"]["syncs"] > 0, "fsync=1 but no syncs"
    # PostMark: a process per filesystem, together doing the quick shape's 2000 files.
    pm = t["postmark"]
    want = 6 if t["name"] == "members" else 1
    assert pm and len(pm["processes"]) == want, (t["name"], pm)
    assert sum(p["created_alone"] for p in pm["processes"]) == 2000, pm
    assert all(p["transactions_per_s"] > 0 and p["read"] > 0 for p in pm["processes"]), pm
    assert pm["wall_seconds"] > 0, pm
print("   video-frames: 8 frame tests, the large-file ladder that fits on both targets and "
      "the fill sweep; small-files: 6 metadata tests, data and PostMark")
EOF
grep -q "late at 24 fps" "$work/run5/video-frames/report.md" || fail "video-frames: no late frames"
grep -q "a frame per IO (AJA-like)" "$work/run5/video-frames/report.md" \
    || fail "video-frames: no large-file table"
grep -q "video-frames: fill sweep" "$work/run5/video-frames/report.md" \
    || fail "video-frames: no fill-sweep table"
grep -q "fsync p99" "$work/run5/small-files/report.md" || fail "small-files: no fsync latency"
grep -q "small-files: PostMark" "$work/run5/small-files/report.md" || fail "small-files: no PostMark"
for f in "$work/run5/small-files/0-members/postmark-5.out" "$work/run5/small-files/1-flashraid/postmark-0.out"; do
    grep -q "seconds of transactions" "$f" || fail "PostMark's report not kept: $f"
done
[ "$(grep -o '<svg' "$work/run5/video-frames/report.html" | wc -l)" -ge 18 ] \
    || fail "video-frames: bars, 8 frame-file and 8 large-file MB/s-over-time charts and the fill chart expected"
grep -q "MB/s by how full the filesystem is" "$work/run5/video-frames/report.html" \
    || fail "video-frames: no fill chart"
"$bin" bench compare "$work/run5" "$work/run5/video-frames/files-run.json" --out "$work/cmp5" \
    >/dev/null || fail "compare video-frames and small-files runs"
grep -q "run5-video-frames: flashraid" "$work/cmp5/compare.md" || fail "compare lacks a frames run"
[ -s "$work/cmp5/compare-video-frames-1.html" ] || fail "no compare-video-frames-1.html"
expect_refusal "no profile has two reports" "$bin" bench compare "$work/run5/video-frames" \
    "$work/run5/small-files/files-run.json"
# SIGINT in the middle of a run on the flashraid target: the run unwinds through its teardown.
"$bin" bench run --profile small-files --members 6 --member-size 128M --dir "$members/m" \
    --target flashraid --out "$work/run8" >"$work/run8.out" 2>&1 &
lab_pid=$!
for _ in $(seq 300); do
    grep -q "create 10000 files" "$work/run8.out" && break
    sleep 0.1
done
grep -q "create 10000 files" "$work/run8.out" || { cat "$work/run8.out"; fail "the run did not start"; }
kill -INT "$lab_pid"
if wait "$lab_pid"; then fail "an interrupted run reported success"; fi
grep -q "interrupted by a signal" "$work/run8.out" || { cat "$work/run8.out"; fail "no interruption said"; }
if pgrep -f "serve --socket $members/m/nbd.sock" >/dev/null; then fail "the server outlived the run"; fi
# Everything the lab set up is taken down: no mounts, loop devices or nbdfuse left.
if grep -q flashraid-lab-mnt /proc/mounts; then fail "a lab filesystem is still mounted"; fi
# The member files are removed when a run ends, so look for their paths (a loop device on a
# removed file still names it, with "(deleted)").
if losetup -a | grep -qF "$members/m/"; then fail "a loop device still holds a member file"; fi
if ls "$members"/m/member* 2>/dev/null; then fail "the interrupted run left its member files"; fi
fi

echo "-- load from two hosts (fio servers in network namespaces) over TCP, merged per element"
expect_refusal "insecure-tcp" "$bin" bench run --profile snia-throughput --target flashraid \
    --serve-tcp 192.0.2.1:10819 --load-host 192.0.2.2 --out "$work/x"
expect_refusal "cannot reach" "$bin" bench run --profile snia-throughput --target flashraid \
    --serve-tcp 127.0.0.1:10819 --load-host 192.0.2.2 --out "$work/x"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add "${ns_prefix}1" 2>/dev/null; then
    echo "SKIPPED: the multi-host test needs root and ip netns"
else
    ip netns del "${ns_prefix}1"
    # 10.231.N.1 is this host's end of host N's link; every load host reaches 10.231.1.1.
    for i in 1 2; do
        ip netns add "$ns_prefix$i"
        ip link add "${ns_prefix}v$i" type veth peer name "${ns_prefix}p$i"
        ip link set "${ns_prefix}p$i" netns "$ns_prefix$i"
        ip addr add "10.231.$i.1/24" dev "${ns_prefix}v$i"
        ip link set "${ns_prefix}v$i" up
        ip -n "$ns_prefix$i" addr add "10.231.$i.2/24" dev "${ns_prefix}p$i"
        ip -n "$ns_prefix$i" link set "${ns_prefix}p$i" up
        ip -n "$ns_prefix$i" link set lo up
        ip -n "$ns_prefix$i" route add default via "10.231.$i.1"
        ip netns exec "$ns_prefix$i" fio --server="ip:10.231.$i.2" --daemonize="$work/fio-server-$i.pid"
    done
    # fio's servers listen on port 8765 once they are up.
    for i in 1 2; do
        for _ in $(seq 50); do
            ip netns exec "$ns_prefix$i" ss -Hltn 'sport = :8765' | grep -q 8765 && break
            sleep 0.1
        done
    done
    expect_refusal "small-files run from this host" "$bin" bench run --profile small-files \
        --target flashraid --serve-tcp 10.231.1.1:10819 --insecure-tcp --load-host 10.231.1.2 \
        --out "$work/x"
    expect_refusal "only NBD exports" "$bin" bench run --profile snia-throughput --target members \
        --load-host 10.231.1.2 --out "$work/x"
    expect_refusal "given twice" "$bin" bench run --profile vm-images --target flashraid \
        --serve-tcp 10.231.1.1:10819 --insecure-tcp --load-host 10.231.1.2 --load-host 10.231.1.2 \
        --out "$work/x"
    hosts33=$(for i in $(seq 33); do printf -- '--load-host 10.232.0.%s ' "$i"; done)
    # shellcheck disable=SC2086 # one word per option
    expect_refusal "at least one VM" "$bin" bench run --profile vm-images --target flashraid \
        --serve-tcp 10.231.1.1:10819 --insecure-tcp $hosts33 --out "$work/x"
    # A host with no fio server listening is refused before anything runs.
    expect_refusal "10.231.2.2,9: cannot reach its fio server" "$bin" bench run \
        --profile snia-throughput --target flashraid --serve-tcp 10.231.1.1:10819 --insecure-tcp \
        --load-host 10.231.1.2 --load-host 10.231.2.2,9 --out "$work/x"
    "$bin" bench run --profile snia-throughput --target flashraid --serve-tcp 10.231.1.1:10819 \
        --insecure-tcp --load-host 10.231.1.2 --load-host 10.231.2.2 --members 6 --member-size 32M \
        --dir "$members/m" --out "$work/run6" >"$work/run6.out" 2>"$work/run6.err" \
        || { tail -30 "$work/run6.err"; fail "bench run with two load hosts"; }
    /usr/bin/python3 - "$work/run6/snia-throughput" <<'EOF'
import json, sys, glob
d = sys.argv[1]
manifest = json.load(open(f"{d}/manifest.json"))
assert "10.231.1.2, 10.231.2.2" in manifest["load hosts"], manifest.get("load hosts")
for path in glob.glob(f"{d}/0-flashraid/*/round-*.json"):
    text = open(path).read()
    raw = json.loads(text[text.index("{"):])
    hosts = {c["hostname"] for c in raw["client_stats"] if c["jobname"] != "All clients"}
    assert hosts == {"10.231.1.2", "10.231.2.2"}, (path, hosts)
# Each element's merged IOs equal the sum of the two hosts' IOs in the raw output.
run = json.load(open(f"{d}/run.json"))
test = run["targets"][0]["tests"][0]
first = test["rounds"][0]
text = open(f"{d}/0-flashraid/{test['plan']['name']}/round-1.json").read()
raw = json.loads(text[text.index("{"):])
for e in first["elements"]:
    want = sum(c["read"]["total_ios"] + c["write"]["total_ios"] for c in raw["client_stats"]
               if c["jobname"] == e["name"])
    got = e["read"]["ios"] + e["write"]["ios"]
    assert got == want > 0, (e["name"], got, want)
print(f"   two load hosts: every round ran on both; {len(first['elements'])} elements merged")
EOF
    echo "-- vm-images from the same two load hosts: 16 VMs each, every VM kept apart"
    "$bin" bench run --profile vm-images --target flashraid --serve-tcp 10.231.1.1:10819 \
        --insecure-tcp --load-host 10.231.1.2 --load-host 10.231.2.2 --members 6 \
        --member-size 32M --dir "$members/m" --out "$work/run9" >"$work/run9.out" \
        2>"$work/run9.err" || { tail -30 "$work/run9.err"; fail "vm-images with two load hosts"; }
    grep -q "IOPS over time, all VMs" "$work/run9/vm-images/report.html" \
        || { tail -30 "$work/run9.err"; fail "vm-images from two hosts: no timeline"; }
    /usr/bin/python3 - "$work/run9/vm-images" <<'EOF'
import json, sys, glob
d = sys.argv[1]
run = json.load(open(f"{d}/vm-run.json"))
[t] = run["targets"]
assert "2 load host(s)" in t["description"], t["description"]
text = open(f"{d}/0-flashraid/vm-1.json").read()
raw = json.loads(text[text.index("{"):])
vms = [c for c in raw["client_stats"] if c["jobname"] != "All clients"]
per_host = {}
for c in vms:
    per_host[c["hostname"]] = per_host.get(c["hostname"], 0) + 1
assert per_host == {"10.231.1.2": 16, "10.231.2.2": 16}, per_host
# Each host's VMs run under its own job name, which is how the lab tells the hosts apart.
names = {(c["hostname"], c["jobname"]) for c in vms}
assert names == {("10.231.1.2", "vm-h0"), ("10.231.2.2", "vm-h1")}, names
# Every VM is in the report on its own, with the figures its host reported.
[rep] = t["repetitions"]
assert len(rep) == 32, len(rep)
assert sorted(j["read"]["ios"] for j in rep) == sorted(c["read"]["total_ios"] for c in vms)
assert all(j["read"]["ios"] > 0 and j["write"]["ios"] > 0 for j in rep)
# The two hosts' VMs work on disjoint slices: host 1's job starts where host 0's VMs end.
jobs = [open(f"{d}/0-flashraid/vm-1-h{k}.fio").read() for k in (0, 1)]
slice_ = int([l for l in jobs[0].splitlines() if l.startswith("offset_increment=")][0].split("=")[1])
assert "\noffset=" not in jobs[0], "host 0 starts at the first VM's slice"
assert f"\noffset={16 * slice_}\n" in jobs[1], jobs[1]
[line] = t["timelines"]
assert line is not None, "the per-VM logs fio's client brought back were not read"
assert sum(line["total_iops"]) > 0 and max(line["slowest_vm_iops"]) > 0, line
print(f"   vm-images from two hosts: 16 VMs each, {len(line['total_iops'])} s of IOPS over time")
EOF
    echo "-- degraded-rebuild from the same two load hosts: each on its share, one drill timeline"
    "$bin" bench run --profile degraded-rebuild --target flashraid --serve-tcp 10.231.1.1:10819 \
        --insecure-tcp --load-host 10.231.1.2 --load-host 10.231.2.2 --members 6 \
        --member-size 64M --rebuild-busy-rate 16M --dir "$members/m" --out "$work/run10" \
        >"$work/run10.out" 2>"$work/run10.err" \
        || { tail -30 "$work/run10.err"; fail "degraded-rebuild with two load hosts"; }
    /usr/bin/python3 - "$work/run10/degraded-rebuild" <<'EOF'
import json, sys, glob, os
d = sys.argv[1]
hosts = {"10.231.1.2", "10.231.2.2"}
manifest = json.load(open(f"{d}/manifest.json"))
assert "10.231.1.2, 10.231.2.2" in manifest["load hosts"], manifest.get("load hosts")
run = json.load(open(f"{d}/degraded-run.json"))
assert [l["load_percent"] for l in run["levels"]] == [100, 50, 0]
assert all(l["verified"] for l in run["levels"]), "data not verified"
# The paced level's rate is shared among every thread of both hosts: together they run at
# about half the healthy maximum, not half per host.
def healthy_iops(level):
    runs = dict((p, r) for p, r in level["phases"])["healthy"]
    return sum(j["read"]["iops"] + j["write"]["iops"] for j in runs) / len(runs)
full, half = healthy_iops(run["levels"][0]), healthy_iops(run["levels"][1])
assert 0.3 * full <= half <= 0.7 * full, (full, half)
level = run["levels"][0]
phases = dict((p, runs) for p, runs in level["phases"])
folder = f"{d}/0-flashraid/load-100"
checked = 0
for phase in ["healthy", "degraded", "rebuilding", "rebuilt"]:
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{folder}/{phase}-*.json"))
    assert len(names) == len(phases[phase]) >= 1, (phase, names, len(phases[phase]))
    for name, merged in zip(sorted(names, key=lambda n: int(n.split("-")[-1])), phases[phase]):
        text = open(f"{folder}/{name}.json").read()
        raw = json.loads(text[text.index("{"):])
        jobs = [c for c in raw["client_stats"] if c["jobname"] != "All clients"]
        assert {c["hostname"] for c in jobs} == hosts, (name, jobs)
        # The phase's result is the two hosts' merged: their IOs summed.
        want = sum(c["read"]["total_ios"] + c["write"]["total_ios"] for c in jobs)
        got = merged["read"]["ios"] + merged["write"]["ios"]
        assert got == want > 0, (name, got, want)
        # Each host loads its own share of the second half: host 1 starts where host 0 ends.
        job = [dict(l.split("=", 1) for l in open(f"{folder}/{name}-h{k}.fio").read().splitlines()
                    if "=" in l and not l.startswith(";")) for k in (0, 1)]
        assert int(job[1]["offset"]) == int(job[0]["offset"]) + int(job[0]["size"]), job
        assert job[0]["randseed"] != job[1]["randseed"]
        checked += 1
drill = level["drill"]
assert [m["what"] for m in drill["markers"]] == ["member 0 failed", "spare added", "rebuilt"]
times = [m["at_s"] for m in drill["markers"]]
assert 0 < times[0] < times[1] <= times[2] < len(drill["iops"]) + 1, (times, len(drill["iops"]))
assert sum(1 for v in drill["iops"] if v > 0) >= len(drill["iops"]) - 2, drill["iops"]
# Both hosts' logs came back through fio's client (named with the host) and were read.
for k, host in enumerate(sorted(hosts)):
    logs = glob.glob(f"{folder}/drill-h{k}_iops.*.log.*")
    assert len(logs) == 2, (k, logs)
# Their epoch-stamped samples add up bin by bin to the drill's IOPS, to within the edges.
total = sum(float(l.split(",")[1]) for p in glob.glob(f"{folder}/drill-h*_iops.*.log.*")
            for l in open(p) if l.strip())
assert abs(sum(drill["iops"]) - total) <= 0.01 * total, (sum(drill["iops"]), total)
print(f"   degraded-rebuild from two hosts: {checked} phase runs merged from both, "
      f"drill of {len(drill['iops'])} s with steps at {times}")
EOF
fi

echo "-- a file named as a target (as an md device or a zvol would be), then compare"
truncate -s 256M "$work/victim"
"$bin" bench run --profile snia-throughput --target "path:$work/victim" --destroy-data \
    --out "$work/run2" >"$work/run2.out" 2>"$work/run2.err" \
    || { tail -30 "$work/run2.err"; fail "bench run on a file"; }
grep -q "not purged" "$work/run2/snia-throughput/report.md" || fail "named target not marked unpurged"
"$bin" bench compare "$work/run1" "$work/run2" --out "$work/cmp" >"$work/cmp.out" \
    || fail "bench compare"
grep -q "victim" "$work/cmp/compare.md" || fail "compare lacks the second run"
[ -s "$work/cmp/compare-snia-throughput.html" ] || fail "no compare-snia-throughput.html"
grep -q "not purged" "$work/cmp/compare.md" || fail "compare hides the unpurged target"
# Two multi-profile runs: each profile compared once.
"$bin" bench compare "$work/run1" "$work/run1" --out "$work/cmp2" >/dev/null || fail "compare twice"
for profile in snia-iops snia-latency snia-throughput; do
    n=$(grep -c "^# flashraid lab comparison: $profile\$" "$work/cmp2/compare.md")
    [ "$n" = 1 ] || fail "$profile compared $n times"
done
expect_refusal "not a lab report" "$bin" bench compare "$work/run1/snia-iops/report.md" "$work/run2"

echo "-- the HTML report in headless Chromium"
html="$work/run1/snia-iops/report.html"
# Self-contained: no scripts, nothing fetched (the SVG namespace URI is a name, not a fetch).
if grep -qiE '<script|(src|href)="?https?:|url\(|@import' "$html"; then
    fail "the report needs scripts or the network"
fi
shot="$artifacts/snia-iops-report.png"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,2400 \
    --screenshot="$shot" "file://$html" >/dev/null 2>&1 || fail "chromium"
chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$html" 2>/dev/null >"$work/dom.html"
/usr/bin/python3 - "$shot" "$work/dom.html" <<'EOF'
import sys
from PIL import Image
shot, dom = sys.argv[1], open(sys.argv[2]).read()
charts = dom.count("<svg")
assert charts >= 4, f"{charts} charts in the rendered page"
assert "<polyline" in dom or "<path" in dom, "no lines drawn"
img = Image.open(shot).convert("RGB")
# The series colours of the first two targets (chart.rs PALETTE) must be on screen: the
# charts were drawn, not just laid out.
colours = {(0x1f, 0x77, 0xb4): "members", (0xd6, 0x27, 0x28): "flashraid"}
seen = {name: 0 for name in colours.values()}
for pixel in img.getdata():
    if pixel in colours:
        seen[colours[pixel]] += 1
assert all(n > 200 for n in seen.values()), f"series pixels on screen: {seen}"
print(f"   {charts} charts rendered; series pixels {seen}; screenshot {shot}")
EOF
echo "lab end-to-end: all checks passed"
