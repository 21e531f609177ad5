"""Issue 38 (first part): report.html, one self-contained page with its figures, and `trainwise report STUDY`, which
draws a study's reports again: also one killed mid-way, or one an earlier release wrote."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
from matplotlib.transforms import Bbox

from tests import here
from trainwise.core.results import StudyRow
from trainwise.report import figures
from trainwise.report import html as page
from trainwise.study.store import read_results

OLD = (
    Path(__file__).resolve().parents[1] / "data" / "study_e874211"
)  # a real study of the last release before the study package
# what would make a browser fetch something: a src/href, a CSS url() or @import that leaves the file
FETCHES = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import""", re.I)


def demo_rows() -> list[StudyRow]:
    """Ten rows shaped like the demo's (time %, memory %): smart_batch and dynamic_pad sit close, as there."""
    shape = {
        "baseline": (1.00, 1.00),
        "bf16": (16.2, 0.62),
        "grad_accum": (0.97, 0.55),
        "grad_ckpt": (1.59, 0.48),
        "adafactor": (0.94, 0.90),
        "dynamic_pad": (0.438, 0.61),
        "smart_batch": (0.234, 0.61),
        "freeze_embeddings": (1.02, 0.96),
        "all": (0.463, 0.32),
        "dynamic_pad+smart_batch": (0.22, 0.60),
    }
    rows = []
    for i, (name, (t, m)) in enumerate(shape.items()):
        rows.append(
            StudyRow(
                strategy=name,
                row=name,
                baseline=name == "baseline",
                status="ok",
                repeats=1,
                rel_time=t,
                rel_mem=m,
                step_time_s=0.5 * t,
                data_wait_s=0.01,
                compute_s=0.4 * t,
                optimizer_s=0.05,
                samples_per_s=32 / t,
                peak_mem_bytes=int(800e6 * m),
                state_bytes=int(350e6),
                mem_kind="cpu_allocated",
                metric_name="accuracy",
                metric=20.0 + i,
                losses=[2.0 - 0.05 * s + 0.01 * i for s in range(16)],
            )
        )
    rows.append(StudyRow(strategy="fp16", row="fp16", status="unsupported", message="needs cuda"))
    return rows


def demo_verdicts():
    """The quality phase's verdicts for three of the demo's rows, three seeds each."""
    from trainwise.core.quality import QualityRow, QualityVerdicts

    def row(name, values, verdict):
        return QualityRow(name, "accuracy", values, [1.0, 1.1, 0.9], 120, False, verdict=verdict)

    return QualityVerdicts(
        3,
        [
            row("baseline", [50.0, 52.5, 48.1], "reference"),
            row("smart_batch", [51.2, 49.9, 53.0], "no significant difference"),
            row("all", [40.3, 41.0, 39.2], "worse"),
        ],
    )


def demo_estimates() -> dict[str, dict]:
    """`trainwise estimate`'s prediction for every ok row of the demo but `all` (MemoryEstimate.to_dict()'s shape)."""
    out = {}
    for r in demo_rows():
        if r.status == "ok" and r.strategy != "all":
            act = int(300e6 * (r.rel_mem or 1.0))
            parts = {"weights": 90_000_000, "grads": 90_000_000, "optimizer": 180_000_000, "activations": act}
            out[r.strategy] = {"parts": {**parts, "step_temps": 1_000_000}, "peak_bytes": 360_000_000 + act}
    return out


def demo_plan() -> dict:
    """A plan search's plan.json (trainwise.api.plan.PlanResult.to_dict()'s shape), as a search keeps it: in the order
    proposed. Round 1 proposed three combinations (one measured in round 3, one never), seven trials over four rounds,
    one pruned by the memory estimate, and one measured over a budget (its `note`), faster than the plan."""

    def c(row, rnd, predicted, measured=None, state="measured", trial=None, note=""):
        return {"row": row, "round": rnd, "reason": "-", "predicted_time": predicted, "measured_time": measured,
                "state": state, "trial": trial, "note": note}  # fmt: skip

    lines = [("plan", "smart_batch@bs64", 0.073), ("best single row", "smart_batch", 0.26), ("all", "all", 0.463)]
    lines.append(("baseline", "baseline", 1.0))
    return {
        "plan": "smart_batch@bs64",
        "lines": [{"label": label, "row": row, "rel_time": t} for label, row, t in lines],
        "search": {
            "noise": 0.02, "incumbent": "smart_batch@bs64", "trials": 7, "rounds": 4, "wall_s": 236.0,
            "stopped": "no candidate left predicted to beat the incumbent",
            "candidates": [
                c("dynamic_pad+smart_batch", 1, 0.16, 0.25, trial=1),
                c("smart_batch+freeze_embeddings", 1, 0.12, 0.17, trial=5),
                c("adafactor+smart_batch", 1, 0.30, state="skipped"),
                c("smart_batch@bs32", 1, 0.26, 0.14, trial=2),
                c("smart_batch@bs64", 2, 0.08, 0.073, trial=3),
                c("smart_batch@bs128", 2, 0.035, 0.05, trial=4, note="needs 4.6 GiB, over --memory-budget 4 GiB"),
                c("smart_batch+freeze_embeddings@bs64", 3, 0.05, 0.075, trial=6),
                c("adafactor+smart_batch@bs64", 4, 0.07, 0.09, trial=7),
                c("grad_ckpt+smart_batch@bs64", 4, 0.07, None, "pruned"),
            ],
        },
    }  # fmt: skip


