"""OUT/plan.md: a `trainwise plan` result (its plan.json, as a dict) as text: the headline, the rows it is measured
against, every strategy in or out, every candidate measured, the quality checks, the cost and the commands."""

from __future__ import annotations

from trainwise.core.files import human_bytes
from trainwise.core.units import human_seconds


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _value(x: object) -> str:
    return "unset" if x is None else str(x).lower() if isinstance(x, bool) else str(x)


def _signed(x: float | None) -> str:
    return "?" if x is None else f"{x:+.2f}"


def _interval(t: list[float] | None) -> str:
    return "?" if not t else f"{t[0]:.1%} ({t[1]:.1%} to {t[2]:.1%})"


def headline(r: dict) -> list[str]:
    """plan.md's opening lines: the plan against the baseline and the ecosystem's default (time with its interval,
    memory, quality), its throughput and MFU beside the measured peak, and the search's cost where it exceeds an
    epoch of the plan."""
    lines = {ln["label"]: ln for ln in r["lines"]}
    plan = lines.get("plan")
    if plan is None or not plan.get("rel_time"):
        return []
    times = (r.get("search") or {}).get("times") or {}
    mine = times.get(plan["row"])
    t = mine[0] if mine else plan["rel_time"]
    said = f" (90% interval {mine[1]:.1%} to {mine[2]:.1%})" if mine else ""
    mem = _pct(plan["rel_mem"])
    out = [f"{1 / t:.2f}x the baseline's speed: {t:.1%} of its time per sample{said}, {mem} of its memory"]
    eco, versus = lines.get("ecosystem default"), r.get("versus_default")
    if eco is not None and r.get("ecosystem") and versus:
        mem = (
            f", {plan['peak_mem_bytes'] / eco['peak_mem_bytes']:.0%} of its memory"
            if eco.get("peak_mem_bytes") and plan.get("peak_mem_bytes")
            else ""
        )
        source = r["ecosystem"]["source"]
        if versus["faster"]:
            out.append(
                f"faster than what you get without trainwise, {source} (`{eco['row']}`, measured in this study): "
                f"{versus['ratio']:.2f}x (90% interval {versus['low']:.2f}x to {versus['high']:.2f}x){mem}"
            )
        else:
            out.append(
                f"no faster than {source} here (`{eco['row']}`, measured in this study): {versus['ratio']:.2f}x "
                f"(90% interval {versus['low']:.2f}x to {versus['high']:.2f}x), not a significant difference{mem}"
            )
    y = r.get("yours") or {}
    t = y.get("trainer") or {}
    if t.get("ratio") is not None:
        said = "faster than" if t["faster"] else "not significantly faster than" if t["ratio"] > 1 else "no faster than"
        trials = (y.get("versus") or {}).get("ratio")
        lo_hi = t.get("interval")
        steps = f"90% interval {lo_hi[0]:.2f}x to {lo_hi[1]:.2f}x from the steps, " if lo_hi else ""
        out.append(
            f"{said} {y['label']} in {t['trainer']} (your file and the plan's, {t['rounds']} interleaved round(s) of "
            f"{t['steps'] - t['warmup']} timed steps each): {t['ratio']:.2f}x ({steps}{t['low']:.2f}x to "
            f"{t['high']:.2f}x by round){'' if t['every_round'] else ', not in every round'}"
            + (f"; the trials (trainwise's loop) said {trials:.2f}x" if trials else "")
        )
    elif y.get("versus"):
        v = y["versus"]
        said = "faster than" if v["faster"] else "no faster than"
        out.append(
            f"{said} {y['label']} (`{y['row']}`, measured in this study): {v['ratio']:.2f}x (90% interval "
            f"{v['low']:.2f}x to {v['high']:.2f}x){'' if v['faster'] else ', not a significant difference'}"
        )
    if t.get("error"):
        out.append(
            f"your file and the plan's in {t['trainer']}: not measured ({t['error']}); the speed-up above is the "
            "trials', timed with trainwise's loop, which `trl sft` may not reach"
        )
    if y.get("written"):
        out.append(f"your file, changed: {y.get('line')} (written to {y['written']})")
    q = r.get("quality")
    if q:
        out.append(f"quality: {_quality_line(q)}")
    if plan.get("tokens_per_s"):
        out.append(f"{plan['tokens_per_s']:,.0f} non-pad tokens/s, {plan.get('samples_per_s') or 0:,.1f} samples/s")
    peak = r.get("peak") or {}
    if plan.get("flops_per_s") and peak.get("flops_per_s"):
        top = peak["flops_per_s"]
        out.append(
            f"{plan['flops_per_s'] / 1e12:.3g} TFLOP/s (counted FLOPs): {plan['flops_per_s'] / top:.1%} of the "
            f"device's best measured matmul peak here, {top / 1e12:.3g} TFLOP/s ({peak.get('mode')}, measured by "
            f"{peak.get('row')})"
        )
    run = (plan.get("epoch_time_s") or 0.0) * (r.get("run_epochs") or 1.0)
    if run and (r.get("quality_s") or 0.0) > run:
        out.append(
            f"the quality check took {human_seconds(r['quality_s'])}, more than the planned run it protects "
            f"({human_seconds(run)} at the plan's pace, --run-epochs {r.get('run_epochs') or 1.0:g}): for a run this "
            "short, --no-quality-check plans on speed alone"
        )
    share = r.get("search_share_of_epoch")
    if share is not None and share > 1:
        out.append(
            f"the search cost more than a projected epoch of the plan ({share:.0%}): it pays for a run of at least "
            f"{share:.0f} epochs of this data"
        )
    return out


