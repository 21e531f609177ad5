"""Issue 34 (C): a long study says how long it takes. The projection is arithmetic on the first trial's first
timed steps (asserted on made-up paces, never on this machine's speed), said once as a note, with a shorter
study when it is long, and kept as the study bar's time remaining."""

from __future__ import annotations

import pytest

from trainwise.run.events import Phase, Projection, Step
from trainwise.strategies import DEFAULT_ROWS as DEFAULT
from trainwise.study import projection
from trainwise.study.projection import Clock, Pace, Shape, note, remaining_s


def test_a_trial_is_its_start_up_and_its_steps():
    # the 4th step (the first timed one after 3 warm-up steps) ended 240 s after the launch, at 55 s/step
    pace = Pace.of("baseline", elapsed_s=240.0, step=4, step_s=55.0)
    assert pace == Pace(55.0, 20.0, "baseline")
    assert pace.trial_s(16) == 20.0 + (16 + projection.AFTER_STEPS) * 55.0
    assert Pace.of("baseline", elapsed_s=1.0, step=4, step_s=55.0).start_s == 0.0, "never negative"


def test_a_short_study_is_said_in_one_line_with_what_it_rests_on():
    shape = Shape(("baseline", "dynamic_pad"), per_row=1, extra=1, steps=16, warmup=3)
    line = note(Pace(1.5, 8.0, "baseline"), shape, 3)
    assert line == (
        "trainwise: note: this study will take about 2 min: 3 trials of 16 steps at 1.50 s/step (measured on "
        "baseline) and 8 s of start-up each"
    )


def test_a_long_study_is_offered_a_short_list_and_fewer_steps():
    """The causal-LM study of issue 34: the 10 default rows and the baseline again, at 55 s/step. bf16 and fp16
    are emulated on this CPU (a named row is trained as asked, 26x slower): the short list leaves them out."""
    shape = Shape(DEFAULT, per_row=1, extra=1, steps=16, warmup=3, slow=frozenset({"bf16", "fp16"}))
    pace = Pace(55.0, 20.0, "baseline")
    line = note(pace, shape, 11)
    assert line.startswith("trainwise: note: this study will take about 3 h 5 min: 11 trials of 16 steps at 55.00")
    short = shape.short_rows()
    assert short == ("baseline", "dynamic_pad", "grad_ckpt")
    assert "--strategies baseline,dynamic_pad,grad_ckpt (4 trials, about 67 min)" in line
    assert shape.short_steps() == 8 and "--max-steps 8 (about 1 h 44 min)" in line
    assert "or both (about 38 min)" in line and "stop it (Ctrl-C) and run it again with" in line
    assert 11 * pace.trial_s(16) > projection.LONG_S


@pytest.mark.parametrize(
    "rows, slow, short",
    [
        (("baseline", "bf16", "dynamic_pad"), (), None),  # nothing to leave out
        (("baseline", "lora", "qlora", "liger", "packing"), (), ("baseline", "lora", "qlora")),  # topped up
        (("baseline", "bf16", "lora", "packing"), ("bf16",), ("baseline", "lora", "packing")),
    ],
)
def test_the_short_list_keeps_the_baseline_and_one_row_per_lever(rows, slow, short):
    assert Shape(rows, 1, 0, 16, 3, frozenset(slow)).short_rows() == short


def test_fewer_steps_still_time_four_and_save_a_quarter():
    assert Shape(DEFAULT, 1, 0, steps=16, warmup=3).short_steps() == 8
    assert Shape(DEFAULT, 1, 0, steps=100, warmup=3).short_steps() == 50
    assert Shape(DEFAULT, 1, 0, steps=8, warmup=3).short_steps() is None


def test_the_time_left_follows_the_trials_as_they_end():
    pace = Pace(2.0, 10.0, "baseline")  # 46 s a trial of 16 steps
    assert remaining_s(pace, 16, left=3, walls=[]) == 3 * 46.0
    assert remaining_s(pace, 16, left=3, walls=[], elapsed_s=40.0) == 6.0 + 3 * 46.0
    assert remaining_s(pace, 16, left=2, walls=[30.0, 50.0], elapsed_s=10.0) == 30.0 + 2 * 40.0