def demo_batch_search() -> dict:
    """find-batch's find_batch.json: 8..128 fit (128 fastest), 256 is over the limit by the estimate."""
    points = [
        {"batch_size": b, "status": "ok", "samples_per_s": 30.0 + b / 2, "measured_bytes": int(1.2e9 + 1e7 * b),
         "estimate_bytes": int(1.1e9 + 1.1e7 * b), "step_time_s": b / (30.0 + b / 2), "timed_steps": 3}
        for b in (8, 16, 32, 64, 128)
    ]  # fmt: skip
    points.append(
        {"batch_size": 256, "status": "over_limit", "note": "estimate 3.7 GiB > limit", "estimate_bytes": int(3.9e9)}
    )
    return {
        "points": points,
        "largest_fit": 128,
        "fastest": 128,
        "limit_bytes": 3 * 2**30,
        "tied": [128],
        "device": "cpu",
    }


def test_memory_figure_draws_estimates_beside_their_rows():
    text = page.report_html(demo_rows(), "t", estimates=demo_estimates())
    memory = text.split('<figure id="memory">')[1].split("</figure>")[0]
    assert "estimated: state" in memory and "hatched: estimated" in memory
    assert "not estimated: all." in memory, "the row without an estimate is named"
    alone = page.report_html(demo_rows(), "t").split('<figure id="memory">')[1].split("</figure>")[0]
    assert "estimated: state" not in alone and "trainwise report STUDY --estimate" in alone
    assert memory.count("<path") > alone.count("<path") + 9, "a bar of the estimate's parts beside each row"


def test_a_plan_search_is_drawn_predicted_against_measured():
    """A plan search is drawn as its path, predicted against measured."""
    text = page.report_html(demo_rows(), "t", plan=demo_plan())
    drawn = text.split('<figure id="plan">')[1].split("</figure>")[0]
    order = [m for m in re.findall(r">(\d\. [^<]+|grad_ckpt[^<]+)<", drawn)]
    assert order == [
        "1. dynamic_pad+smart_batch",
        "2. smart_batch@bs32",
        "3. smart_batch@bs64",
        "4. smart_batch@bs128 (over a budget)",
        "5. smart_batch+freeze_embeddings",
        "6. smart_batch+freeze_embeddings@bs64",
        "7. adafactor+smart_batch@bs64",
        "grad_ckpt+smart_batch@bs64 (pruned)",
    ], "in the order measured, then the pruned; the never-run left out"
    for said in ("predicted", "measured", "incumbent", "best single row: smart_batch (26%)", "all: all (46%)"):
        assert said in drawn, said
    assert "plan: smart_batch@bs64 (7%)" in drawn and "(7 trials, 236 s" in drawn
    assert "1 candidates were never measured" in drawn
    assert "beside the baseline, the best single row and `all` (" in drawn
    assert '<figure id="plan">' not in page.report_html(demo_rows(), "t", plan={"search": {}}), "nothing tried"


def test_the_incumbent_moves_only_within_every_budget():
    """smart_batch@bs128 measured 5%, faster than the plan, over the memory budget: the path stays at 7.3%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    original = figures._svg
    try:
        figures._svg = lambda fig: drawn.append(fig) or ""
        figures.plan_path(demo_plan())
    finally:
        figures._svg = original
    (ax,) = drawn[0].axes
    path = next(line for line in ax.get_lines() if line.get_label() == "incumbent")
    xs = list(path.get_xdata())
    plt.close(drawn[0])
    assert xs[0] == pytest.approx(26.0) and min(xs) == pytest.approx(7.3), xs  # from the best single row to the plan
    assert 5.0 not in [round(x, 1) for x in xs]


def test_an_estimate_is_drawn_only_beside_its_own_row():
    """estimates.json left from a study --replace replaced (another batch) is not drawn beside today's rows."""
    estimates = demo_estimates()
    plan = {"padding": "max_length"}
    rows = [dataclasses.replace(r, batch_size=16, plan=plan) for r in demo_rows()]
    for r in rows:
        if r.strategy in estimates:
            estimates[r.strategy]["for_row"] = {"batch_size": 16, "plan": plan}
    estimates["smart_batch"]["for_row"]["batch_size"] = 32
    memory = page.report_html(rows, "t", estimates=estimates).split('<figure id="memory">')[1].split("</figure>")[0]
    assert "not estimated: smart_batch, all." in memory


