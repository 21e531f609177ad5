"""Load (train, eval) rows of {"text", "target"} from a built-in corpus, a file or a HF dataset.

Every failure here is a `ConfigError` with one line that names the file, column or dataset. A row
that cannot be used (an empty text, a record without the target key) is skipped and counted, never
dropped silently: `Skipped` says how many of a file's rows, why, and where the first of each was.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from trainwise.core.errors import ConfigError
from trainwise.training.data.builtin import BUILTIN_DATASETS, _is_eval, load_builtin
from trainwise.training.data.chat import MESSAGES, conversation_text, read_conversation
from trainwise.training.models import check_hub_reachable

Rows = list[dict[str, str]]
FILE_SUFFIXES = (".csv", ".json", ".jsonl")
SKIP_LIMIT = 0.05  # a file with more than this share of its rows unusable is refused, not trained on


@dataclass(frozen=True)
class Skip:
    """The rows skipped for one reason: how many, and where the first was (1-based, in `Skipped.unit`s)."""

    rows: int
    first: int


@dataclass(frozen=True)
class Skipped:
    """What reading one data file (or dataset split) kept and left out, by reason."""

    file: str  # as the user named it
    read: int  # rows read (a CSV's header is no row)
    kept: int
    reasons: dict[str, Skip]  # "empty 'text'", "no 'target' key" -> its rows and first place
    unit: str = "line"  # what `Skip.first` counts: a file's "line" (a CSV's header is line 1), a JSON "record"

    @property
    def count(self) -> int:
        return self.read - self.kept

    def main(self) -> tuple[str, Skip]:
        """The reason most rows were skipped for."""
        return max(self.reasons.items(), key=lambda kv: (kv[1].rows, -kv[1].first))

    def why(self) -> str:
        """`1 empty 'text', first at line 17; 2 no 'target' key, first at line 40`."""
        ranked = sorted(self.reasons.items(), key=lambda kv: (-kv[1].rows, kv[1].first))
        return "; ".join(f"{s.rows} {reason}, first at {self.unit} {s.first}" for reason, s in ranked)

    def line(self) -> str:
        """The note a study prints when rows were skipped: `skipped 1 of 300 rows of train.csv (...)`."""
        return f"skipped {self.count} of {self.read} rows of {self.file} ({self.why()})"

    @classmethod
    def from_dict(cls, d: dict) -> Skipped:
        return cls(d["file"], d["read"], d["kept"], {k: Skip(**v) for k, v in d["reasons"].items()}, d["unit"])

    def check(self, flags: str = "--text-column/--target-column") -> None:
        """More than SKIP_LIMIT of the rows unusable is the wrong column or a broken file: one line, exit 2.
        `flags`: the options that chose the columns read."""
        if self.count > SKIP_LIMIT * self.read:
            reason, first = self.main()
            raise ConfigError(
                f"{self.file}: {self.count} of {self.read} rows ({self.count / self.read:.1%}) cannot be used, "
                f"more than the {SKIP_LIMIT:.0%} trainwise skips: {first.rows} {reason}, first at {self.unit} "
                f"{first.first}; fix those rows or choose {flags}"
            )


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


def _records(path: Path) -> tuple[list[dict], list[int], str]:
    """The file's records, the place of each (its first line; a JSON array's record number) and its unit."""
    if not path.exists():
        raise ConfigError(f"data file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"data file is not a regular file: {path}")
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    text = _read_text(path)
    if suffix == ".jsonl":
        records, lines = _jsonl(path, text)
        return records, lines, "line"
    try:
        if suffix == ".csv":
            records, lines = _csv(text)
            return records, lines, "line"
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
    return data, list(range(1, len(data) + 1)), "record"


def _csv(text: str) -> tuple[list[dict], list[int]]:
    """`csv.DictReader`'s records (blank lines left out, a short row's missing fields None) and the line
    each starts on: a quoted field may span lines, so the count is the reader's, not the records'."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    records: list[dict] = []
    lines: list[int] = []
    start = reader.line_num + 1
    for row in reader:
        if row:
            record: dict = {name: row[i] if i < len(row) else None for i, name in enumerate(header or [])}
            if len(row) > len(header or []):
                record[_EXTRA] = True  # an unquoted comma, usually: the fields after it are shifted
            records.append(record)
            lines.append(start)
        start = reader.line_num + 1
    return records, lines


def _jsonl(path: Path, text: str) -> tuple[list[dict], list[int]]:
    """One JSON object per line; an error names the file's own line number."""
    records, lines = [], []
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
        lines.append(number)
    return records, lines


