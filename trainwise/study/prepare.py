"""A study's preparation: every check that can fail on user input (strategies, device, model, data, output
directory) before anything is written, then the data, the tokenizer and the trial specs on disk."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM, DEFAULT_DATASET, IMAGE_TASK, TrialSettings
from trainwise.core.device import DeviceFacts
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic, writing
from trainwise.spec.config import Cell, StudyConfig, TrialSpec
from trainwise.strategies import Row, Support
from trainwise.study.origin import DataOrigin
from trainwise.study.store import STORE, Store, check_ours, mark, write_data
from trainwise.training import gguf
from trainwise.training.data.chat import chat_notes, check_chat_template, encode_chat
from trainwise.training.data.metrics import missing_text_metric_packages
from trainwise.training.data.sources import read_task_data, tokenizer_corpus
from trainwise.training.measure.device import facts as device_facts
from trainwise.training.measure.device import precision_ratio
from trainwise.training.models import (
    ModelSource,
    head_note,
    load_tokenizer,
    meta_model,
    model_config,
    resolve_model,
    train_tokenizer,
)


def resolve_device(device: str) -> tuple[str, set[str]]:
    """The device to run on and the capabilities it offers (see strategies.base.CAPABILITIES)."""
    import torch  # heavy: torch

    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ConfigError("--device cuda: no CUDA device is visible to torch; use --device cpu or auto")
    resolved = "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"
    if resolved == "cpu":
        return resolved, {"bf16"}
    caps = {"cuda", "fp16"}
    if torch.cuda.is_bf16_supported():
        caps.add("bf16")
    return resolved, caps


@dataclass
class PreparedStudy:
    config: StudyConfig
    out: Path
    specs: list[TrialSpec]  # one per (repeat, cell); repeats interleaved
    cells: list[Cell]
    unsupported: dict[str, str]  # row text -> why this device cannot run it
    # row text -> its precision's verdict on this device (native ones included: their measured ratio)
    verdicts: dict[str, Support] = dataclasses.field(default_factory=dict)
    # default rows whose precision is emulated here and slow: recorded from the micro-benchmark, not trained
    recorded: dict[str, Support] = dataclasses.field(default_factory=dict)
    row_notes: dict[str, str] = dataclasses.field(default_factory=dict)  # row text -> what the device changed
    n_eval: int = 0  # held-out rows prepared (before --eval-samples takes its share)
    notes: tuple[str, ...] = ()  # what the user should know about the input (rows skipped, a new head)

    def cell_of(self, spec: TrialSpec) -> Cell:
        return next(c for c in self.cells if c.matches(spec))


def _fingerprint(train: list[dict], evals: list[dict]) -> str:
    h = hashlib.sha256()
    for row in [*train, {"split": "eval"}, *evals]:
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()[:16]


# a default row whose precision is emulated and this many times slower than fp32 (a linear layer,
# measured) is recorded from that measurement instead of trained: bf16 on an AVX2-only CPU is ~26x
SLOW_RATIO = 3.0


def precision_verdicts(rows: list[Row], device: str, facts: DeviceFacts) -> dict[str, Support]:
    """Each row's precision on this device (the worst knob verdict: strategies.support), confirmed by a
    linear layer timed in that precision against fp32 (~0.3 s per precision, cached): the measurement
    wins where they disagree (flags that say native on a device that runs it SLOW_RATIO times slower
    read emulated; flags that name no unit on a device that runs it faster than fp32 read native)."""
    ratios: dict[str, float] = {}
    found: dict[str, Support] = {}
    for row in rows:
        worst = strategies.worst(strategies.support(row.plan, facts))
        if worst is None:
            continue
        knob, verdict = worst
        value = str(row.plan.value(knob))
        if knob == "precision" and verdict.status in ("native", "emulated"):
            ratio = ratios[value] = ratios.get(value) or precision_ratio(device, value)
            if verdict.status == "native" and ratio >= SLOW_RATIO:
                verdict = Support("emulated", f"{verdict.reason}, yet measured as slow as emulation", ratio, value)
            elif verdict.status == "emulated" and ratio < 1.0:  # the flags missed a unit the kernels use
                reason = f"{verdict.reason.split(' (')[0]} (measured faster than fp32)"
                verdict = Support("native", reason, ratio, value)
            verdict = dataclasses.replace(verdict, ratio=ratio)
        found[row.text] = verdict
    return found


def too_slow(names: list[str], device: str, caps: set[str]) -> dict[str, str]:
    """Of these strategies, those whose precision this device only emulates, SLOW_RATIO times slower than fp32 or more
    (bf16 on an AVX2-only CPU), and why: the default rows record them rather than train them, and the plan's row of
    the ecosystem's defaults is measured without them (said)."""
    rows = []
    for name in names:
        with contextlib.suppress(ConfigError):
            row = strategies.parse_row(name, 1)
            if not row.missing_capabilities(caps):
                rows.append(row)
    found = precision_verdicts(rows, device, device_facts(device))
    return {
        name: v.line()
        for name, v in found.items()
        if v.status == "emulated" and (v.ratio is None or v.ratio >= SLOW_RATIO)
    }