def test_the_projection_is_said_once_at_the_first_timed_step():
    now = [0.0]
    clock = Clock(Shape(("baseline", "dynamic_pad"), 1, 0, steps=4, warmup=1), to_run=2, now=lambda: now[0])
    clock.started("baseline")
    now[0] = 12.0
    assert clock.step(Step(1, 4, 1.0, step_s=5.0)) is None, "a warm-up step says nothing"
    now[0] = 14.0
    first = clock.step(Step(2, 4, 1.0, step_s=2.0))
    # step 2 ended 14 s in at 2 s/step: 10 s of start-up; a trial is that and 4 + 2 steps of 2 s: 22 s
    assert (
        first is not None and first.text and first.text.startswith("trainwise: note: this study will take about 44 s")
    )
    assert first.remaining_s == pytest.approx(22.0 - 14.0 + 22.0)
    now[0] = 24.0
    later = clock.step(Step(3, 4, 1.0, step_s=10.0))  # a stall: the median of 2 and 10 s
    assert later is not None and later.text is None
    assert later.remaining_s == pytest.approx(10.0 + 6 * 6.0 - 24.0 + 10.0 + 6 * 6.0)
    assert clock.step(Phase("eval")) is None
    now[0] = 30.0
    assert clock.ended() == Projection(30.0), "the next trial: as long as this one took"


def test_the_study_says_its_projection_where_the_user_sees_it(tmp_path, cls_csv, capsys):
    """run_study passes the projection on as the study's event, after the first timed step of the first trial
    it launches (not a stored one); the terminal prints its note and shows the time left on the study bar."""
    from tests.conftest import tiny_study
    from trainwise.core.results import TrialResult
    from trainwise.report import terminal
    from trainwise.study.run import run_study

    study = tiny_study(tmp_path, cls_csv, "classification", ["baseline", "dynamic_pad"], max_steps=4)

    def launch(spec, _dir, _timeout, emit):  # a trial of 100 s steps, without running one
        for step in range(1, spec.steps + 1):
            emit(Step(step, spec.steps, 1.0, step_s=100.0))
        return TrialResult(spec.row, "ok", spec.repeat, step_time_s=100.0, samples_per_s=0.08)

    seen: list = []
    with terminal.study_progress(study) as (on_event, on_done):

        def events(spec, e):
            seen.append(e)
            on_event(spec, e)

        run_study(study, launch, events, on_done)
    said = [e for e in seen if isinstance(e, Projection)]
    assert len([e for e in said if e.text]) == 1 and said[0].text
    assert seen.index(said[0]) == 2, "after the first timed step (step 2: one warm-up step)"
    assert said[-1].remaining_s == 0.0
    err = capsys.readouterr().err
    assert "this study will take about 20 min: 2 trials of 4 steps at 100.00 s/step" in err
    assert "--max-steps" not in err and "--strategies" not in err, "no shorter study to offer: 2 rows, 4 steps"


def test_a_training_progress_line_has_its_rate_and_time_left():
    """train's live line: step i/N, loss, samples/s at the median of the last steps' wall time (an evaluation
    between two steps is not a slow step), and the time left at that pace; a step that goes back is another run."""
    from trainwise.report.progress import TrainLine
    from trainwise.run.events import Step

    progress = TrainLine()
    assert progress.line(Step(1, 10, 2.5, samples=8), now=100.0) == "step 1/10  loss 2.5000"  # nothing to time yet
    for step in (2, 3, 4, 5):
        line = progress.line(Step(step, 10, 2.0, samples=8), now=100.0 + 2 * (step - 1))
    assert line == "step 5/10  loss 2.0000  4.0 samples/s  ~10 s left"
    for step in (6, 7, 8, 9):  # an evaluation of 30 s after step 5: not a slow step
        progress.line(Step(step, 10, 1.5, samples=8), now=130.0 + 2 * (step - 1))
    assert progress.line(Step(10, 10, 1.0, samples=8), now=148.0) == "step 10/10  loss 1.0000  4.0 samples/s"
    assert progress.line(Step(1, 4, 3.0, samples=8), now=500.0) == "step 1/4  loss 3.0000", "a new run"
    assert progress.line(Step(2, 4, 3.0, samples=8), now=501.0).endswith("8.0 samples/s  ~2 s left")


def test_a_calibration_says_which_probe_and_the_time_left(monkeypatch):
    """estimate's and advise's calibration: probe i of n on the status line, and the time left at the pace so far."""
    from trainwise.api import render

    clock = iter([90.0, 100.0, 104.0, 108.0, 500.0, 502.0])
    monkeypatch.setattr(render.time, "monotonic", lambda: next(clock))
    said: list[str] = []
    on_probe = render.probes(said.append, "calibrating activations (bert, cpu)")
    for i in (0, 1, 2, 0, 1):  # advise calibrates once per plan: the second starts its own clock
        on_probe(i, 16)
    assert said == [
        "calibrating activations (bert, cpu): probe 1/16",
        "calibrating activations (bert, cpu): probe 2/16, ~60 s left",
        "calibrating activations (bert, cpu): probe 3/16, ~56 s left",
        "calibrating activations (bert, cpu): probe 1/16",
        "calibrating activations (bert, cpu): probe 2/16, ~30 s left",
    ]