_EXTRA = "\0more fields"  # a CSV record with more fields than its header


@dataclass(frozen=True)
class Columns:
    """Which columns of a file a task reads, and the options that named them: the input text (stored as
    "text") and, unless the task reads text alone (causal-lm's raw text), the target (stored as "target").
    `chat`: the text column holds conversations (trainwise.training.data.chat), stored as canonical JSON text.
    `detect_chat`: no column was named; data with no text column but a 'messages' one is read as chat."""

    text: str = "text"
    target: str | None = "target"
    text_flag: str = "--text-column"
    target_flag: str = "--target-column"
    chat: bool = False
    detect_chat: bool = False

    def resolved(self, available: list[str]) -> Columns:
        """The columns read from data whose columns are `available` (the chat detection done)."""
        if self.detect_chat and self.text not in available and MESSAGES in available:
            return CHAT
        return self

    def named(self) -> list[tuple[str, str]]:
        """(option, column) of every column read."""
        return [(self.text_flag, self.text)] + ([(self.target_flag, self.target)] if self.target is not None else [])

    def flags(self) -> str:
        return "/".join(flag for flag, _ in self.named())


def _row(record: dict, columns: Columns) -> dict[str, str] | str:
    """A record as a row, or why it cannot be one: more CSV fields than the header (its columns would be
    shifted), a missing key, an empty or blank value, or a conversation that is not one."""
    if record.get(_EXTRA):
        return "more fields than the header"
    for _flag, col in columns.named():
        if col not in record:
            return f"no {col!r} key"
        if record[col] is None or not str(record[col]).strip():
            return f"empty {col!r}"
    if columns.chat:
        conversation = read_conversation(record[columns.text], columns.text)
        if isinstance(conversation, str):
            return conversation
        return {"text": conversation_text(conversation), "target": ""}
    target = "" if columns.target is None else str(record[columns.target])
    return {"text": str(record[columns.text]), "target": target}


def _columns(records: list[dict], places: list[int], unit: str, path: Path, columns: Columns) -> tuple[Rows, Skipped]:
    if records and not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"{path}: every record must be an object with named columns")
    available = _available(records)
    for flag, col in columns.named():
        if records and col not in available:
            raise ConfigError(f"{path}: no column {col!r} ({flag}); columns are: {', '.join(map(str, available))}")
    rows: Rows = []
    reasons: dict[str, Skip] = {}
    for record, place in zip(records, places, strict=True):
        row = _row(record, columns)
        if isinstance(row, dict):
            rows.append(row)
        else:
            reason = row
            seen = reasons.get(reason)
            reasons[reason] = Skip(seen.rows + 1, seen.first) if seen else Skip(1, place)
    why = Skipped(str(path), len(records), 0, reasons, unit).why()
    if not rows and columns.chat and reasons:  # conversations, none usable: the reasons say why
        raise ConfigError(f"{path}: no usable conversations in {columns.text!r}: {why}")
    if not rows:
        why = f": {why}" if reasons else ""
        named = "/".join(repr(col) for _flag, col in columns.named())
        raise ConfigError(f"{path}: no usable rows (empty file, or {named} all empty){why}")
    skipped = Skipped(str(path), len(records), len(rows), reasons, unit)
    skipped.check(columns.flags())
    return rows, skipped


def _available(records: list) -> list[str]:
    """The columns of a table's records (every key any record has)."""
    return sorted({k for r in records if isinstance(r, dict) for k in r})


def hub_name(dataset: str) -> tuple[str, str | None]:
    """`--dataset NAME[:CONFIG]`: a hub dataset and its configuration (`wmt14:de-en`, `glue:sst2`); a local
    directory (saved by `datasets`' save_to_disk) is a name of its own, colons and all."""
    if Path(dataset).is_dir() or ":" not in dataset:
        return dataset, None
    name, _, config = dataset.rpartition(":")
    if not name or not config:
        raise ConfigError(f"--dataset {dataset!r}: expected NAME or NAME:CONFIG (e.g. glue:sst2)")
    return name, config


def _load_hub(dataset: str, columns: Columns) -> tuple[Rows, Rows, tuple[Skipped, ...], Columns]:
    name, _config = hub_name(dataset)
    ds = open_hub(dataset)
    split_train = list(ds["train"] if "train" in ds else ds[next(iter(ds))])
    columns = columns.resolved(_available(split_train))
    train, read = _split_rows(split_train, name, columns)
    eval_split = next((ds[s] for s in ("validation", "test") if s in ds), None)
    if eval_split is None:
        held_out = [r for r in train if _is_eval(r["text"])]
        return [r for r in train if not _is_eval(r["text"])], held_out, (read,), columns
    evals, eval_read = _split_rows(list(eval_split), name, columns)
    return train, evals, (read, eval_read), columns


