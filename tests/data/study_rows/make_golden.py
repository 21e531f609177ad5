"""How the fixtures beside this file were made, at commit 5c1a55b (rows were dicts then), kept as the record
of their provenance; it calls that commit's code (aggregate returning dicts), not today's.

    git archive 5c1a55b | tar -x -C /tmp/head
    PYTHONPATH=/tmp/head python -m trainwise.cli compare --model-preset bert-tiny \\
        --strategies baseline,dynamic_pad,fp16 --batch-sizes 8,16 --max-steps 4 --warmup-steps 1 \\
        --eval-samples 32 --price-per-hour 2.5 --out /tmp/study          # real/results.json is its results.json
    PYTHONPATH=/tmp/head python make_golden.py DIR   # DIR/real/results.json in; synthetic/ and golden/ out

synthetic/: a study of made-up trials through that commit's aggregation (every kind of row); golden/: what
that commit made of each results.json (report.md, results.csv, the terminal table, advise's JSON under
several constraints, the quality phase's candidates). tests/test_study_rows.py checks today's code gives
the same."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console

from trainwise import strategies
from trainwise.api.advise import advise_study
from trainwise.api.quality import candidates
from trainwise.core.config import Sweep, TrialSettings
from trainwise.core.results import TrialResult
from trainwise.report import terminal
from trainwise.report.format import add_cost
from trainwise.search.cost import Price
from trainwise.search.ranking import Constraints
from trainwise.spec.config import Cell, TrialSpec
from trainwise.study.aggregate import Report, aggregate
from trainwise.study.store import read_rows, write_reports

CONSTRAINTS = {
    "time": dict(objective="time"),
    "cost": dict(objective="cost"),
    "quality": dict(objective="quality"),
    "budget": dict(memory_budget="1MiB"),
    "some_fit": dict(memory_budget="340MB", objective="cost"),
    "tight": dict(max_quality_drop=0.5, max_epoch_time="30s", max_epoch_cost=0.002),
}


def synthetic(out: Path) -> None:
    """A study of made-up trials through the aggregation at this commit: a baseline with 3 repeats, a row
    timed under load and re-run, a failed row, an emulated one, a 2-rank ZeRO row, a sweep of 2 batch sizes,
    priced; and a quality phase's verdicts beside it."""
    settings = TrialSettings(
        "classification", "preset", "bert-tiny", "bert-tiny", None, "", 2, 16, 4, 8, 8, 1, 1e-3, 0, "cpu", 0, 100
    )
    texts = ["baseline", "bf16", "grad_ckpt", "fp16", "adafactor", "zero2"]
    rows = {r.text: r for r in strategies.parse_rows(texts, 4)}
    cells = [Cell(rows[t], b, 0, Sweep(batch_sizes=True)) for t in texts for b in (8, 16)]
    env = {"device": "cpu", "device_name": "Test CPU", "torch": "2.x", "transformers": "4.x", "accelerate": "1.x",
           "commit": "abc123", "torch_threads": 2, "cpu_count": 2}  # fmt: skip
    trials = []

    def add(text, batch, repeat, **kw):
        r = TrialResult(text, kw.pop("status", "ok"), repeat=repeat, plan=rows[text].plan.to_dict(), env=env, **kw)
        spec = TrialSpec(text, repeat, rows[text].plan, dataclasses.replace(settings, batch_size=batch), steps=2)
        trials.append((spec, r))

    common = dict(mem_kind="cpu_allocated", compute_dtype="fp32", peak_mode="fp32", metric_name="accuracy",
                  timed_steps=8, state_bytes=4_000_000, rss_before_model_bytes=300_000_000,
                  peak_rss_bytes=900_000_000, flops_per_step=2e9, peak_flops_per_s=5e10, step_time_iqr_s=0.01,
                  cpu_mhz=[3000.0, 2990.0], padding_waste=0.4)  # fmt: skip
    for b in (8, 16):
        k = b / 8
        for rep, sps in enumerate((100.0, 104.0, 96.0)):
            add("baseline", b, rep, samples_per_s=sps * k, step_time_s=b / (sps * k), peak_mem_bytes=int(50e6 * k),
                train_loss=0.9, final_loss=0.88, metric=60.0 + rep, metrics={"accuracy": 60.0 + rep,
                "majority_accuracy": 40.0}, epoch_time_s=1000 / (sps * k), mfu=0.02, wall_s=10.0, **common)  # fmt: skip
        add("bf16", b, 0, samples_per_s=180.0 * k, step_time_s=b / (180 * k), peak_mem_bytes=int(35e6 * k),
            train_loss=0.95, metric=58.0, metrics={"accuracy": 58.0, "majority_accuracy": 40.0},
            epoch_time_s=1000 / (180 * k), contended=True, other_cpu_share=0.35, discarded_runs=2,
            support_note="bf16 is emulated on this CPU (no native bf16)", mfu=0.05,
            **{**common, "peak_mode": "autocast-bf16", "compute_dtype": "bf16"})  # fmt: skip
        add("grad_ckpt", b, 0, samples_per_s=70.0 * k, step_time_s=b / (70 * k), peak_mem_bytes=int(20e6 * k),
            train_loss=0.91, metric=61.0, metrics={"accuracy": 61.0, "majority_accuracy": 40.0},
            epoch_time_s=1000 / (70 * k), compile_s=3.5, mfu_note="", **common)  # fmt: skip
        add("fp16", b, 0, status="emulated", precision_ratio=26.0, message="fp16 is emulated here",
            support_note="fp16: emulated on cpu")  # fmt: skip
        add("adafactor", b, 0, status="error", message="boom: a|pipe")
        add("zero2", b, 0, samples_per_s=110.0 * k, step_time_s=b / (110 * k), peak_mem_bytes=int(30e6 * k),
            train_loss=0.9, metric=60.5, metrics={"accuracy": 60.5, "majority_accuracy": 40.0}, world_size=2,
            rank_peak_mem_bytes=[int(30e6 * k), int(29e6 * k)], epoch_time_s=1000 / (110 * k),
            trace="traces/zero2.json", **common)  # fmt: skip
    table = aggregate(cells, trials)
    add_cost(table, Price(2.5, "$2.5/h"))
    study = {"model": "bert-tiny (size preset)", "data": "made up", "device": "Test CPU", "steps": "8", "seed": 0}
    out.mkdir(parents=True, exist_ok=True)
    write_reports(out, table, "trainwise compare: synthetic", len(trials), len(trials), study)
    (out / "quality").mkdir(exist_ok=True)
    q = [("baseline", "reference", [59.0, 61.0]), ("grad_ckpt", "no significant difference", [58.0, 62.0]),
         ("zero2", "worse", [50.0, 52.0])]  # fmt: skip
    verdicts = {"seeds": 2, "rows": [
        {"strategy": s, "verdict": v, "values": vals, "steps": 200, "mean": sum(vals) / 2, "low": min(vals),
         "high": max(vals), "majority": 40.0} for s, v, vals in q]}  # fmt: skip
    (out / "quality" / "quality.json").write_text(json.dumps(verdicts, indent=1))