def test_a_study_page_draws_what_its_directory_holds(tmp_path):
    """A plan search's plan.json and a find-batch's find_batch.json in a study's --out each add their figure; a
    file that is not JSON is said on the page, which is still written."""
    from trainwise.study.store import page_of

    (tmp_path / "plan.json").write_text(json.dumps(demo_plan()))
    (tmp_path / "find_batch.json").write_text(json.dumps(demo_batch_search()))
    (tmp_path / "estimates.json").write_text(json.dumps(demo_estimates()))
    text = page_of(tmp_path, demo_rows(), "t", {})
    assert re.findall(r'<figure id="([^"]+)">', text) == [
        "tradeoff",
        "losses",
        "step-time",
        "memory",
        "plan",
        "find-batch",
    ]
    assert "estimated: state" in text and "fastest: 128" in text
    (tmp_path / "plan.json").write_text("{not json")
    text = page_of(tmp_path, demo_rows(), "t", {})
    assert "Not drawn: plan.json: JSONDecodeError" in text and '<figure id="find-batch">' in text


def test_report_json_of_a_find_batch_search_is_its_file_as_it_is(tmp_path):
    """Written over itself, every key stays: a later release's too."""
    out = tmp_path / "fb"
    out.mkdir()
    text = json.dumps({**demo_batch_search(), "title": "x", "from_a_later_release": [1, 2]}, indent=1)
    (out / "find_batch.json").write_text(text)
    done = here.trainwise("report", str(out), "--format", "json")
    assert done.returncode == 0 and done.stdout.strip() == str(out / "find_batch.json"), done.stderr
    assert (out / "find_batch.json").read_text() == text and not (out / "results.json").exists()
    said = here.trainwise("report", str(out), "--estimate")
    assert said.returncode == 2 and "already draws its estimate" in said.stderr


def test_report_draws_a_find_batch_search_again_from_its_file(tmp_path):
    """Each format in the API (the CLI is the same call: its one run is above)."""
    from trainwise.api.report import render

    out = tmp_path / "fb"
    out.mkdir()
    (out / "find_batch.json").write_text(json.dumps({**demo_batch_search(), "title": "trainwise find-batch: x"}))
    assert json.loads(render(out, "json"))["fastest"] == 128
    for fmt in ("html", "md", "csv"):
        text = render(out, fmt)
        assert "256" in text and "over_limit" in text and "128 (fastest)" in text, fmt
        if fmt != "csv":
            assert "trainwise find-batch: x" in text and "fastest: batch 128" in text, fmt
    page_text = render(out, "html")
    assert '<figure id="find-batch">' in page_text and not FETCHES.findall(page_text)


@pytest.mark.slow
def test_report_estimate_predicts_each_rows_memory_and_draws_it(tmp_path):
    """`trainwise report STUDY --estimate`: each ok row priced by the estimate on the study's own model (a study
    an earlier release wrote: bert-tiny), written to estimates.json, drawn beside the measured."""
    study = _copy(tmp_path)
    done = here.trainwise("report", str(study), "--estimate")
    assert done.returncode == 0, done.stderr
    estimates = json.loads((study / "estimates.json").read_text())
    assert sorted(estimates) == ["baseline", "dynamic_pad"]
    base = estimates["baseline"]
    assert base["batch_size"] == read_results(study)[0].batch_size and base["peak_bytes"] > sum(
        base["parts"][k] for k in ("weights", "grads", "optimizer")
    )
    memory = (study / "report.html").read_text().split('<figure id="memory">')[1].split("</figure>")[0]
    assert "estimated: state" in memory and "not estimated" not in memory