def _fit_to_device(cfg: StudyConfig, device: str, caps: set[str], facts: DeviceFacts, unsupported: dict[str, str]):
    """Precision truth before any trial: every row's verdict; in the default rows (a study of them, rows added
    to it or not), an emulated slow precision is recorded rather than trained, and `all` trains with the best
    precision the device has (fp16 on a V100, fp32 on an AVX2-only CPU). Rows the user names are trained as
    asked."""
    verdicts = precision_verdicts([r for r in cfg.rows if r.text not in unsupported], device, facts)
    recorded: dict[str, Support] = {}
    row_notes: dict[str, str] = {}
    if not cfg.fit_to_device:
        return verdicts, recorded, row_notes
    for i, row in enumerate(cfg.rows):
        verdict = verdicts.get(row.text)
        if verdict is None or verdict.status != "emulated" or row.text not in strategies.default_rows(cfg.task):
            continue
        if row.text not in strategies.ALIASES:
            if (verdict.ratio or SLOW_RATIO) >= SLOW_RATIO:
                recorded[row.text] = verdict
            continue
        old = str(row.plan.value("precision"))
        others = [strategies.with_precision(row, name) for name in ("bf16", "fp16") if name != old]
        best = next(
            (
                str(r.plan.value("precision"))
                for r in others
                if not r.missing_capabilities(caps)
                and (v := precision_verdicts([r], device, facts).get(r.text))
                and v.status == "native"
            ),
            None,
        )
        cfg.rows[i] = strategies.with_precision(row, best)
        row_notes[row.text] = f"trained with {best or 'fp32'} instead of {old}: {verdict.line()}"
        verdicts.pop(row.text)
    return verdicts, recorded, row_notes


