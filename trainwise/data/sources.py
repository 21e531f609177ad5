"""Load (train, eval) rows of {"text", "target"} from a built-in corpus, a file or a HF dataset.

Every failure here is a `ConfigError` with one line that names the file, column or dataset.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from trainwise.data.builtin import BUILTIN_DATASETS, _is_eval, load_builtin
from trainwise.errors import ConfigError

Rows = list[dict[str, str]]
FILE_SUFFIXES = (".csv", ".json", ".jsonl")


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read data file {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); re-save it as UTF-8"
        ) from None
    if "\0" in text:
        raise ConfigError(f"{path} is not text (a NUL byte at offset {raw.index(0)}): is it a binary file?")
    return text


def _records(path: Path) -> list[dict]:
    if not path.exists():
        raise ConfigError(f"data file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"data file is not a regular file: {path}")
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    text = _read_text(path)
    if suffix == ".jsonl":
        return _jsonl(path, text)
    try:
        if suffix == ".csv":
            return list(csv.DictReader(io.StringIO(text)))
        data = json.loads(text) if text.strip() else []
    except (json.JSONDecodeError, csv.Error) as e:
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a table of records") from None
    if isinstance(data, dict):  # {"data": [...]} or {"train": [...]}: take the single list value
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise ConfigError(f"{path}: expected a list of objects, or an object holding one list")
        data = lists[0]
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of objects")
    return data


def _jsonl(path: Path, text: str) -> list[dict]:
    """One JSON object per line; an error names the file's own line number."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno})") from None
        except RecursionError:
            raise ConfigError(f"{path} line {number}: nested too deeply to be a record") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path} line {number}: every record must be an object with named columns")
        records.append(record)
    return records


def _columns(records: list[dict], path: Path, text_col: str, target_col: str) -> Rows:
    if records and not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"{path}: every record must be an object with named columns")
    available = sorted({k for r in records for k in r}) if records else []
    for flag, col in (("--text-column", text_col), ("--target-column", target_col)):
        if records and col not in available:
            raise ConfigError(f"{path}: no column {col!r} ({flag}); columns are: {', '.join(map(str, available))}")
    rows = [
        {"text": str(r[text_col]), "target": str(r[target_col])}
        for r in records
        if r.get(text_col) not in (None, "") and r.get(target_col) not in (None, "")
    ]
    if not rows:
        raise ConfigError(f"{path}: no usable rows (empty file, or {text_col!r}/{target_col!r} all empty)")
    return rows


def _load_hub(name: str, text_col: str, target_col: str) -> tuple[Rows, Rows]:
    try:
        import datasets  # optional extra: pip install 'trainwise[hub]'
    except ImportError:
        raise ConfigError(
            f"dataset {name!r} is not built in ({', '.join(BUILTIN_DATASETS)}); loading hub datasets "
            "needs the 'datasets' package: pip install 'trainwise[hub]'"
        ) from None
    if "1" not in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")):
        from trainwise.models import check_hub_reachable

        check_hub_reachable(name, "dataset")  # one line now, not a minute of retries
    try:
        ds = datasets.load_dataset(name)
    except Exception as e:  # offline, unknown name, auth: all the same to the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"cannot load dataset {name!r} ({first[:160]}); built-in offline datasets: "
            f"{', '.join(BUILTIN_DATASETS)}, or use --train-file"
        ) from None
    split_train = ds["train"] if "train" in ds else ds[next(iter(ds))]
    train = _columns(list(split_train), Path(name), text_col, target_col)
    eval_split = next((ds[s] for s in ("validation", "test") if s in ds), None)
    if eval_split is None:
        return [r for r in train if not _is_eval(r["text"])], [r for r in train if _is_eval(r["text"])]
    return train, _columns(list(eval_split), Path(name), text_col, target_col)


def load_rows(
    dataset: str | None,
    train_file: str | None,
    eval_file: str | None,
    text_column: str | None,
    target_column: str | None,
) -> tuple[Rows, Rows]:
    """Resolve the user's data choice into (train, eval) rows; eval defaults to a 10% hold-out."""
    if dataset in BUILTIN_DATASETS:
        return load_builtin(dataset)
    text_col, target_col = text_column or "text", target_column or "target"
    if dataset:
        return _load_hub(dataset, text_col, target_col)
    assert train_file, "StudyConfig guarantees a dataset or a train file"
    train_path = Path(train_file)
    train = _columns(_records(train_path), train_path, text_col, target_col)
    if eval_file:
        eval_path = Path(eval_file)
        return train, _columns(_records(eval_path), eval_path, text_col, target_col)
    held_out = [r for r in train if _is_eval(r["text"])]
    if not held_out or len(held_out) == len(train):
        return train, train[: max(1, len(train) // 10)]
    return [r for r in train if not _is_eval(r["text"])], held_out


def read_task_rows(
    task: str,
    dataset: str | None,
    train_file: str | None,
    eval_file: str | None,
    text_column: str | None,
    target_column: str | None,
    max_train_samples: int | None = None,
) -> tuple[Rows, Rows, list[str]]:
    """The user's rows for a text task, checked the one way compare, train and estimate all read them:
    (train, eval, the classes; [] for seq2seq). A fixed shuffle (files and corpora come grouped: the stdlib
    corpus by module, and eval and --max-train-samples take prefixes); eval rows of unseen classes dropped."""
    import random

    if dataset in BUILTIN_DATASETS and BUILTIN_DATASETS[dataset] != task:
        raise ConfigError(f"dataset {dataset!r} is a {BUILTIN_DATASETS[dataset]} dataset, not {task}")
    train, evals = load_rows(dataset, train_file, eval_file, text_column, target_column)
    random.Random(1234).shuffle(train)
    random.Random(4321).shuffle(evals)
    if max_train_samples:
        train = train[:max_train_samples]
    if task != "classification":
        return train, evals, []
    labels = sorted({r["target"] for r in train})
    if len(labels) < 2:
        raise ConfigError(f"classification needs at least 2 distinct targets, found {len(labels)}")
    if len(labels) > 1000:
        raise ConfigError(f"{len(labels)} distinct targets: is --target-column a class label?")
    return train, [r for r in evals if r["target"] in set(labels)], labels


def tokenizer_corpus(train: Rows) -> list[str]:
    """What a size preset's tokenizer is trained on: the training rows' texts and targets."""
    return [t for r in train for t in (r["text"], r["target"])]