def golden(study: Path, golden_dir: Path) -> None:
    """What this commit makes of a results.json: the reports re-rendered from its rows, the terminal table,
    advise under several constraints, the quality phase's candidates."""
    from trainwise.report.write import markdown
    from trainwise.study.store import read_results

    golden_dir.mkdir(parents=True, exist_ok=True)
    payload = json.loads((study / "results.json").read_text(encoding="utf-8"))
    rows = read_rows(study / "results.json")
    tmp = golden_dir / "_reports"
    tmp.mkdir(exist_ok=True)
    write_reports(tmp, rows, "trainwise compare: golden", study=payload["study"])
    (golden_dir / "report.md").write_text(markdown(rows, "trainwise compare: golden", payload["study"]))
    (golden_dir / "results.csv").write_text((tmp / "results.csv").read_text())
    assert (tmp / "results.json").read_text() == (study / "results.json").read_text(), "re-written as it was"
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    console = Console(record=True, width=240, file=open("/dev/null", "w"))  # noqa: SIM115
    terminal.compare_table(Report("trainwise compare: golden", rows, [Path("results.json")]), console)
    (golden_dir / "terminal.txt").write_text(console.export_text())
    advice = {}
    for name, options in CONSTRAINTS.items():
        try:
            advice[name] = dataclasses.asdict(advise_study(study, Constraints.of(options)))
        except Exception as e:  # noqa: BLE001
            advice[name] = {"error": f"{type(e).__name__}: {e}"}
    (golden_dir / "advise.json").write_text(json.dumps(advice, indent=1))
    (golden_dir / "candidates.json").write_text(json.dumps(candidates(read_results(study))))


if __name__ == "__main__":
    where = Path(sys.argv[1])
    synthetic(where / "synthetic")
    golden(where / "synthetic", where / "golden" / "synthetic")
    golden(where / "real", where / "golden" / "real")