def prepare_study(cfg: StudyConfig, on_note: Callable[[str], None] = lambda _line: None) -> PreparedStudy:
    """Every check of the input, then the data, the tokenizer and the trial specs on disk. What the user
    should know about the input (rows skipped, a head trained new) goes to `on_note` as it is found, and
    stays on the result's `notes`."""
    device, caps = resolve_device(cfg.device)
    unsupported: dict[str, str] = {}
    for row in cfg.rows:
        missing = row.missing_capabilities(caps)
        if not missing:
            continue
        reason = f"needs {', '.join(missing)}; this device ({device}) lacks it"
        # asked explicitly for a device that cannot run a row the user named: bad input (a default row the device
        # cannot run is recorded 'unsupported', as with auto: the user never chose it)
        if cfg.device != "auto" and not (cfg.fit_to_device and row.text in strategies.default_rows(cfg.task)):
            raise ConfigError(f"strategy {row.text!r} {reason}; drop it or use a device that supports it")
        unsupported[row.text] = reason
    for row in cfg.rows:
        wrong = row.wrong_task(cfg.task)
        if wrong is not None:
            raise ConfigError(
                f"strategy {wrong.name!r} (in {row.text!r}) applies to {', '.join(sorted(wrong.tasks))}, not {cfg.task}"
            )
        missing_pkgs = row.missing_packages()
        if missing_pkgs and row.text not in unsupported:
            raise ConfigError(f"strategy {row.text!r} needs {', '.join(missing_pkgs)}")
    verdicts, recorded, row_notes = _fit_to_device(cfg, device, caps, device_facts(device), unsupported)
    _check_ranks(cfg, device, unsupported)
    out = Path(cfg.out)
    check_ours(out, cfg.force)
    Store.check(out / STORE, "--out")  # resuming: a damaged or newer store is refused before any write
    if cfg.task == IMAGE_TASK:
        prepared = _prepare_images(cfg, device, unsupported, out)
        return dataclasses.replace(prepared, verdicts=verdicts, recorded=recorded, row_notes=row_notes)
    source = resolve_model(cfg.model, cfg.model_preset, cfg.task, (cfg.max_length, cfg.max_target_length))
    _check_plans_apply(source, cfg, unsupported)

    dataset = cfg.dataset or (None if cfg.train_file else DEFAULT_DATASET[cfg.task])
    data = read_task_data(
        cfg.task,
        dataset,
        cfg.train_file,
        cfg.eval_file,
        cfg.text_column,
        cfg.target_column,
        cfg.max_train_samples,
        cfg.prompt_column,
        cfg.response_column,
        cfg.messages_column,
    )
    if cfg.task == CAUSAL_LM and source.kind != "preset":
        check_eos(source)
    check_metric_packages(cfg, data.data_format)
    train, evals, labels = data.train, data.evals, data.labels
    notes = [f"trainwise: data: {note}" for note in data.notes()]  # rows not used: said, never silent
    n_train = len(train)  # training samples; raw text is cut into blocks once the tokenizer is known
    if data.data_format == "chat":  # conversations are rendered here, once, so a template that fails says so now
        n_train, chat = chat_samples(source, train, evals[: cfg.eval_samples], cfg.max_length)
        notes += [f"trainwise: data: {note}" for note in chat]
    if cfg.task == "classification" and (note := head_note(source, len(labels))):
        notes.insert(0, f"trainwise: note: {note}")
    if source.kind == "dir" and (Path(source.ref) / gguf.SOURCE_FILE).is_file():  # SmolLM2 from its 4-bit GGUF
        notes.insert(0, f"trainwise: note: {gguf.QUANTIZED_NOTE}")
    for note in notes:
        on_note(note)
    largest = max(c.batch_size for c in cfg.cells())
    if n_train < largest:
        unit = "conversations kept" if data.data_format == "chat" else "rows"
        raise ConfigError(f"the training data has {n_train} {unit}, fewer than the batch size {largest}")

    # Everything the user gave is valid: from here on files are written.
    existed = out.exists()
    data_dir = out / "data"
    with writing(data_dir):
        data_dir.mkdir(parents=True, exist_ok=True)
    mark(out)
    fingerprint = _fingerprint(train, evals)
    write_data(out, labels, DataOrigin.of(cfg, data), train, evals)
    tokenizer_dir = None
    if source.kind == "preset":
        tok_path = out / "tokenizer"
        stamp = tok_path / "trainwise-data.txt"
        if not stamp.exists() or stamp.read_text() != f"{source.ref} {fingerprint}":
            with writing(tok_path):  # the stamp last: a tokenizer cut short is trained again
                stamp.unlink(missing_ok=True)
                train_tokenizer(tokenizer_corpus(train), source.ref, tok_path)
            write_atomic(stamp, f"{source.ref} {fingerprint}")
        tokenizer_dir = str(tok_path.resolve())
    try:  # what only the tokenized data can tell; a refused new study leaves no directory behind
        if data.data_format == "prompt_response":
            from trainwise.training.data.tasks import pair_notes  # heavy: trainwise.training.data.tasks loads torch

            tokenizer = load_tokenizer(source, tokenizer_dir)
            cut = cfg.truncation
            held_out = pair_notes(evals[: cfg.eval_samples], tokenizer, cfg.max_length, "held-out", cut)
            trained = pair_notes(train, tokenizer, cfg.max_length, truncation=cut)
            cuts = [f"trainwise: data: {note}" for note in trained + held_out]
            for note in cuts:  # after the notes above: a preset's tokenizer is trained only now
                on_note(note)
            notes += cuts
        if data.data_format == "text":
            n_train = lm_samples(source, tokenizer_dir, train, cfg.max_length, "text", truncation=cfg.truncation)
            if n_train < largest:
                raise ConfigError(
                    f"the training text makes {n_train} blocks of --max-length {cfg.max_length} tokens, fewer than "
                    f"the batch size {largest}"
                )
        viewed = [r for r in cfg.rows if strategies.runtime(r.plan, cfg.task, "cpu").data_view is not None]
        if cfg.task == CAUSAL_LM and viewed:  # rows of packed examples: enough of them for a batch
            packed = lm_samples(
                source, tokenizer_dir, train, cfg.max_length, data.data_format, packed=True, truncation=cfg.truncation
            )
            if packed < largest:
                raise ConfigError(
                    f"{viewed[0].text}: the training examples fill {packed} rows of --max-length {cfg.max_length} "
                    f"tokens, fewer than the batch size {largest}; lower --batch-size or --max-length, or give more "
                    "data"
                )
    except ConfigError:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise

    settings = _settings(cfg, device, source, tokenizer_dir, data_dir, len(labels), n_train, data.data_format)
    prepared = _specs(cfg, settings, fingerprint, unsupported, out)
    return dataclasses.replace(
        prepared, verdicts=verdicts, recorded=recorded, row_notes=row_notes, n_eval=len(evals), notes=tuple(notes)
    )


