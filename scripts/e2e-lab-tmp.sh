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
echo SECTION-OK
