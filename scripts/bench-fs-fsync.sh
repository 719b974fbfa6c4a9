#!/bin/bash
# The lab's small-files data job (8 jobs of random 4 KiB reads and writes in 16 KiB files,
# 70% reads, an fsync after every write) on ext4 over nbdfuse and a loop device, against a
# RAID 6 of 6 member files on tmpfs served by flashraid, once per connection mode.
# Usage (root): scripts/bench-fs-fsync.sh [BINARY] [SECONDS]
# Prints per mode: read and write IOPS and the fsync p50. Needs fio, nbdfuse, fuse3, e2fsprogs.
set -u
F=${1:-target/release/flashraid}
RT=${2:-6}
D=/dev/shm/flashraid-fs-fsync
M=$(mktemp -d /tmp/flashraid-fs-fsync.XXXXXX)
mkdir -p "$D" "$M/fuse" "$M/fs"
rm -f "$D"/m*
members=$(for i in 0 1 2 3 4 5; do echo "$D/m$i"; done)
"$F" create --level 6 --name fsync --size 640M $members >/dev/null || exit 1
cat > "$D/data.fio" <<JOB
[global]
directory=$M/fs
ioengine=psync
thread=1
fsync=1
nrfiles=1250
filesize=16384
bs=4096
file_service_type=random
filename_format=data-j\$jobnum/f.\$filenum
rw=randrw
rwmixread=70
time_based=1
runtime=$RT
numjobs=8
group_reporting=1
randseed=20260
[data]
JOB
for mode in "" "--connection-threads"; do
    "$F" serve --socket "$D/s.sock" $mode $members >"$D/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do [ -S "$D/s.sock" ] && break; sleep 0.1; done
    nbdfuse "$M/fuse/nbd" "nbd+unix:///fsync?socket=$D/s.sock" &
    for _ in $(seq 100); do [ -e "$M/fuse/nbd" ] && break; sleep 0.1; done
    loop=$(losetup --find --show --direct-io=on --sector-size 4096 "$M/fuse/nbd")
    mkfs.ext4 -q -F -i 8192 -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
    mount -o noatime "$loop" "$M/fs"
    (cd "$M/fs" && fio --output-format=json --output="$D/out.json" "$D/data.fio" >/dev/null 2>&1)
    python3 -c "
import json; j = json.load(open('$D/out.json'))['jobs'][0]
print('${mode:-reactor (default)}: read %.0f write %.0f IOPS, fsync p50 %.0f us' % (j['read']['iops'],
      j['write']['iops'], j['sync']['lat_ns']['percentile']['50.000000'] / 1000))"
    umount "$M/fs"; losetup -d "$loop"; fusermount3 -u "$M/fuse"; sleep 0.5
    kill "$server"; wait "$server" 2>/dev/null
done
rm -rf "$D" "$M"
