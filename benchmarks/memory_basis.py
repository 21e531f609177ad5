"""estimate vs compare on one memory basis, on data the project did not make (issue 14).

The data: two CSVs built from this machine's Debian package database (/var/lib/dpkg/status), text
neither trainwise nor its tests wrote: `pkgs.csv` (the long descriptions, target: the section) and
`dpkg_short.csv` (the one-line summaries, target: the priority). For each CSV and each (batch,
length) setting, `trainwise compare` runs the rows (each trial in its own process, as a user runs it)
and `trainwise estimate --json` is given the same model, data options and settings. Each pair is the
estimate's `peak` against compare's `peak mem` (both: the peak of live tensors), with compare's RSS
beside it; and per study grad_ckpt's saving against the baseline, measured vs predicted.

Usage: python benchmarks/memory_basis.py [--out runs/bench-memory] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from trainwise.study.store import read_rows

ROWS = ["baseline", "grad_ckpt", "bf16", "grad_accum", "dynamic_pad", "adafactor"]
SETTINGS = [(32, 128), (16, 256)]  # (batch, max length)
MODEL = "all-MiniLM-L6-v2"


def dpkg_records(path: Path = Path("/var/lib/dpkg/status")) -> list[dict[str, str]]:
    records, current, key = [], {}, None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            if current:
                records.append(current)
            current, key = {}, None
        elif line[0] in " \t" and key == "Description":
            current["long"] = (current.get("long", "") + " " + line.strip().lstrip(".")).strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    if current:
        records.append(current)
    return records


def write_csvs(out: Path) -> dict[str, tuple[Path, str, str]]:
    records = dpkg_records()
    long_rows = [(r["long"], r["Section"]) for r in records if r.get("long") and r.get("Section")]
    short_rows = [(r["Description"], r["Priority"]) for r in records if r.get("Description") and r.get("Priority")]
    files = {}
    for name, rows, cols in [
        ("pkgs.csv", long_rows, ("summary", "section")),
        ("dpkg_short.csv", short_rows, ("description", "priority")),
    ]:
        path = out / name
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(cols)
            w.writerows(rows)
        files[name] = (path, *cols)
    return files


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "trainwise.cli", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"failed: trainwise {' '.join(args)}\n{done.stderr[-3000:]}")
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench-memory")
    ap.add_argument("--quick", action="store_true", help="one CSV, one setting, 4 rows")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write_csvs(out)
    rows = ROWS[:4] if a.quick else ROWS
    settings = SETTINGS[:1] if a.quick else SETTINGS
    pairs, savings = [], []
    for name, (path, text_col, target_col) in list(files.items())[: 1 if a.quick else None]:
        for batch, length in settings:
            data = ["--train-file", str(path), "--text-column", text_col, "--target-column", target_col]
            common = ["--model", MODEL, *data, "--strategies", ",".join(rows)]
            common += ["--batch-size", str(batch), "--max-length", str(length)]
            study = out / f"{Path(name).stem}-b{batch}-l{length}"
            print(f"{name} batch {batch} length {length}: compare...", flush=True)
            run(
                ["compare", *common, "--max-steps", "3", "--warmup-steps", "1", "--eval-samples", "0"]
                + ["--out", str(study), "--force"]
            )
            measured = {r["strategy"]: r for r in read_rows(study / "results.json")}
            est = json.loads(run(["estimate", *common, "--device", "cpu", "--json"]).stdout)
            predicted = {e["strategy"]: e for e in est["estimates"]}
            for row in rows:
                m, p = measured[row], predicted[row]
                if m["status"] != "ok":
                    print(f"  {row}: {m['status']} {m.get('message')}")
                    continue
                err = p["peak_bytes"] / m["peak_mem_bytes"] - 1
                pairs.append(
                    dict(
                        data=name,
                        batch=batch,
                        length=length,
                        row=row,
                        measured=m["peak_mem_bytes"],
                        rss=m["peak_rss_bytes"],
                        predicted=p["peak_bytes"],
                        error=err,
                    )
                )
                print(
                    f"  {row:12s} measured {m['peak_mem_bytes'] / 2**20:7.0f} MiB  estimate "
                    f"{p['peak_bytes'] / 2**20:7.0f} MiB  ({100 * err:+.1f}%)  "
                    f"RSS {m['peak_rss_bytes'] / 2**20:6.0f} MiB"
                )
            if {"baseline", "grad_ckpt"} <= set(measured) and all(
                measured[r]["status"] == "ok" for r in ("baseline", "grad_ckpt")
            ):
                sm = 1 - measured["grad_ckpt"]["peak_mem_bytes"] / measured["baseline"]["peak_mem_bytes"]
                sp = 1 - predicted["grad_ckpt"]["peak_bytes"] / predicted["baseline"]["peak_bytes"]
                savings.append(dict(data=name, batch=batch, length=length, measured=sm, predicted=sp))
                print(
                    f"  grad_ckpt saving: measured {100 * sm:.0f}%, predicted {100 * sp:.0f}% "
                    f"({100 * (sp - sm):+.1f} points)"
                )
    errors = [abs(p["error"]) for p in pairs]
    summary = {
        "pairs": len(pairs),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "within_10pct": sum(e <= 0.10 for e in errors),
        "saving_max_points": max(abs(s["predicted"] - s["measured"]) for s in savings) * 100 if savings else None,
    }
    print(json.dumps(summary))
    (out / "memory_basis.json").write_text(
        json.dumps({"pairs": pairs, "savings": savings, "summary": summary}, indent=1)
    )


if __name__ == "__main__":
    main()