def check_metric_packages(cfg: StudyConfig, data_format: str) -> None:
    """Generated text is scored with ROUGE and BLEU (seq2seq, and a causal LM's prompt/response or chat data): where
    their packages cannot be imported, every evaluated trial would fail on the import one by one, so the study
    says so once, before any (an H200 whose image lacked rouge-score failed every prompt/response trial so)."""
    scores_text = cfg.task == "seq2seq" or (cfg.task == CAUSAL_LM and data_format in ("prompt_response", "chat"))
    if not scores_text or cfg.eval_samples == 0 or not (missing := missing_text_metric_packages()):
        return
    raise ConfigError(
        f"evaluating {cfg.task} scores generated text with ROUGE and BLEU, and {', '.join(missing)} cannot be "
        f"imported here: pip install {' '.join(missing)}, or pass --eval-samples 0 (no evaluation)"
    )


def check_eos(source: ModelSource) -> None:
    """A causal LM's tokenizer must end a text with EOS (trainwise appends it to every response and document)."""
    try:
        tokenizer = load_tokenizer(source, None)
    except Exception as e:  # a directory or hub id whose tokenizer files do not load
        raise ConfigError(f"cannot load the tokenizer of {source.display()}: {str(e).splitlines()[0][:160]}") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{source.display()}'s tokenizer has no EOS token; causal-lm ends every text with one")


def chat_samples(source: ModelSource, train: list[dict], evals: list[dict], max_length: int) -> tuple[int, list[str]]:
    """Chat data rendered with the model's chat template, as the trials will: how many training conversations
    keep an assistant token within max_length, and what cutting there did (a note per split). A tokenizer
    without a template, or a template that cannot be labelled prefix by prefix, is a ConfigError."""
    # a size preset's tokenizer is trained on the data: it has no template
    tokenizer = None if source.kind == "preset" else load_tokenizer(source, None)
    check_chat_template(tokenizer, source.display())
    train_enc, eval_enc = encode_chat(train, tokenizer, max_length), encode_chat(evals, tokenizer, max_length)
    if not train_enc.input_ids:
        raise ConfigError(
            f"no training conversation keeps an assistant token within --max-length {max_length}: raise it"
        )
    notes = chat_notes(train_enc, len(train), "training", max_length)
    return len(train_enc.input_ids), notes + chat_notes(eval_enc, len(evals), "held-out", max_length)


