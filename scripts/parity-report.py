#!/usr/bin/env python3
"""Merge several `flashraid bench parity --json` reports into one Markdown table.

Each figure is the median over the runs (each run's figure is itself a median of repetitions);
the ratio column also shows the lowest and highest ratio seen, so noise is visible.

usage: scripts/parity-report.py run1.json run2.json run3.json > table.md
"""
import json
import statistics
import sys


def key(row):
    return (row["op"], row["chunk_bytes"], row["regime"])


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    order = [key(r) for r in runs[0]["rows"]]
    rows = {k: [] for k in order}
    for run in runs:
        for row in run["rows"]:
            rows.setdefault(key(row), []).append(row)
    first = runs[0]
    print(f"kernel {first['kernel']}, k = {first['data_chunks']}, CPU {first['cpu_model']}, "
          f"{len(runs)} runs x median of {first['repetitions']} x {first['repetition_cpu_ms']} ms; "
          f"ISA-L: " + ", ".join(f"{v} ({p})" for v, p in first["isal_libraries"]))
    print()
    print("| op | chunk | data | flashraid GB/s | nt-store GB/s | best ISA-L GB/s | ISA-L function "
          "| flashraid / ISA-L (min-max) | 1-core read GB/s | best data / read | traffic / read |")
    print("|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for k in order:
        group = rows[k]
        op, chunk, regime = k
        med = lambda f: statistics.median(f(r) for r in group)
        cached = med(lambda r: r["flashraid_gbps"])
        nts = [r["flashraid_nontemporal_gbps"] for r in group if r["flashraid_nontemporal_gbps"]]
        nt = statistics.median(nts) if nts else None
        best_isal = [max(r["isal"], key=lambda f: f["gbps"]) for r in group if r["isal"]]
        isal = statistics.median(f["gbps"] for f in best_isal) if best_isal else None
        names = sorted({f"{f['version']} {f['function']}" for f in best_isal})
        ratios = [r["ratio_to_isal"] for r in group if r["ratio_to_isal"]]
        read = med(lambda r: r["memory_read_gbps"])
        best = max(cached, nt or 0)
        traffic = med(lambda r: r["traffic_fraction_of_read_bandwidth"])
        chunk_label = f"{chunk >> 10} KiB"
        ratio = (f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
                 if ratios else "-")
        print(f"| {op} | {chunk_label} | {regime} | {cached:.1f} | "
              f"{nt:.1f} | " if nt else f"| {op} | {chunk_label} | {regime} | {cached:.1f} | - | ",
              end="")
        print(f"{isal:.1f} | {' / '.join(names)} | {ratio} | {read:.1f} | "
              f"{best / read * 100:.0f}% | {traffic * 100:.0f}% |" if isal else "- | - | - |")


if __name__ == "__main__":
    main(sys.argv[1:])
