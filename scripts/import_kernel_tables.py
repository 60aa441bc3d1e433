#!/usr/bin/env python3
"""One-time converter: measured GEMM tables -> dtsim's shipped kernel tables.

Reads the CSV GEMM tables of a calibration folder (the layout of NVIDIA aiconfigurator's
exported data: gemm/<system>_gemm_<dtype>.csv with columns m,n,k,latency_ms and a
manifest.csv naming each file's source) and writes one dense-grid text file per table into
models/calibration/tables/ in format dtsim-gemm-table-1 (models/calibration/gemm_table.hpp).
Times are converted to microseconds and rounded to 4 significant digits (the collections
differ by 10-20%, far more than the rounding). Shapes the grid lacks are written "-".

Not needed to build or run dtsim: the converted files are committed and embedded in the
binary at build time (models/calibration/tables/embed.cmake).

Usage: scripts/import_kernel_tables.py CALIBRATION_DIR [OUT_DIR]
"""
import csv
import os
import sys

# The tables dtsim ships: (system, dtype), systems with a GPU preset (topologies/gpus/*.yaml).
# bf16 only: the fp8 tables time vLLM's inference path, whose timed region includes the
# activation's dynamic quantisation (amax + cast) on every call, slower than bf16 on skinny
# shapes (H100 4096 x 2048 x 7168: 0.166 ms fp8, 0.155 ms bf16); training's FP8 GEMMs
# (Transformer Engine, DeepGEMM) quantise elsewhere, so fp8 GEMMs stay on the roofline.
TABLES = [("a100_sxm", "bf16"), ("h100_sxm", "bf16"), ("h200_sxm", "bf16"), ("b200_sxm", "bf16")]
SOURCE_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"


def manifest(cal):
    with open(os.path.join(cal, "manifest.csv"), newline="") as f:
        return {r["file"]: r for r in csv.DictReader(f)}


def constants(row):
    out = {}
    for part in row["constants"].split(";"):
        key, _, value = part.strip().partition("=")
        out[key] = value
    return out


def convert(cal, out_dir, system, dtype, man):
    rel = f"gemm/{system}_gemm_{dtype}.csv"
    info = man[rel]
    c = constants(info)
    times = {}
    with open(os.path.join(cal, rel), newline="") as f:
        for r in csv.DictReader(f):
            times[(int(r["m"]), int(r["n"]), int(r["k"]))] = float(r["latency_ms"]) * 1000.0
    ms = sorted({s[0] for s in times})
    ns = sorted({s[1] for s in times})
    ks = sorted({s[2] for s in times})
    lines = [
        "# dtsim kernel table: measured GEMM times on a dense (m, n, k) grid.",
        "# Contains performance data from NVIDIA aiconfigurator",
        f"# (https://github.com/ai-dynamo/aiconfigurator, commit {SOURCE_COMMIT[:8]}),",
        "# Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES, licensed under the Apache",
        "# License 2.0 (LICENSE beside this file). Changed: converted from the Parquet table",
        f"# {info['source']}",
        "# to this dense grid by scripts/import_kernel_tables.py, times in microseconds rounded to",
        "# 4 significant digits. See README.md beside this file.",
        "format dtsim-gemm-table-1",
        f"system {system}",
        f"device {c['device']}",
        f"collection {c['framework']} {c['version']}, kernel {c['kernel_source']}",
        f"dtype {dtype}",
        "layout NT",
        "unit us",
        "m " + " ".join(map(str, ms)),
        "n " + " ".join(map(str, ns)),
        "k " + " ".join(map(str, ks)),
        "data",
    ]
    missing = 0
    for m in ms:
        for n in ns:
            row = []
            for k in ks:
                t = times.get((m, n, k))
                if t is None:
                    missing += 1
                    row.append("-")
                else:
                    row.append(f"{t:.4g}")
            lines.append(" ".join(row))
    path = os.path.join(out_dir, f"{system}_gemm_{dtype}.txt")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    print(f"{path}: {len(ms)} x {len(ns)} x {len(ks)} grid, {len(times)} points, {missing} missing")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    cal = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(__file__), "..", "models",
                                                                    "calibration", "tables")
    man = manifest(cal)
    for system, dtype in TABLES:
        convert(cal, out_dir, system, dtype, man)


if __name__ == "__main__":
    main()
