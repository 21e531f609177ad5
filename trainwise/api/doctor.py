"""`trainwise doctor` as a call: every registry strategy tried for 2 steps on a tiny preset (text rows on
bert-tiny, image rows on resnext-tiny, causal-LM rows on llama-tiny, each trial in its own process, as
compare runs it), beside the device's facts, its measured peaks and the libraries' versions; written to
OUT/doctor.json and returned (the parts are `trainwise.study.device_checks`)."""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api.options import DoctorOptions
from trainwise.api.render import STDERR, Render
from trainwise.core.config import DEVICES, IMAGE_TASK
from trainwise.core.env import environment, package_version
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.run import launcher
from trainwise.run.events import Event, Phase
from trainwise.study.device_checks import (
    LIBRARIES,
    Check,
    DoctorReport,
    doctor_config,
    measure_device,
    rows_for,
    strategy_of,
    verdict,
)
from trainwise.training.job import launch
from trainwise.training.measure import device as dev


def start(options: DoctorOptions, render: Render | None = STDERR) -> DoctorReport:
    """Check every strategy on `options.device`; a line per check as its trial ends (`render.line`). A strategy
    that failed is in the report (`DoctorReport.check_failed` raises for it: the CLI's exit 1)."""
    render = Render.of(render)
    if options.device not in DEVICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {options.device!r}")
    with render.status("trainwise doctor: measuring the device's peaks...") as status:
        update = render.update(status)

        def on_event(task: str, spec: Any, e: Event) -> None:
            if isinstance(e, Phase):
                update(f"trainwise doctor: {spec.row} ({task}): {e.phase}")

        def on_done(task: str, spec: Any, r: Any, _cached: bool) -> None:
            what = f"{r.step_time_s:.3f} s/step" if r.status == "ok" else r.message
            render.line(f"  {spec.row} ({task}): {r.status}  {what}")

        return _run(options.device, Path(options.out), on_event, on_done)


def doctor(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> DoctorReport:
    """`trainwise doctor` in Python: the CLI's options as keyword arguments (over a study file's). Returns the
    DoctorReport (`.checks` with their verdicts, `.device`, `.environment`, `.path` of doctor.json)."""
    return start(DoctorOptions.of(options, config), render)


def _run(device: str, out: Path, on_event, on_done) -> DoctorReport:
    from trainwise.study.prepare import prepare_study, resolve_device  # heavy: trainwise.study.prepare loads numpy
    from trainwise.study.run import run_study  # heavy: trainwise.study.run loads numpy

    began = time.perf_counter()
    launcher.warm()  # the trials' process imports while the device is measured (each probe waits for it)
    resolved, caps = resolve_device(device)
    facts = dev.facts(resolved)
    peaks, ratios = measure_device(resolved)
    env = {**environment(resolved), **{f"{lib}_version": package_version(lib) for lib in LIBRARIES}}
    if resolved == "cuda":
        import torch  # heavy: torch

        env["cudnn"] = torch.backends.cudnn.version()
    report = DoctorReport(facts.to_dict(), env, peaks, ratios)
    text = rows_for("classification")
    # the image and causal-LM tasks add what classification cannot check
    image_only = [n for n in rows_for(IMAGE_TASK) if n not in text]
    lm_only = [n for n in rows_for("causal-lm") if n not in text]
    tasks = (("classification", text), (IMAGE_TASK, ["baseline", *image_only]), ("causal-lm", ["baseline", *lm_only]))
    for task, rows in tasks:
        runnable, missing = [], {}
        for name in rows:
            row = strategies.parse_row(name, 2)
            why = row.missing_capabilities(caps) or row.missing_packages()
            if why:
                missing[name] = f"needs {', '.join(why)}; this device ({resolved}) or environment lacks it"
            else:
                runnable.append(name)
        shutil.rmtree(out / task, ignore_errors=True)  # measured now, never a stored result from before a fix
        prepared = prepare_study(doctor_config(out, resolved, task, runnable))
        trials = run_study(prepared, launch, partial(on_event, task), partial(on_done, task))
        report.checks += [verdict(task, r) for _, r in trials]
        report.checks += [Check(strategy_of(name), task, "unsupported", why) for name, why in missing.items()]
    order = list(strategies.REGISTRY)
    report.checks.sort(key=lambda c: (order.index(c.strategy), c.task))
    report.wall_s = time.perf_counter() - began
    report.path = str(out / "doctor.json")
    write_atomic(Path(report.path), json.dumps(report.to_dict(), indent=1))
    return report