def lm_samples(
    source: ModelSource,
    tokenizer_dir: str | None,
    train: list[dict],
    max_length: int,
    data_format: str,
    packed: bool = False,
    truncation: str = "",
) -> int:
    """A causal LM's training samples: raw text's blocks of max_length tokens, or the examples (under TRL's
    `truncation`, each document one), or (packed) the rows of max_length tokens they fill."""
    from trainwise.strategies.lm.packing import pack  # heavy: trainwise.strategies.lm.packing loads torch
    from trainwise.training.data.tasks import encode_lm  # heavy: trainwise.training.data.tasks loads torch

    enc = encode_lm(train, load_tokenizer(source, tokenizer_dir), data_format, max_length, truncation, packed)
    return len(pack(enc.lengths(), max_length)) if packed else len(enc)


def _settings(
    cfg: StudyConfig,
    device: str,
    source,
    tokenizer_dir,
    data_dir: Path,
    n_labels: int,
    n_train: int,
    data_format: str = "",
):
    assert cfg.lr is not None, "StudyConfig resolves the task's default"
    resolved = {
        "model_kind": source.kind,
        "model_ref": source.ref,
        "model_label": source.display(),
        "tokenizer_dir": tokenizer_dir,
        "data_dir": str(data_dir.resolve()),
        "num_labels": n_labels,
        "device": device,
        "n_train": n_train,
        "nnodes": cfg.nodes_per_trial,
        "data_format": data_format,
    }
    return TrialSettings(**resolved, **shared_settings(cfg, exclude=resolved))


def shared_settings(cfg: StudyConfig, exclude=()) -> dict:
    """The trial settings a study's config declares under the same name, copied by name: an option a trial child
    reads is declared once on StudyConfig and read as a TrialSettings field of its name (the study's stored keys
    are made from these settings, so the child's view stays one flat, serialisable record)."""
    names = {f.name for f in dataclasses.fields(StudyConfig)}
    return {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(TrialSettings)
        if f.name in names and f.name not in exclude and f.name not in STUDY_ONLY
    }


# TrialSettings fields a study's config also declares, but whose trial value is not the config's: set per cell
STUDY_ONLY = frozenset({"num_workers"})


def _specs(cfg: StudyConfig, settings, fingerprint: str, unsupported: dict[str, str], out: Path) -> PreparedStudy:
    cells = cfg.cells()
    specs = [
        TrialSpec(
            c.row.text,
            rep,
            c.row.plan,
            dataclasses.replace(
                settings,
                batch_size=c.batch_size,
                num_workers=c.workers,
                seed=settings.seed + rep if cfg.seed_per_repeat else settings.seed,
            ),
            {"data": fingerprint},
            steps=cfg.max_steps,
        )
        for rep in range(cfg.repeat)  # repeats interleaved: drift on a shared machine hits every row alike
        for c in cells
    ]
    base = next((c for c in cells if c.row.is_baseline), None)
    if cfg.repeat == 1 and cfg.remeasure and base is not None and len(cells) > 1:
        # the reference again, as the last trial: with one repeat the study still measures its noise floor
        # (run-to-run, which the step-to-step spread misses) and sees the machine drift between first and last
        base_settings = dataclasses.replace(settings, batch_size=base.batch_size, num_workers=base.workers)
        specs.append(
            TrialSpec(base.row.text, 1, base.row.plan, base_settings, {"data": fingerprint}, steps=cfg.max_steps)
        )
    return PreparedStudy(cfg, out, specs, cells, unsupported)


