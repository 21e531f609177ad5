"""`trainwise plan` end to end on the tiny preset: a search killed mid-way by its CLI and resumed by the API without
re-running a stored trial, the CLI's plan equal to the API's, the leader doubled as a row that exports at its size,
the repeats beside the baseline in OUT/repeats, the quality check's fallback order, and bad input in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import trainwise
from tests import here
from trainwise.api.render import Render
from trainwise.search.acquisition import Search
from trainwise.search.plan_inputs import split_row
from trainwise.study.store import read_results, read_trial_keys

# no baseline in the list: the plan runs it anyway (every figure of the search is relative to it)
ROWS = "dynamic_pad,smart_batch,freeze_embeddings"


def options(csv, out) -> dict:
    return {
        "model_preset": "bert-tiny",
        "train_file": str(csv),
        "strategies": ROWS,
        "batch_size": 8,
        "max_length": 256,  # rows of 3-40 words: padding to 256 is most of the baseline's work
        "max_steps": 6,
        "warmup_steps": 1,
        "eval_samples": 8,
        "device": "cpu",
        "retries": 0,
        "remeasure": False,
        "out": str(out),
        "quality_check": False,
        "ecosystem_default": False,
        "max_trials": 3,
        # a long planned run: every trial these tests look for pays for itself (the pricing has tests of its own in
        # test_acquisition; on 96 rows an epoch is a second, and no trial would)
        "run_epochs": 10000.0,
    }


def argv(opts: dict, *extra: str) -> list[str]:
    words = [sys.executable, "-m", "trainwise.cli", "plan"]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        words += [flag] if v is True else [f"--no-{flag[2:]}"] if v is False else [flag, str(v)]
    return [*words, *extra]


@pytest.fixture(scope="module")
def searched(tmp_path_factory, cls_csv):
    """The CLI's search, killed while a combination trains, then resumed by the API."""
    out = tmp_path_factory.mktemp("plan") / "study"
    opts = options(cls_csv, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # a combination hangs, so the kill lands while its trial is in flight (a tiny trial can end within the 2 s below)
    hang = {**env, "TRAINWISE_FAULT": "*+*:hang@2"}
    cli = subprocess.Popen(argv(opts), env=hang, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    assert cli.stderr is not None
    for line in cli.stderr:  # the singles first; the kill lands while the search's trial is in flight
        said.append(line)
        if "trainwise plan: measuring" in line:
            time.sleep(2)
            cli.send_signal(signal.SIGTERM)
            break
    cli.wait(timeout=60)
    assert any("trainwise plan: measuring" in s for s in said), "".join(said)[-2000:]
    before = read_trial_keys(out)
    result = trainwise.plan(render=None, **opts)
    return out, opts, before, result


def test_a_killed_search_resumes_and_reruns_no_stored_trial(searched):
    out, _opts, before, result = searched
    after = read_trial_keys(out)
    assert before is not None and after is not None
    assert set(before) <= set(after) and len(after) > len(before)  # the stored trials stay; new ones were added
    rows = {r.row_text: r for r in read_results(out)}
    measured = [c for c in result.search["candidates"] if c["state"] == "measured"]
    assert measured and all(c["row"] in rows for c in measured)  # rows of the same study, same baseline
    assert result.plan in rows and rows[result.plan].status == "ok"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["plan"] == result.plan and (out / "plan.md").is_file()
    drawn = (out / "report.html").read_text().split('<figure id="plan">')[1].split("</figure>")[0]  # the page again
    assert all(f"{c['trial']}. {c['row']}" in drawn for c in measured), "every candidate on the search's path"
    reasons = {s["strategy"]: s for s in result.strategies}
    assert all(reasons[n]["in"] for n in split_row(result.plan)[0])
    assert rows["baseline"].status == "ok"  # run although --strategies did not name it
    # the posterior of every measured candidate, the plan's among them; plan.md lists each trial
    assert result.plan in result.search["times"] and all(
        f"`{c['row']}`" in (out / "plan.md").read_text() for c in measured
    )


def test_the_cli_gives_the_api_plan_and_runs_no_trial_again(searched):
    out, opts, _before, result = searched
    keys = read_trial_keys(out)
    done = here.trainwise(*argv(opts, "--json")[3:])
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["plan"] == result.plan
    assert read_trial_keys(out) == keys


def test_the_leader_doubled_is_a_row_and_exports_at_that_size(tmp_path, cls_csv):
    """A sized row is a row of the same study, relative to the same baseline per sample; export writes it at its
    size; --no-batch-search leaves it out of the search (nothing new measured, no sized pick)."""
    from trainwise.api.export import export_plan
    from trainwise.exporting.scripts import ExportConfig

    out = tmp_path / "study"
    one = {"strategies": "smart_batch", "max_trials": 2}
    trainwise.plan(render=None, **{**options(cls_csv, out), **one})
    rows = {r.row_text: r for r in read_results(out)}
    sized = [r for r in rows.values() if "@bs" in r.row_text]
    assert sized and all(r.status == "ok" and r.batch_size == split_row(r.row_text)[1] for r in sized), list(rows)
    row = sized[0].row_text
    export_plan(ExportConfig(study=str(out), strategies=row, device="cpu"), tmp_path / "export")
    assert f"--batch-size {split_row(row)[1]}" in (tmp_path / "export" / "train_command.txt").read_text()
    keys = read_trial_keys(out)
    again = trainwise.plan(render=None, **{**options(cls_csv, out), **one, "batch_search": False})
    assert again.plan is not None and "@bs" not in again.plan and read_trial_keys(out) == keys


def test_leaders_within_reach_are_measured_again_in_a_round_of_their_own(tmp_path, cls_csv, monkeypatch):
    """Where the leaders' intervals overlap (made so here: a significance no difference reaches), they are measured
    again in OUT/repeats/N, a study of their own (no baseline run: timed against the study's), and those trials join
    the model's rows; a resumed plan reads them back, timed the same way."""
    from trainwise.search import acquisition, plan_inputs

    monkeypatch.setattr(acquisition, "Z_TIE", 50.0)
    monkeypatch.setattr(acquisition, "REPEAT_ROUNDS", 1)
    # a round whatever the leaders' measured gap and whatever its trials cost (the gap is noise here; the rule that
    # prices a round has its own test in test_acquisition)
    monkeypatch.setattr(acquisition, "ROUND", 0.0)
    monkeypatch.setattr(plan_inputs, "trial_seconds", lambda _rows: None)
    rounds: list = []  # what each round hands the model
    add_round = acquisition._State.add_round
    monkeypatch.setattr(acquisition._State, "add_round", lambda self, got: (rounds.append(got), add_round(self, got)))
    out = tmp_path / "study"
    result = trainwise.plan(render=None, **{**options(cls_csv, out), "max_trials": 1})
    again = {r.row_text: r for r in read_results(out / "repeats" / "1")}
    assert "baseline" not in again and len(again) == 2 and all(r.status == "ok" for r in again.values()), list(again)
    assert result.search["repeats"] == len(again)
    assert all(row in result.search["times"] for row in again)
    # each repeat timed against the study's baseline (the round runs none), as the model and a resumed plan read it
    base = next(r.samples_per_s for r in read_results(out) if r.baseline)
    (got,) = rounds
    assert sorted(o.row for o in got) == sorted(again) and all(o.source == "repeats/1" for o in got)
    assert all(o.time == pytest.approx(base / again[o.row].samples_per_s) for o in got), got
    from trainwise.api import plan as plan_api

    read = plan_api._repeated(out, lambda rows, source: plan_inputs.observations(rows, 1, 8, {}, source, base))
    assert [(o.row, o.time) for o in read] == [(o.row, o.time) for o in got]


def _rows(times: dict[str, float], sps: float = 100.0) -> list:
    """Made-up study rows: each row's time relative to the baseline (samples/s from it), its batch from its text."""
    from trainwise.core.results import StudyRow

    out = []
    for text, rel in times.items():
        batch = split_row(text)[1] or 16
        out.append(
            StudyRow(
                strategy=text,
                row=text,
                baseline=text == "baseline",
                batch_size=batch,
                status="ok",
                samples_per_s=sps / rel,
                step_time_s=batch * rel / sps,
                epoch_time_s=1000 * rel / sps,
                peak_mem_bytes=1e9,
                rel_time=rel,
                rel_mem=1.0,
            )
        )
    return out


def test_a_rejected_pick_falls_back_in_order(monkeypatch, tmp_path):
    """The pick lost quality for real: the next candidate is checked, never a superset of a rejected row nor one that
    --only / --never or --no-batch-search exclude (the search's posterior lists only rows it could pick), the
    ecosystem's default last; a check that learned nothing ends the checks and is never a pass."""
    import trainwise.api.plan as plan_api
    from trainwise.api.options import PlanOptions
    from trainwise.core.quality import INCONCLUSIVE
    from trainwise.search.plan_result import Context, summarize
    from trainwise.search.verdicts import NO_LOSS, NO_VERDICT, WORSE

    times = {
        "baseline": 1.0,
        "adamw_fused+dynamic_pad": 0.45,
        "smart_batch@bs64": 0.07,
        "smart_batch+freeze_embeddings@bs64": 0.065,
        "smart_batch": 0.3,
    }
    rows = _rows(times)
    said = {"smart_batch@bs64": WORSE, "smart_batch": INCONCLUSIVE, "adamw_fused+dynamic_pad": NO_LOSS}
    asked: list[str] = []

    def fake(_options, _base, _ctx, row, _render):
        asked.append(row)
        check = {"verdict": said[row], "seeds": 3, "said": f"{row} said so", "metric_delta": -1.0}
        return {"metric_name": "accuracy", "mean": 50.0, "steps": 40, "values": [50.0] * 3, "check": check}

    monkeypatch.setattr(plan_api, "_quality", fake)
    posterior = {r: [t, t * 0.9, t * 1.1] for r, t in times.items() if r != "baseline"}
    found = Search(0.03, "smart_batch@bs64", fastest="smart_batch+freeze_embeddings@bs64", times=posterior)
    ctx = Context(tmp_path, rows, found, 16, lambda _n: None, eco_row="adamw_fused+dynamic_pad")
    options = PlanOptions(out=str(tmp_path / "none"))
    first = summarize(ctx, "smart_batch@bs64")
    got = plan_api._checked(options, options.compare_options(), ctx, first, Render.of(None))
    # the superset of the rejected pick is skipped; an inconclusive check after the cap passes as not worse
    assert asked == ["smart_batch@bs64", "smart_batch"], asked
    assert got.plan == "smart_batch" and [c["passed"] for c in got.checked] == [False, True]
    assert any("lost quality" in n for n in got.notes) and "--strategies smart_batch " in got.commands[0] + " "
    # everything faster rejected: the ecosystem's default is the last one checked
    said.update({"smart_batch": WORSE})
    asked.clear()
    got = plan_api._checked(
        options, options.compare_options(), ctx, summarize(ctx, "smart_batch@bs64"), Render.of(None)
    )
    assert (
        asked == ["smart_batch@bs64", "smart_batch", "adamw_fused+dynamic_pad"]
        and got.plan == "adamw_fused+dynamic_pad"
    )
    # nothing learned: said, never a pass, and no other row is checked
    said.update({"smart_batch@bs64": NO_VERDICT})
    asked.clear()
    got = plan_api._checked(
        options, options.compare_options(), ctx, summarize(ctx, "smart_batch@bs64"), Render.of(None)
    )
    assert asked == ["smart_batch@bs64"] and got.plan is None and "--quality-steps" in (got.rejected or "")
    assert [ln.label for ln in got.lines][0] == "fastest, not recommended" and got.commands == []


def test_a_check_trains_each_row_on_as_many_samples(tmp_path, cls_csv):
    """8 steps of 8 for the baseline; a row whose step carries twice the samples (its own batch, or packed rows, as
    the speed study measured them) takes 4, at the rate scaled by sqrt(2)."""
    from tests.conftest import tiny_study
    from trainwise.search import verdicts as quality

    prepared = tiny_study(
        tmp_path, cls_csv, "classification", ["baseline", "smart_batch@bs16", "dynamic_pad"], max_steps=8
    )
    lr = prepared.specs[0].settings.lr
    rules = quality.equal_samples(prepared, {"dynamic_pad": 2.0, "baseline": 1.0})
    got = {t.row: (t.settings.batch_size, t.steps, t.settings.lr) for t in prepared.specs}
    assert got["baseline"] == (8, 8, lr)
    assert got["smart_batch@bs16"] == (16, 4, pytest.approx(lr * 2**0.5))
    assert got["dynamic_pad"] == (8, 4, pytest.approx(lr * 2**0.5))
    assert "square-root rule" in rules["smart_batch@bs16"] and "baseline" not in rules


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--never", "nosuch"], "--never: unknown strategy 'nosuch'"),
        (["--only", "dynamic_pad,baseline"], "--only: unknown strategy 'baseline'"),
        (["--objective", "quality"], "--objective quality"),
        (["--max-trials", "0"], "--max-trials must be >= 1"),
        # (the study's own rows only: a default row added first would train before the constraint is read)
        (["--memory-budget", "1KB", "--no-ecosystem-default"], "meets the constraints"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(searched, extra, says):
    out, _opts, _before, _result = searched
    fresh = "--memory-budget" in extra
    done = here.trainwise("plan", "--study", str(out), "--no-quality-check", *extra, fresh=fresh)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith(("trainwise: note", "model "))]
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len([ln for ln in lines if "error" in ln.lower()]) == 1, done.stderr[-2000:]


def test_the_estimate_prices_a_combination_before_it_trains(searched):
    """The driver's memory figure: `trainwise estimate` on the study's model, batch and lengths."""
    from trainwise.api.stored import pricer as _estimate

    out = searched[0]
    need = _estimate(out, 4)(frozenset({"smart_batch"}), 8)
    bigger = _estimate(out, 4)(frozenset({"smart_batch"}), 64)
    assert need is not None and bigger is not None and 0 < need < bigger < 10 * 2**30


def test_a_plan_json_of_an_earlier_search_is_read_back(searched, tmp_path):
    """A resumed search keeps what an earlier run measured in its record and budget (plan.json's candidates)."""
    from trainwise.api.plan import _searched_before

    out = searched[0]
    earlier = _searched_before(out)
    assert earlier and all(c.trial for c in earlier)
    assert (
        dataclasses.asdict(earlier[0])["row"]
        == json.loads((out / "plan.json").read_text())["search"]["candidates"][0]["row"]
    )


def test_a_check_is_priced_on_the_trials_it_will_run(tmp_path, cls_csv):
    """A second candidate's check reuses the baseline's stored quality trials: only the trials the store does not
    stand for are priced (an earlier pair, or a resumed check, costs nothing again)."""
    from tests.conftest import tiny_study
    from trainwise.core.results import TrialResult
    from trainwise.study.run import unstored
    from trainwise.study.store import STORE, Store

    prepared = tiny_study(tmp_path, cls_csv, "classification", ["baseline", "dynamic_pad"], repeat=2)
    assert unstored(prepared) == prepared.specs
    store = Store(prepared.out / STORE)
    for spec in prepared.specs:
        if spec.row == "baseline":
            store.put(spec, TrialResult(spec.row, "ok"))
    store.close()
    assert [t.row for t in unstored(prepared)] == ["dynamic_pad", "dynamic_pad"]