def test_the_quality_phase_is_drawn_with_every_seed_when_it_ran():
    text = page.report_html(demo_rows(), "t", verdicts=demo_verdicts())
    assert [m for m in re.findall(r'<figure id="([^"]+)">', text)][-1] == "quality"
    quality = text.split('<figure id="quality">')[1].split("</figure>")[0]
    assert ">all (worse)<" in quality and ">baseline (reference)<" in quality and "3 seeds" in quality
    assert quality.count("<use ") + quality.count("<path") >= 9, "a mark per seed"
    assert '<figure id="quality">' not in page.report_html(demo_rows(), "t"), "no phase, no figure"


def test_a_batch_sweep_draws_samples_per_s_against_size():
    """--batch-sizes 8,16,32: each row's samples/s at each size (smart_batch fails at 32: no point there)."""
    sweep = []
    for name in ("baseline", "smart_batch"):
        for bs in (8, 16, 32):
            ok = not (name == "smart_batch" and bs == 32)
            sweep.append(
                StudyRow(
                    strategy=f"{name} @bs{bs}", row=name, baseline=name == "baseline" and bs == 8, batch_size=bs,
                    status="ok" if ok else "oom", rel_time=1.0, rel_mem=1.0, samples_per_s=10.0 * bs if ok else None,
                )
            )  # fmt: skip
    text = page.report_html(sweep, "t")
    batch = text.split('<figure id="batch">')[1].split("</figure>")[0]
    assert ">baseline<" in batch and ">smart_batch<" in batch and ">32<" in batch
    assert '<figure id="batch">' not in page.report_html(demo_rows(), "t"), "one batch size: no figure"


def test_a_worker_sweep_is_drawn_against_the_worker_count():
    """--num-workers 0,1,2,4 at one batch (seed 003's question): samples/s against the workers, the batch said once."""
    sweep = [
        StudyRow(strategy=f"{name} @w{w}", row=name, baseline=name == "baseline" and w == 0, batch_size=128, workers=w,
                 status="ok", rel_time=1.0, rel_mem=1.0, samples_per_s=1000.0 + 100 * w)
        for name in ("baseline", "bf16") for w in (0, 1, 2, 4)
    ]  # fmt: skip
    text = page.report_html(sweep, "t")
    workers = text.split('<figure id="workers">')[1].split("</figure>")[0]
    assert ">bf16<" in workers and "DataLoader worker processes" in workers and "Do DataLoader workers pay?" in workers
    assert '<figure id="batch">' not in text


def test_the_page_holds_table_and_figures_and_fetches_nothing():
    settings = {"model": "MiniLM", "command": "trainwise compare"}
    text = page.report_html(demo_rows(), "trainwise compare: demo", settings)
    assert text.startswith("<!DOCTYPE html>") and "<table>" in text and "MiniLM" in text
    assert [m for m in re.findall(r'<figure id="([^"]+)">', text)] == ["tradeoff", "losses", "step-time", "memory"]
    assert text.count("<svg") == 4 and text.count("<figcaption>") == 4
    assert not FETCHES.findall(text), FETCHES.findall(text)
    assert "<script" not in text and "<metadata" not in text
    assert "smart_batch" in text and ">dynamic_pad+smart_batch<" in text  # labels are SVG text, not paths
    assert "fp16" in text.split("<h2>Figures</h2>")[1], "a row that did not run is named under the figure"
    assert len(text) < 300_000
    again = page.report_html(
        demo_rows(), "trainwise compare: demo", {"model": "MiniLM", "command": "trainwise compare"}
    )
    assert again == text, "the same study draws the same file"