def hub_columns(dataset: str) -> list[str]:
    """The columns of a dataset `--dataset` would load (its training split's), or one ConfigError line."""
    ds = open_hub(dataset)
    return list((ds["train"] if "train" in ds else ds[next(iter(ds))]).column_names)


def open_hub(dataset: str):
    """The splits of `--dataset NAME[:CONFIG]`: a hub dataset (the local Hugging Face cache offline), a directory
    `save_to_disk` wrote, or a directory of CSV / JSON / parquet files; a failure is one ConfigError line."""
    name, config = hub_name(dataset)
    try:
        import datasets  # optional extra: pip install 'trainwise[hub]'
    except ImportError:
        raise ConfigError(
            f"dataset {name!r} is not built in ({', '.join(BUILTIN_DATASETS)}); loading hub datasets "
            "needs the 'datasets' package: pip install 'trainwise[hub]'"
        ) from None
    # a directory `save_to_disk` wrote (its own files say so); any other directory (CSV / JSON / parquet files, a
    # cloned dataset repository) is read by load_dataset as before
    local = Path(name).is_dir() and any((Path(name) / f).is_file() for f in ("dataset_dict.json", "state.json"))
    offline = "1" in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE"))
    if not Path(name).is_dir() and not offline:
        check_hub_reachable(name, "dataset")  # one line now, not a minute of retries
    try:
        ds = datasets.load_from_disk(name) if local else datasets.load_dataset(name, config)
    except Exception as e:  # offline, unknown name or configuration, auth: all the same to the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        instead = (
            "offline, pass a local copy instead: a directory saved by datasets' save_to_disk (--dataset DIR) or "
            f"its rows as a CSV or JSON file (--train-file); built-in: {', '.join(BUILTIN_DATASETS)}"
            if offline and not local
            else f"built-in offline datasets: {', '.join(BUILTIN_DATASETS)}, or use --train-file"
        )
        raise ConfigError(f"cannot load dataset {dataset!r} ({first[:160]}); {instead}") from None
    if isinstance(ds, datasets.Dataset):  # save_to_disk of one split: the training rows
        ds = {"train": ds}
    return ds


def _split_rows(records: list, name: str, columns: Columns) -> tuple[Rows, Skipped]:
    return _columns(records, list(range(1, len(records) + 1)), "row", Path(name), columns)


def task_columns(
    task: str,
    text_column: str | None,
    target_column: str | None,
    prompt_column: str | None = None,
    response_column: str | None = None,
    messages_column: str | None = None,
) -> Columns:
    """The columns a task reads. causal-lm: chat transcripts when the messages column is named, prompt/response
    data when either of those columns is (the prompt is stored as "text", the response as "target"), otherwise
    raw text (one column), or chat when no column is named and the data has 'messages' but no 'text'."""
    if task == "causal-lm":
        if messages_column is not None:
            return Columns(messages_column, None, "--messages-column", chat=True)
        if prompt_column is not None or response_column is not None:
            return Columns(
                prompt_column or "prompt", response_column or "response", "--prompt-column", "--response-column"
            )
        return Columns(text_column or "text", None, detect_chat=text_column is None)
    return Columns(text_column or "text", target_column or "target")


CHAT = Columns(MESSAGES, None, "--messages-column", chat=True)  # what detect_chat finds


def load_rows(
    dataset: str | None,
    train_file: str | None,
    eval_file: str | None,
    text_column: str | None,
    target_column: str | None,
    columns: Columns | None = None,
) -> tuple[Rows, Rows, tuple[Skipped, ...]]:
    """Resolve the user's data choice into (train, eval) rows, eval a 10% hold-out by default, and what
    reading each file (or dataset split) skipped; nothing for a built-in corpus. `columns`: what the task
    reads (task_columns), by default the text and target columns."""
    columns = columns or Columns(text_column or "text", target_column or "target")
    return _load(dataset, train_file, eval_file, columns)[:3]


