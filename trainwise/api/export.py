"""`trainwise export` as a call: a plan written as the user's own training configs and command."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api.options import ExportOptions
from trainwise.core.errors import ConfigError
from trainwise.estimating.data import EstimateConfig
from trainwise.exporting.arguments import BUNDLED_HUB_ID, RunSettings, epochs_for, named_model
from trainwise.exporting.scripts import ExportConfig, chat_form, check_exportable, write_export
from trainwise.search.ranking import pick
from trainwise.study.store import Store, partial_note, read_results
from trainwise.training.models import CAUSAL_LM, ModelSource, resolve_model


@dataclass(frozen=True)
class Exported:
    row: str  # the plan written
    paths: list[Path]  # the files
    notes: list[str]  # what the user should know about them


def start(options: ExportOptions) -> Exported:
    return Exported(*export_plan(options.resolve(), Path(options.out)))


def export(config: str | Path | None = None, **options: Any) -> Exported:
    """`trainwise export` in Python: the CLI's options as keyword arguments (over a study file's)."""
    return start(ExportOptions.of(options, config))


def export_plan(cfg: ExportConfig, out: Path) -> tuple[str, list[Path], list[str]]:
    """Resolve the plan and its settings (from the study, or from the options), then write the files."""

    task, batch, accum, lengths, lr = (
        cfg.task,
        cfg.batch_size,
        cfg.accum_steps,
        (cfg.max_length, cfg.max_target_length),
        cfg.lr,
    )
    max_steps, nproc, seed, epochs = cfg.max_steps or 1000, cfg.nproc or 1, 0, 1
    origin, train_rows, tokenizer_dir, data_format, truncation = None, None, None, "", ""
    chat_messages, chat_note = False, ""
    source: ModelSource | None = None  # without a study: the model the options name
    labels: tuple[str, ...] = ()
    if cfg.study is not None:
        from trainwise.training.data.prepared import read_labels  # heavy: trainwise.training.data.prepared loads torch

        store = Store.of(Path(cfg.study))
        try:
            entry = pick(read_results(Path(cfg.study)), cfg.strategies, f"--study {cfg.study}")
            spec = store.spec(entry.row_text)
            origin = store.origin()
        finally:
            store.close()
        if spec is None:
            raise ConfigError(f"--study {cfg.study}: the store holds no trial of {entry.strategy!r}")
        s = spec.settings
        check_exportable(s.task)
        text, (model, preset) = spec.row, named_model(s)
        task, batch, accum, lengths, lr = (
            s.task,
            entry.batch_size if entry.batch_size is not None else s.batch_size,
            s.accum_steps,
            (s.max_length, s.max_target_length),
            s.lr,
        )
        max_steps = cfg.max_steps or spec.steps or 1000
        nproc = cfg.nproc or s.nproc
        seed = s.seed
        labels = tuple(read_labels(s.data_dir)) if task == "classification" else ()
        epochs = epochs_for(dataclasses.replace(spec, settings=dataclasses.replace(s, batch_size=batch)), max_steps)
        prepared = Path(s.data_dir) / "train.jsonl"
        train_rows = str(prepared) if prepared.is_file() else None
        tokenizer_dir = s.tokenizer_dir if preset else None
        data_format = s.data_format if task == CAUSAL_LM else ""
        truncation = s.truncation if task == CAUSAL_LM else ""
        if data_format == "chat":
            chat_messages, chat_note = chat_form(s, train_rows)
    else:
        assert cfg.strategies is not None, "ExportConfig requires one of them"
        text = cfg.strategies
        source = resolve_model(cfg.model, cfg.model_preset, cfg.task, (cfg.max_length, cfg.max_target_length))
        preset = source.kind == "preset"
        model = BUNDLED_HUB_ID if source.label == "all-MiniLM-L6-v2" else source.ref
    own = strategies.parse_row(text, accum).batch_size  # a row at its own batch size (`bf16@bs32`)
    if own:
        text, batch = text.partition("@")[0].strip(), own
    parsed = EstimateConfig(
        strategies=(text,),
        task=task,
        batch_size=batch,
        accum_steps=accum,
        max_length=lengths[0],
        max_target_length=lengths[1],
        nproc=nproc,
        zero=cfg.zero,
        offload=cfg.offload,
    )
    row = parsed.parsed[0]
    if source is not None and source.kind != "preset":
        # the plan's model edits apply to this model, as a study checks before its trials: TRL's packing and
        # padding-free batches keep examples apart through position ids, as trainwise's do, and a family that ignores
        # them (OPT, Bloom, Falcon) would let them attend to each other, silently; refused here
        from trainwise.study.prepare import check_plan_applies  # heavy: numpy, and torch to build the meta model

        check_plan_applies(source, task, row)
    if cfg.device == "cpu" and "cuda" in row.requires:
        names = ", ".join(s.name for s, _ in row.parts if "cuda" in s.requires)
        raise ConfigError(
            f"{row.text!r} needs CUDA ({names}); --device cpu cannot run it (on CPU the HF Trainer would silently "
            "train fp16 in fp32)"
        )
    run = RunSettings(
        model,
        task,
        batch,
        *lengths,
        lr,
        max_steps,
        seed=seed,
        nproc=nproc,
        device=cfg.device,
        model_is_preset=preset,
        row=row.text,
        accum_steps=accum,
        origin=origin,
        labels=labels,
        train_rows=train_rows,
        epochs=epochs,
        tokenizer_dir=tokenizer_dir,
        data_format=data_format,
        chat_messages=chat_messages,
        truncation=truncation,
    )
    paths, notes = write_export(row.plan, run, out, cfg.force)
    if chat_note:
        notes.append(chat_note)
    if cfg.study is not None:
        partial = partial_note(Path(cfg.study))
        if partial:
            notes.insert(0, partial)
    if cfg.study is not None and origin is None:
        notes.insert(
            0,
            f"{cfg.study} does not record where its data came from (written by an older trainwise): "
            "add its --dataset or --train-file/--text-column/--target-column to train_command.txt",
        )
    return row.text, paths, notes