def _quality_line(q: dict) -> str:
    """A check's verdict in one line: the metric and evaluation loss against the baseline's over paired seeds."""
    check = q.get("check") or {}
    metric = q.get("metric_name") or "metric"
    loss = f", evaluation loss {_signed(check.get('loss_delta'))}" if check.get("loss_delta") is not None else ""
    rule = f"; {q['lr_rule']}" if q.get("lr_rule") else ""
    return (
        f"{metric} {q['mean']:.2f} ({_signed(check.get('metric_delta'))} vs the baseline{loss}) over "
        f"{check.get('seeds', len(q.get('values') or []))} paired seeds x {q['steps']} steps: "
        f"{check.get('verdict', q.get('verdict'))} ({check.get('said', '')}){rule}"
    )


def markdown(r: dict) -> str:
    """OUT/plan.md."""
    out = [
        f"# trainwise plan: {r['study']}",
        "",
        f"**Plan: `{r['plan']}`**"
        if r.get("plan")
        else f"**No plan recommended: {r['rejected']}**"
        if r.get("rejected")
        else "**No plan beat the baseline.**",
        "",
    ]
    if r.get("headline"):
        out += [*(f"- {h}" for h in r["headline"]), ""]
    out += [
        "| | row | time % | mem % | samples/s | tokens/s | peak mem | epoch (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ln in r["lines"]:
        tokens = f"{ln['tokens_per_s']:,.0f}" if ln.get("tokens_per_s") else "-"
        out.append(
            f"| {ln['label']} | `{ln['row']}` | {_pct(ln['rel_time'])} | {_pct(ln['rel_mem'])} | "
            f"{ln.get('samples_per_s') or 0:.1f} | {tokens} | {human_bytes(ln.get('peak_mem_bytes') or 0)} | "
            f"{ln.get('epoch_time_s') or 0:.1f} |"
        )
    if r.get("ecosystem"):
        e = r["ecosystem"]
        fields_ = "; ".join(f"{k} ({v})" for k, v in e["fields"].items())
        out += ["", f"The ecosystem default is {e['source']} read from the installed library: {fields_}."]
    y = r.get("yours")
    if y:
        out += ["", "## Your config", ""]
        said = "; ".join(f"{k} ({v})" for k, v in (y.get("said") or {}).items())
        out.append(
            f"{y['label']} is the row `{y['row']}`: per_device_train_batch_size {y['per_device']} x "
            f"gradient_accumulation_steps {y['accum']}{'; ' + said if said else ''}."
        )
        if y.get("changes"):
            out += ["", "| field | yours | the plan |", "|---|---|---|"]
            out += [f"| `{k}` | {_value(a)} | {_value(b)} |" for k, a, b in y["changes"]]
            out += ["", f"Written to `{y['written']}`: every other field as you wrote it."]
        elif y.get("written"):
            out += ["", f"The plan changes no field of your file (`{y['written']}` is a copy)."]
        out += [f"- {n}" for n in y.get("unhonoured") or []]
        t = y.get("trainer") or {}
        if t:
            out += ["", f"### In {t['trainer']}", ""]
            out.append(
                f"Your file and the plan's trained as `trl sft --config FILE` builds the trainer, {t['rounds']} "
                f"round(s) each, interleaved, {t['steps']} steps a run ({t['warmup']} untimed); a run's epoch is "
                "the examples TRL built over its batch, at its median step"
                + (
                    f"; the 90% interval of the speed-up, {t['interval'][0]:.2f}x to {t['interval'][1]:.2f}x, is "
                    "each file's timed steps drawn again (every round's), the rounds' spread the drift between runs."
                    if t.get("interval")
                    else "."
                )
            )
            out += ["", "| round | file | s/step | epoch (s) | samples/s | last loss |", "|---|---|---|---|---|---|"]
            for i in range(t["rounds"]):
                for label in ("yours", "plan"):
                    run = (t.get(label) or [])[i] if i < len(t.get(label) or []) else {}
                    if run.get("status") != "ok":
                        out.append(f"| {i + 1} | {label} | {run.get('status', '-')}: {run.get('message', '')} | | | |")
                        continue
                    loss = f"{run['final_loss']:.3f}" if run.get("final_loss") is not None else "-"
                    out.append(
                        f"| {i + 1} | {label} | {run['s_per_step']:.2f} | {run['epoch_s']:.1f} | "
                        f"{run['samples_per_s']:.2f} | {loss} |"
                    )
    if r.get("checked"):
        out += ["", "## Quality", ""]
        for c in r["checked"]:
            q = c.get("quality") or {}
            verdict = f": {q and _quality_line(q)}" if q else ": no check finished"
            out.append(f"- `{c['row']}`{verdict}" + ("" if c["passed"] else f": rejected ({c['why']})"))
    s = r["search"]
    out += ["", "## Strategies", ""]
    unmeasured = [x["strategy"] for x in r["strategies"] if x["reason"].startswith("out: not measured")]
    out += [f"- `{x['strategy']}`: {x['reason']}" for x in r["strategies"] if x["strategy"] not in unmeasured]
    if unmeasured:
        out.append(f"- not among the study's rows, so not searched: {', '.join(unmeasured)}")
    out += [
        "",
        "## Candidates",
        "",
        "Each trial of the search, in order: why it was chosen, its predicted time (the model's median and 90% "
        "interval from the rows measured before it) and what it measured; `miss` is measured / predicted (above 1: the "
        "prediction was optimistic).",
        "",
        "| trial | row | why | predicted time % | measured time % | miss | state |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in s["candidates"]:
        meas = _pct(c["measured_time"]) if c.get("measured_time") is not None else "-"
        miss = f"{c['miss']:.2f}" if c.get("miss") is not None else "-"
        note = f" ({c['note']})" if c.get("note") else ""
        low, high = c.get("predicted_low"), c.get("predicted_high")
        predicted = (
            f"{_pct(c['predicted_time'])} ({_pct(low)}-{_pct(high)})"
            if low is not None
            else _pct(c.get("predicted_time"))
        )
        out.append(
            f"| {c.get('trial') or '-'} | `{c['row']}` | {c['reason']} | {predicted} | {meas} | {miss} | "
            f"{c['state']}{note} |"
        )
    if s.get("times"):
        out += [
            "",
            "The measured candidates by the model's posterior (their trials and the rest of the study together), the "
            "fastest first: " + "; ".join(f"`{row}` {_interval(t)}" for row, t in list(s["times"].items())[:8]),
        ]
    misses = sorted(c["miss"] for c in s["candidates"] if c.get("miss") is not None)
    predicted = (
        f"predictions missed by {misses[len(misses) // 2]:.2f}x at the median (from {misses[0]:.2f}x to "
        f"{misses[-1]:.2f}x over {len(misses)}); "
        if misses
        else ""
    )
    share = (
        f", {r['search_share_of_epoch']:.1%} of one projected epoch of the plan"
        if r.get("search_share_of_epoch")
        else ""
    )
    own = f" (the study's baseline runs: ±{s['study_noise']:.1%})" if s.get("study_noise") is not None else ""
    out += [
        "",
        f"Time: the single rows {r['singles_s']:.0f} s, the search {s['trials']} trial(s) and {s.get('repeats', 0)} "
        f"repeat(s), {s['wall_s']:.0f} s{share}, the quality check {r['quality_s']:.0f} s; {s.get('skipped', 0)} "
        f"candidate(s) never measured; {predicted}noise of one trial {s['noise']:.1%} (log sd){own}; "
        f"stopped: {s['stopped']}.",
    ]
    if r.get("commands"):
        out += ["", "## Carry it out", "", "```sh", *r["commands"], "```"]
    if r.get("notes"):
        out += ["", *[f"- {n}" for n in r["notes"]]]
    return "\n".join(out) + "\n"