@pytest.mark.parametrize("rows", ["demo", "crowded"])
def test_labels_never_overlap_each_other_a_point_or_the_legend(rows):
    """On the demo's rows (smart_batch and dynamic_pad close; bf16 far out, on a log axis) and on 30 rows in a
    cluster, the time-memory figure's labels sit inside the axes, apart from each other, the points and the legend."""
    table = demo_rows()
    if rows == "crowded":
        table = [dataclasses.replace(table[i % 10], strategy=f"row {i}", rel_time=0.5 + 0.01 * i) for i in range(30)]
        table[0] = dataclasses.replace(table[0], baseline=True, rel_time=1.0, rel_mem=1.0)
    fig, ax, labels = figures.tradeoff_figure(table)
    renderer = fig.canvas.get_renderer()
    boxes = [figures._text_box(label, renderer) for label in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    frame, legend = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
    points = [ax.transData.transform(o.get_offsets()[0]) for o in ax.collections if len(o.get_offsets())]
    assert len(points) == len(labels)
    for box in boxes:
        assert not box.overlaps(legend)
        assert not any(box.overlaps(Bbox.from_extents(x - 3, y - 3, x + 3, y + 3)) for x, y in points)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def test_the_pareto_front_is_the_rows_nothing_beats_on_both():
    points = [(100, 100), (23, 61), (22, 60), (44, 61), (46, 32), (159, 48), (97, 55)]
    assert figures.pareto_front(points) == [2, 4]
    assert figures.pareto_front([(1, 1)]) == [0]


def _copy(tmp_path: Path) -> Path:
    study = tmp_path / "old"
    shutil.copytree(OLD, study)
    return study


@pytest.mark.parametrize("fmt, name", [("html", "report.html"), ("md", "report.md"), ("csv", "results.csv")])
def test_report_draws_a_study_an_earlier_release_wrote(tmp_path, fmt, name):
    study = _copy(tmp_path)
    (study / name).unlink(missing_ok=True)
    done = here.trainwise("report", str(study), "--format", fmt)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(study / name)
    text = (study / name).read_text()
    assert "dynamic_pad" in text and "baseline" in text
    if fmt == "html":
        assert "<svg" in text and not FETCHES.findall(text)
        assert "trainwise compare: bert-tiny" in text, "its title, from its report.md"


def test_report_json_is_todays_form_and_reads_back_the_same_rows(tmp_path):
    study = _copy(tmp_path)
    before = read_results(study)
    done = here.trainwise("report", str(study), "--format", "json", "--output", "-")
    assert done.returncode == 0 and json.loads(done.stdout)["rows"][0]["strategy"] == "baseline"
    assert here.trainwise("report", str(study), "--format", "json").returncode == 0
    assert read_results(study) == before


def test_report_of_a_killed_study_says_it_is_partial(tmp_path):
    study = _copy(tmp_path)
    progress = json.loads((study / "progress.json").read_text())
    (study / "progress.json").write_text(json.dumps({**progress, "done": 2, "total": 4}))
    done = here.trainwise("report", str(study), "--output", str(tmp_path / "page.html"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "page.html").read_text()
    assert 'class="partial"' in text and "2 of 4 trials finished" in text
    assert not (study / "report.html").exists(), "--output names the file"


def test_report_refuses_a_study_another_command_is_running_in(tmp_path):
    from trainwise.core.files import hold

    study = _copy(tmp_path)
    with hold(study):
        done = here.trainwise("report", str(study))
    assert done.returncode == 2 and "is in use by another trainwise command" in done.stderr
    assert not (study / "report.html").exists()


def test_a_failing_figure_is_said_and_the_page_still_written(monkeypatch):
    def broken(table):
        raise ValueError("no room")

    monkeypatch.setattr(page, "FIGURES", (broken, figures.losses))
    text = page.report_html(demo_rows(), "t")
    assert "Not drawn: broken: ValueError: no room" in text and '<figure id="losses">' in text


@pytest.mark.parametrize(
    "args, says",
    [
        (["{empty}"], "no results.json"),
        (["{study}", "--format", "pdf"], "--format must be one of html, md, csv, json, got 'pdf'"),
        (["{study}", "--formt", "md"], "No such option"),
        (["{study}", "--format", "md", "--estimate"], "--estimate draws the estimate on the page: use it with"),
    ],
)
def test_report_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty", study=OLD) for a in args]
    done = here.trainwise("report", *argv)
    assert done.returncode == 2 and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_replace_moves_aside_what_is_about_replaced_rows(tmp_path):
    """--replace: the rows' estimates and a plan search go aside with the report (never drawn beside new rows)."""
    from trainwise.study.store import keep_reports

    for name in ("results.json", "estimates.json", "plan.json", "plan.md"):
        (tmp_path / name).write_text("{}")
    kept = keep_reports(tmp_path)
    assert all((kept / n).is_file() for n in ("results.json", "estimates.json", "plan.json", "plan.md"))
    assert (tmp_path / "results.json").is_file(), "rewritten by the new study's first trial"
    assert not any((tmp_path / n).exists() for n in ("estimates.json", "plan.json", "plan.md"))


def test_a_stale_page_goes_and_the_last_write_draws_it(tmp_path):
    """A study that grows or resumes rewrites its reports as each trial ends: a page left from before, which no
    longer holds every row, is removed; the study's last write draws it again."""
    from trainwise.study.store import write_reports

    rows = demo_rows()
    (tmp_path / "report.html").write_text("<html>an earlier study's rows</html>")
    write_reports(tmp_path, rows[:3], "t", done=3, total=11)
    assert not (tmp_path / "report.html").exists() and (tmp_path / "report.md").is_file()
    paths = write_reports(tmp_path, rows, "t", done=11, total=11, page=True)
    assert tmp_path / "report.html" in paths and "smart_batch" in (tmp_path / "report.html").read_text()
