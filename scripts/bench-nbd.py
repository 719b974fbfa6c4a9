#!/usr/bin/env python3
"""NBD servers side by side, measured by fio's nbd engine in one run.

Servers (each started, measured, stopped in turn, on a Unix socket and on TCP loopback):
  nbdkit-memory      nbdkit's memory plugin (the reference: no RAID, no disk)
  qemu-nbd-tmpfs     qemu-nbd over a raw file on tmpfs (cache=none, aio=io_uring)
  flashraid-raid0    flashraid serve --memory 8xSIZE --level 0
  flashraid-raid6    flashraid serve --memory 8xSIZE --level 6
  flashraid-raid0-threads, flashraid-raid6-threads
  flashraid-raid6-mw100   (any -mwN suffix: serve --merge-window-us N)
                     the same with --connection-threads (a thread per connection)

Loads: 4k random read, 4k random write, 128k sequential read, 128k sequential write; the
same fio job for every server. Each figure is the median of --repetitions runs; the servers
are interleaved per repetition so drift on a shared machine hits them alike. CPU: the
server process's CPU time per IO (utime+stime from /proc), next to fio's.

Usage: scripts/bench-nbd.py [--seconds 4] [--repetitions 3] [--jobs 2] [--qd 32]
                            [--json results/nbd.json] [--transports unix,tcp]
                            [--servers LIST] [--loads randread-4k,randwrite-4k,...]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLASHRAID = os.path.join(ROOT, "target", "release", "flashraid")
LOADS = [
    ("randread-4k", "randread", "4k"),
    ("randwrite-4k", "randwrite", "4k"),
    ("seqread-128k", "read", "128k"),
    ("seqwrite-128k", "write", "128k"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, name, work, size_bytes, transport):
        self.name, self.work, self.transport = name, work, transport
        self.size = size_bytes
        self.sock = os.path.join(work, f"{name}.sock")
        self.port = free_port()
        member = size_bytes // 8
        tcp = ["--tcp", f"127.0.0.1:{self.port}"] if transport == "tcp" else ["--socket", self.sock]
        if name == "nbdkit-memory":
            where = ["-U", self.sock] if transport == "unix" else ["-i", "127.0.0.1", "-p", str(self.port)]
            self.cmd = ["nbdkit", "-f", "--exit-with-parent", *where, "memory", str(size_bytes)]
            self.export = ""
        elif name == "qemu-nbd-tmpfs":
            image = os.path.join(work, "qemu.img")
            subprocess.run(["truncate", "-s", str(size_bytes), image], check=True)
            where = ["-k", self.sock] if transport == "unix" else ["-b", "127.0.0.1", "-p", str(self.port)]
            self.cmd = ["qemu-nbd", "-f", "raw", "-t", "-e", "16", "--cache=none", "--aio=io_uring",
                        "-x", "", *where, image]
            self.export = ""
        else:
            level = "0" if "raid0" in name else "6"
            data = 8 if level == "0" else 6
            threads = ["--connection-threads"] if name.endswith("-threads") else []
            # A "-mwN" suffix: a merge window of N microseconds for partial-stripe writes.
            window = re.search(r"-mw(\d+)", name)
            merge = ["--merge-window-us", window.group(1)] if window else []
            self.cmd = [FLASHRAID, "serve", "--memory", f"8x{size_bytes // data + (64 << 20)}",
                        "--level", level, "--name", "bench",
                        "--control", os.path.join(work, f"{name}.control"), *tcp, *threads,
                        *merge]
            self.export = "bench"
        if transport == "unix":
            self.uri = f"nbd+unix:///{self.export}?socket={self.sock}"
        else:
            self.uri = f"nbd://127.0.0.1:{self.port}/{self.export}"

    def __enter__(self):
        self.log = open(os.path.join(self.work, f"{self.name}.log"), "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited: see {self.log.name}")
            r = subprocess.run(["nbdinfo", "--size", self.uri], capture_output=True)
            if r.returncode == 0:
                return self
            time.sleep(0.1)
        raise SystemExit(f"{self.name} did not start")

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if os.path.exists(self.sock):
            os.unlink(self.sock)


def run_fio(uri, rw, bs, seconds, jobs, qd, size):
    """`seconds` None: one pass over the range (the fill)."""
    span = size // jobs
    cmd = ["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--numjobs={jobs}", f"--size={span}", f"--offset_increment={span}",
           "--group_reporting", "--verify_state_save=0", "--output-format=json"]
    if seconds is not None:
        cmd += ["--time_based", f"--runtime={seconds}", "--ramp_time=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    io = job["read"] if job["read"]["io_bytes"] else job["write"]
    return {
        "iops": io["iops"],
        "bytes_per_second": io["bw_bytes"],
        "latency_us_p99": io["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000,
        "ios": io["total_ios"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--qd", type=int, default=32)
    p.add_argument("--size", type=int, default=2 << 30, help="export size in bytes")
    p.add_argument("--servers", default="nbdkit-memory,qemu-nbd-tmpfs,flashraid-raid0,flashraid-raid6")
    p.add_argument("--transports", default="unix,tcp")
    p.add_argument("--loads", default=",".join(name for name, _, _ in LOADS),
                   help="comma-separated subset of the loads")
    p.add_argument("--json")
    a = p.parse_args()
    chosen = a.loads.split(",")
    unknown = [name for name in chosen if name not in {n for n, _, _ in LOADS}]
    if unknown:
        raise SystemExit(f"unknown loads: {', '.join(unknown)}")
    loads = [entry for entry in LOADS if entry[0] in chosen]
    for tool in ["fio", "nbdinfo", "nbdkit", "qemu-nbd"]:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing: scripts/test.sh installs it")
    if not os.path.exists(FLASHRAID):
        raise SystemExit("build first: cargo build --release -p flashraid-cli")
    servers = a.servers.split(",")
    known = {"nbdkit-memory", "qemu-nbd-tmpfs", "flashraid-raid0", "flashraid-raid6",
             "flashraid-raid0-threads", "flashraid-raid6-threads"}
    def unknown(name):
        return name not in known and re.sub(r"-mw\d+$", "", name) not in known
    if [name for name in servers if unknown(name)]:
        raise SystemExit(f"unknown servers: {', '.join(n for n in servers if unknown(n))}")
    results = {}
    work = tempfile.mkdtemp(prefix="flashraid-bench-nbd.", dir="/dev/shm")
    try:
        for transport in a.transports.split(","):
            for rep in range(a.repetitions):
                for name in servers:
                    with Server(name, work, a.size, transport) as server:
                        # Fill once so reads touch written memory on every server alike.
                        run_fio(server.uri, "write", "1m", None, 1, 8, a.size)
                        for load, rw, bs in loads:
                            cpu0 = cpu_seconds(server.proc.pid)
                            r = run_fio(server.uri, rw, bs, a.seconds, a.jobs, a.qd, a.size)
                            r["server_cpu_us_per_io"] = (cpu_seconds(server.proc.pid) - cpu0) * 1e6 / max(r["ios"], 1)
                            results.setdefault((transport, load, name), []).append(r)
                            print(f"  {transport} rep {rep + 1} {name:<16} {load:<14} "
                                  f"{r['iops'] / 1e3:8.0f}k IOPS {r['bytes_per_second'] / 1e9:6.2f} GB/s",
                                  file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    print(f"\nfio nbd engine, {a.jobs} jobs x QD {a.qd}, {a.seconds:g} s, median of {a.repetitions}; "
          f"server CPU us per IO in brackets\n")
    header = "| transport | load | " + " | ".join(servers) + " | flashraid-raid0 / nbdkit |"
    print(header)
    print("|" + "---|" * (len(servers) + 3))
    table = []
    for transport in a.transports.split(","):
        for load, _, _ in loads:
            cells, values = [], {}
            for name in servers:
                rs = results[(transport, load, name)]
                key = "iops" if load.startswith("rand") else "bytes_per_second"
                v = med(rs, key)
                values[name] = v
                cpu = med(rs, "server_cpu_us_per_io")
                cells.append(f"{v / 1e3:.0f}k ({cpu:.1f})" if key == "iops" else f"{v / 1e9:.2f} GB/s ({cpu:.0f})")
            ratio = ""
            if "flashraid-raid0" in values and "nbdkit-memory" in values:
                ratio = f"{values['flashraid-raid0'] / values['nbdkit-memory']:.2f}x"
            print(f"| {transport} | {load} | " + " | ".join(cells) + f" | {ratio} |")
            table.append({"transport": transport, "load": load, "median": values})
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "rows": table,
                       "runs": {" ".join(k): v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
