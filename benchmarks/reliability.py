"""Reliability figures (BENCHMARKS.md §R1, issue 17): bad inputs per verb and how many are clean
(one line, exit 2, no traceback, nothing written), and a study killed many times at moments it
reaches (a trial up, a row stored, in turn, plus a random delay of up to 2 s; SIGKILL of its process group /
SIGTERM of the command, in turn) and resumed until done: rows lost,
trials re-run after they were stored, and processes left behind.

    .venv/bin/python benchmarks/reliability.py --kills 20 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import make_rows, write_csv  # noqa: E402
from tests.killing import finished_rows, kill_until_done  # noqa: E402


def bad_inputs() -> dict[str, tuple[int, int]]:
    """verb -> (cases tried, cases clean), from the table-driven tests (each case asserts cleanliness)."""
    tests = ["tests/cli/test_bad_input.py", "tests/cli/test_errors.py::test_bad_input_is_one_line_exit_2"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
    )
    tried: Counter[str] = Counter()
    clean: Counter[str] = Counter()
    pattern = r"^(PASSED|FAILED) (tests/\S+?)::test_bad_input_is_one_line\S*?\[(.+?)\]"
    for outcome, file, case in re.findall(pattern, run.stdout, re.M):
        verb = case.split()[0] if "test_bad_input.py" in file else "compare"
        tried[verb] += 1
        clean[verb] += outcome == "PASSED"
    return {verb: (tried[verb], clean[verb]) for verb in sorted(tried)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="kills per study")
    parser.add_argument("--seeds", type=int, default=3, help="studies, each killed --kills times")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    figures: dict = {"bad_inputs": bad_inputs()}
    for verb, (tried, clean) in figures["bad_inputs"].items():
        print(f"bad input  {verb:<11} {clean}/{tried} clean")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = write_csv(root / "data.csv", make_rows(96, "classification"))

        def argv(out: Path) -> list[str]:
            cmd = [sys.executable, "-m", "trainwise.cli", "compare", "--model-preset", "bert-tiny", "--device", "cpu"]
            cmd += ["--train-file", str(data), "--strategies", "baseline,grad_accum,dynamic_pad,bf16"]
            return [*cmd, "--batch-size", "8", "--max-length", "32", "--max-steps", "4", "--out", str(out)]

        started = time.perf_counter()
        subprocess.run(argv(root / "whole"), check=True, capture_output=True)
        whole = finished_rows(root / "whole")
        studies = []
        for seed in range(args.seeds):
            out = root / f"killed-{seed}"
            r = kill_until_done(argv(out), out, args.kills, seed, delay=2.0)
            lost = [row for row in whole if row not in r.rows]
            studies.append(
                {
                    "seed": seed,
                    "kills": r.kills,
                    "by_signal": r.by_signal,
                    "runs": r.runs,
                    "rows_lost": len(lost),
                    "same_rows": r.rows == whole,
                    "reruns": len(r.reruns),
                    "orphans": len(r.orphans),
                }
            )
            print(f"study {seed}: {json.dumps(studies[-1])}")
        figures["kill_resume"] = studies
        figures["wall_s"] = time.perf_counter() - started
    total = sum(s["kills"] for s in figures["kill_resume"])
    print(
        f"kills survived {total}: rows lost {sum(s['rows_lost'] for s in figures['kill_resume'])}, "
        f"re-runs {sum(s['reruns'] for s in figures['kill_resume'])}, "
        f"orphans {sum(s['orphans'] for s in figures['kill_resume'])}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