def _load(
    dataset: str | None, train_file: str | None, eval_file: str | None, columns: Columns
) -> tuple[Rows, Rows, tuple[Skipped, ...], Columns]:
    """load_rows, and the columns read (`columns` resolved on the training data: chat detected or not)."""
    if dataset in BUILTIN_DATASETS:
        return (*load_builtin(dataset), (), columns)
    if dataset:
        return _load_hub(dataset, columns)
    assert train_file, "StudyConfig guarantees a dataset or a train file"
    train_path = Path(train_file)
    records, places, unit = _records(train_path)
    columns = columns.resolved(_available(records))
    train, read = _columns(records, places, unit, train_path, columns)
    if eval_file:
        eval_path = Path(eval_file)
        evals, eval_read = _columns(*_records(eval_path), eval_path, columns)
        return train, evals, (read, eval_read), columns
    held_out = [r for r in train if _is_eval(r["text"])]
    if not held_out or len(held_out) == len(train):
        return train, train[: max(1, len(train) // 10)], (read,), columns
    return [r for r in train if not _is_eval(r["text"])], held_out, (read,), columns


def data_source(dataset: str | None, train_file: str | None) -> str:
    """What a study's rows were read from, in one word: `builtin:stdlib-topic`, `hub:NAME`, `file:/abs/t.csv`."""
    if train_file:
        return f"file:{Path(train_file).resolve()}"
    if dataset in BUILTIN_DATASETS:
        return f"builtin:{dataset}"
    return f"disk:{Path(dataset).resolve()}" if dataset and Path(dataset).is_dir() else f"hub:{dataset}"


@dataclass(frozen=True)
class TaskData:
    """A text task's rows as every verb reads them, and what reading them left out."""

    train: Rows
    evals: Rows
    labels: list[str]  # the classes; [] for seq2seq
    source: str  # see data_source
    reads: tuple[Skipped, ...]  # one per file or split read: the train file first
    not_evaluated: int = 0  # held-out rows of a class no training row has: a classifier cannot score them
    data_format: str = ""  # causal-lm: "text", "prompt_response" or "chat" (TrialSettings.data_format)

    def notes(self) -> list[str]:
        return skip_notes(self.reads, self.not_evaluated)


def skip_notes(reads: tuple[Skipped, ...], not_evaluated: int) -> list[str]:
    """What reading left out, one line each, for a study to print after `trainwise: data: `: a line per
    file that had rows skipped, and one for held-out rows left unscored."""
    lines = [read.line() for read in reads if read.count]
    if not_evaluated:
        lines.append(f"{not_evaluated} held-out rows not evaluated: their class is in none of the training rows")
    return lines


def read_task_data(
    task: str,
    dataset: str | None,
    train_file: str | None,
    eval_file: str | None,
    text_column: str | None,
    target_column: str | None,
    max_train_samples: int | None = None,
    prompt_column: str | None = None,
    response_column: str | None = None,
    messages_column: str | None = None,
) -> TaskData:
    """The user's rows for a text task, checked the one way compare, train and estimate all read them.
    A fixed shuffle (files and corpora come grouped: the stdlib corpus by module, and eval and
    --max-train-samples take prefixes); eval rows of unseen classes left out, and counted."""

    if dataset in BUILTIN_DATASETS and BUILTIN_DATASETS[dataset] != task:
        raise ConfigError(f"dataset {dataset!r} is a {BUILTIN_DATASETS[dataset]} dataset, not {task}")
    columns = task_columns(task, text_column, target_column, prompt_column, response_column, messages_column)
    if dataset in BUILTIN_DATASETS and messages_column is not None:
        raise ConfigError(f"--messages-column reads a file or a HF dataset; the built-in {dataset!r} is not chat data")
    train, evals, reads, columns = _load(dataset, train_file, eval_file, columns)
    source = data_source(dataset, train_file)
    random.Random(1234).shuffle(train)
    random.Random(4321).shuffle(evals)
    if max_train_samples:
        train = train[:max_train_samples]
    if task == "causal-lm":  # a built-in corpus is prompt/response data
        prompted = columns.target is not None or dataset in BUILTIN_DATASETS
        data_format = "chat" if columns.chat else "prompt_response" if prompted else "text"
        return TaskData(train, evals, [], source, reads, data_format=data_format)
    if task != "classification":
        return TaskData(train, evals, [], source, reads)
    labels = sorted({r["target"] for r in train})
    if len(labels) < 2:
        raise ConfigError(f"classification needs at least 2 distinct targets, found {len(labels)}")
    if len(labels) > 1000:
        raise ConfigError(f"{len(labels)} distinct targets: is --target-column a class label?")
    scored = [r for r in evals if r["target"] in set(labels)]
    return TaskData(train, scored, labels, source, reads, len(evals) - len(scored))


def tokenizer_corpus(train: Rows) -> list[str]:
    """What a size preset's tokenizer is trained on: the training rows' texts and targets."""
    return [t for r in train for t in (r["text"], r["target"]) if t]