def _prepare_images(cfg: StudyConfig, device: str, unsupported: dict[str, str], out: Path) -> PreparedStudy:
    """image-classification: a project ResNeXt preset on digits, CIFAR-10 or image folders."""
    # heavy: trainwise.training.vision loads torch
    from trainwise.training.vision import (
        VISION_PRESETS,
        load_image_data,
        save_images,
    )

    preset = cfg.model_preset or "resnext-tiny"
    if cfg.model is not None or preset not in VISION_PRESETS:
        raise ConfigError(
            f"image-classification trains the project's ResNeXt: --model-preset one of {', '.join(VISION_PRESETS)}"
        )
    train, evals, names = load_image_data(cfg.dataset, cfg.train_file, cfg.eval_file, cfg.image_size)
    order = np.random.default_rng(1234).permutation(len(train))  # a fixed shuffle, like the text path
    if cfg.max_train_samples:
        order = order[: cfg.max_train_samples]
    train = type(train)(train.x[order], train.y[order])
    largest = max(c.batch_size for c in cfg.cells())
    if len(train) < largest:
        raise ConfigError(f"the training data has {len(train)} images, fewer than the batch size {largest}")
    data_dir = out / "data"
    images, tmp = data_dir / "images.npz", data_dir / ".images.tmp.npz"
    with writing(images, tmp):
        data_dir.mkdir(parents=True, exist_ok=True)
        save_images(tmp, train, evals)
        tmp.replace(images)
    mark(out)
    write_data(out, names, DataOrigin.of(cfg))
    h = hashlib.sha256()
    for a in (train.x, train.y, evals.x, evals.y):
        h.update(np.ascontiguousarray(a).tobytes())
    source = ModelSource("preset", preset)
    settings = _settings(cfg, device, source, None, data_dir, len(names), len(train))
    return dataclasses.replace(_specs(cfg, settings, h.hexdigest()[:16], unsupported, out), n_eval=len(evals.y))


def _check_ranks(cfg: StudyConfig, device: str, unsupported: dict[str, str]) -> None:
    """--nproc: enough devices, and every micro-batch splits evenly over the ranks."""
    if cfg.nproc > 1 and device == "cuda":
        import torch  # heavy: torch

        count = torch.cuda.device_count()
        if cfg.nproc > count:
            raise ConfigError(f"--nproc {cfg.nproc} needs {cfg.nproc} CUDA devices; this machine has {count}")
    for c in cfg.cells():
        if c.row.text in unsupported:
            continue
        accum = strategies.runtime(c.row.plan, cfg.task, device).accum_steps
        micro, world = c.batch_size // accum, cfg.nproc * cfg.nodes_per_trial
        if micro % world:
            over = (
                f"--nproc {cfg.nproc} ranks"
                if cfg.nodes_per_trial == 1
                else f"{world} ranks on {cfg.nodes_per_trial} nodes"
            )
            raise ConfigError(
                f"{c.row.text!r} at batch size {c.batch_size}: each micro-batch of {micro} must split evenly over "
                f"{over}; use a batch size that is a multiple of {accum * world}"
            )


def _check_plans_apply(source, cfg: StudyConfig, unsupported: dict[str, str]) -> None:
    """Every row's model edits (checkpointing, freezing, LoRA) apply to this model: tried on the meta
    device, so a row that cannot (LoRA on a model peft cannot target) is bad input, not a failed trial."""
    config: list = []  # the model's config, read once, when a row has edits
    for row in cfg.rows:
        if row.text not in unsupported:
            check_plan_applies(source, cfg.task, row, config)


def check_plan_applies(source: ModelSource, task: str, row: Row, config: list | None = None) -> None:
    """The row's model edits apply to this model (tried on the meta device): a ConfigError naming the row where one
    cannot (LoRA on a model peft cannot target; packed or padding-free rows on a family whose examples would see
    each other). `config`: a one-item cache of the model's config."""
    from trainwise.training.loop import apply_plan  # heavy: trainwise.training.loop loads torch and transformers

    rt = strategies.runtime(row.plan, task, "cpu")
    if not rt.model_edits:
        return
    cache = config if config is not None else []
    if not cache:
        cache.append(model_config(source, task, 2))
    try:
        apply_plan(meta_model(cache[0], task, **rt.model_kwargs), rt)
    except ValueError as e:
        raise ConfigError(f"{row.text!r}: {e}") from None
