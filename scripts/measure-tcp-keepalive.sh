#!/bin/bash
# Measure how long `flashraid serve` keeps a TCP connection whose peer went silent (a crashed
# host, a cut cable: no FIN, no RST), which the server's keepalive settings should end in
# about 2 minutes (docs/safety.md). Needs root (a network namespace and a veth pair) and
# nbdsh (libnbd-bin). Takes about 2.5 minutes; prints "closed after N s".
#
#   scripts/measure-tcp-keepalive.sh [path/to/flashraid]
set -euo pipefail
F=${1:-$(dirname "$0")/../target/release/flashraid}
D=$(mktemp -d /tmp/flashraid-keepalive.XXXXXX)
NS=frka$$
SRV=
CL=
cleanup() {
  [ -n "$CL" ] && kill "$CL" 2>/dev/null || true
  [ -n "$SRV" ] && { kill -TERM "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; } || true
  ip netns del "$NS" 2>/dev/null || true
  ip link del "${NS}a" 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
"$F" create --level 6 --name ka --size 64M "$D"/m0 "$D"/m1 "$D"/m2 "$D"/m3 > /dev/null
ip netns add "$NS"
ip link add "${NS}a" type veth peer name "${NS}b"
ip link set "${NS}b" netns "$NS"
ip addr add 10.213.0.1/24 dev "${NS}a"
ip link set "${NS}a" up
ip netns exec "$NS" ip addr add 10.213.0.2/24 dev "${NS}b"
ip netns exec "$NS" ip link set "${NS}b" up
# Beyond loopback without TLS only because the client is in a namespace of this machine.
"$F" serve --socket "$D"/nbd.sock --control "$D"/ka.control --tcp 10.213.0.1:10809 \
  --insecure-tcp "$D"/m0 "$D"/m1 "$D"/m2 "$D"/m3 > "$D"/serve.log 2>&1 &
SRV=$!
connections() {
  "$F" status --control "$D"/ka.control --json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["nbd"]["server_connections"])'
}
for _ in $(seq 50); do [ -S "$D"/ka.control ] && break; sleep 0.1; done
# A client that reads once, then sits idle holding its connection.
ip netns exec "$NS" env PATH=/usr/bin:"$PATH" nbdsh -u nbd://10.213.0.1/ka \
  -c 'h.pread(4096, 0); import time; time.sleep(3600)' 2> "$D"/client.err &
CL=$!
for _ in $(seq 50); do [ "$(connections)" = 1 ] && break; sleep 0.1; done
[ "$(connections)" = 1 ] || { echo "the client did not connect:"; cat "$D"/client.err; exit 1; }
# The peer goes silent: its side of the link goes down, so nothing it sends or answers
# reaches the server.
ip netns exec "$NS" ip link set "${NS}b" down
start_s=$(date +%s)
while [ "$(connections)" != 0 ]; do
  if [ $(( $(date +%s) - start_s )) -gt 600 ]; then echo "still open after 600 s"; exit 1; fi
  sleep 1
done
echo "closed after $(( $(date +%s) - start_s )) s"
grep 'connection closed' "$D"/serve.log || true
