"""Data sources, collation and samplers."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch

from tests.conftest import make_rows, write_csv
from trainwise.core.errors import ConfigError
from trainwise.strategies.batching.samplers import LengthGroupedBatches, RandomBatches
from trainwise.study.store import read_rows
from trainwise.training.data.builtin import load_builtin
from trainwise.training.data.sources import load_rows
from trainwise.training.data.tasks import IGNORE_INDEX, Collator


def test_csv_json_jsonl_give_the_same_rows(tmp_path):
    rows = make_rows(40, "classification")
    write_csv(tmp_path / "d.csv", rows)
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    loaded = [
        load_rows(None, str(tmp_path / f"d.{ext}"), None, "text", "target")[:2] for ext in ("csv", "json", "jsonl")
    ]
    assert loaded[0] == loaded[1] == loaded[2]
    train, evals = loaded[0]
    assert len(train) + len(evals) == 40 and evals
    assert not {r["text"] for r in train} & {r["text"] for r in evals}, "hold-out is disjoint"


def test_column_mapping_and_explicit_eval_file(tmp_path):
    rows = [{"dialogue": r["text"], "summary": r["target"]} for r in make_rows(20, "seq2seq")]
    write_csv(tmp_path / "t.csv", rows)
    write_csv(tmp_path / "e.csv", rows[:5])
    train, evals, _ = load_rows(None, str(tmp_path / "t.csv"), str(tmp_path / "e.csv"), "dialogue", "summary")
    assert len(train) == 20 and len(evals) == 5
    assert train[0] == {"text": rows[0]["dialogue"], "target": rows[0]["summary"]}


@pytest.mark.parametrize(
    "content, match",
    [
        (b"text,label\nhello,1\n", "no column 'target'.*columns are: label, text"),
        (b"text,target\n", "no usable rows"),
        (b"", "no usable rows"),
        (b"text,target\ncaf\xe9,1\n", "not UTF-8 text .byte 0xe9 at offset 15"),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path, content, match):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        load_rows(None, str(path), None, None, None)


def _with_holes(tmp_path, n: int, holes: dict[int, dict]):
    """A CSV and a JSONL of n rows where row i (0-based) is replaced by holes[i]."""
    rows = [
        holes.get(i, {"text": r["text"], "target": r["target"]}) for i, r in enumerate(make_rows(n, "classification"))
    ]
    with open(tmp_path / "h.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "target"])
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "h.csv", tmp_path / "h.jsonl"


def test_unusable_rows_count_by_reason_with_their_first_line(tmp_path):
    """Issue 27: an empty text or a record without the target key was dropped silently. Now each file's
    rows read, kept and skipped by reason, with the first line of each (a CSV's header is line 1; a
    quoted text may span lines), come back beside the rows."""
    from trainwise.training.data.sources import Skip, Skipped

    holes = {15: {"text": "", "target": "a"}, 30: {"text": "x"}, 31: {"text": "y"}, 40: {"text": "  ", "target": "b"}}
    rows = make_rows(100, "classification")
    rows[2]["text"] = "a text\nover two lines"  # the CSV's line numbers shift by one after it
    csv_path, jsonl_path = _with_holes(tmp_path, 100, holes)
    train, evals, (read,) = load_rows(None, str(jsonl_path), None, None, None)
    assert read == Skipped(str(jsonl_path), 100, 96, {"empty 'text'": Skip(2, 16), "no 'target' key": Skip(2, 31)})
    assert len(train) + len(evals) == 96
    assert read.line() == (
        f"skipped 4 of 100 rows of {jsonl_path} (2 empty 'text', first at line 16; 2 no 'target' key, first at line 31)"
    )
    write_csv(csv_path, [{"text": r["text"], "target": "" if i == 15 else r["target"]} for i, r in enumerate(rows)])
    *_, (read,) = load_rows(None, str(csv_path), None, None, None)
    assert read.reasons == {"empty 'target'": Skip(1, 18)}, "header line 1, row 0 line 2, a two-line row at 4-5"
    with open(csv_path, "a", encoding="utf-8") as f:
        f.write("an unquoted, comma,other\n")  # its target would be ' comma': skipped, not shifted
    *_, (read,) = load_rows(None, str(csv_path), None, None, None)
    assert read.reasons["more fields than the header"] == Skip(1, 103)
    json_path = tmp_path / "h.json"
    json_path.write_text(json.dumps([*rows[:40], {"text": "z"}]))
    *_, (read,) = load_rows(None, str(json_path), None, None, None)
    assert (read.read, read.kept, read.reasons, read.unit) == (41, 40, {"no 'target' key": Skip(1, 41)}, "record")


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_over_five_percent_unusable_is_one_error(tmp_path, suffix):
    """More than five percent unusable is one error naming the file, the share, the reason and the line."""
    holes = {i: {"text": "", "target": "a"} for i in (7, 8, 9, 50, 60, 70)}  # 6 of 100 rows
    paths = dict(zip(("csv", "jsonl"), _with_holes(tmp_path, 100, holes), strict=True))
    line = 9 if suffix == "csv" else 8
    with pytest.raises(ConfigError) as e:
        load_rows(None, str(paths[suffix]), None, None, None)
    assert str(e.value) == (
        f"{paths[suffix]}: 6 of 100 rows (6.0%) cannot be used, more than the 5% trainwise skips: "
        f"6 empty 'text', first at line {line}; fix those rows or choose --text-column/--target-column"
    )
    five = {i: h for i, h in holes.items() if i != 70}
    load_rows(None, str(_with_holes(tmp_path, 100, five)[0]), None, None, None)  # 5%: skipped and said


def test_the_origin_names_the_corpus_and_round_trips_skips(tmp_path):
    """The data origin names the builtin corpus and round-trips what was skipped."""
    from trainwise.spec.config import StudyConfig
    from trainwise.study.origin import DataOrigin
    from trainwise.training.data.sources import read_task_data

    data = read_task_data("classification", "stdlib-topic", None, None, None, None, max_train_samples=64)
    assert data.source == "builtin:stdlib-topic" and data.reads == ()
    cfg = StudyConfig(out=str(tmp_path), strategies=["baseline"])
    assert DataOrigin.of(cfg, data).source == "builtin:stdlib-topic"
    csv_path, _ = _with_holes(tmp_path, 100, {15: {"text": "", "target": "a"}})
    data = read_task_data("classification", None, str(csv_path), None, None, None)
    origin = DataOrigin.of(dataclasses.replace(cfg, train_file=str(csv_path)), data)
    assert origin.source == f"file:{csv_path.resolve()}"
    stored = json.loads(json.dumps(dataclasses.asdict(origin)))
    assert stored["reads"] == [
        {
            "file": str(csv_path),
            "read": 100,
            "kept": 99,
            "reasons": {"empty 'text'": {"rows": 1, "first": 17}},
            "unit": "line",
        }
    ]
    assert DataOrigin.from_dict(stored) == origin
    assert origin.notes() == [f"skipped 1 of 100 rows of {csv_path} (1 empty 'text', first at line 17)"]
    old = {k: v for k, v in stored.items() if k not in ("source", "reads", "not_evaluated")}
    assert DataOrigin.from_dict(old).notes() == [], "an origin.json from before issue 27 still reads"


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_rows(None, str(tmp_path / "nope.csv"), None, None, None)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_rows(None, str(tmp_path), None, None, None)
    (tmp_path / "x.parquet").write_text("x")
    with pytest.raises(ConfigError, match="unsupported file type"):
        load_rows(None, str(tmp_path / "x.parquet"), None, None, None)


def test_builtin_data_is_real_stdlib_text_with_stable_splits():
    train, evals = load_builtin("stdlib-summarize")
    assert 5000 < len(train) + len(evals) < 9000
    assert 0.05 < len(evals) / (len(train) + len(evals)) < 0.15
    assert all(r["target"] and r["target"] not in r["text"] for r in train[:200]), "docstring removed from source"
    assert any(r["text"].startswith("def ") for r in train)
    again = load_builtin("stdlib-summarize")  # from the cache now
    assert again == (train, evals)
    topic_train, _ = load_builtin("stdlib-topic")
    assert len({r["target"] for r in topic_train}) == 10


def test_collator_padding_modes_and_counts():
    items = [([5, 6, 7], [9, 9]), ([5], [9])]
    long = Collator("seq2seq", 0, "longest", 16, 4)(items)
    assert long.inputs["input_ids"].shape == (2, 3)
    assert long.inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert long.labels.tolist() == [[9, 9], [9, IGNORE_INDEX]]
    assert (long.real_tokens, long.padded_tokens, long.loss_items) == (4 + 3, 6 + 4, 3)
    fixed = Collator("seq2seq", 0, "max_length", 16, 4)(items)
    assert fixed.inputs["input_ids"].shape == (2, 16) and fixed.labels.shape == (2, 4)
    assert fixed.padded_tokens == 2 * 16 + 2 * 4 and fixed.real_tokens == long.real_tokens
    cls = Collator("classification", 0, "longest", 16, 4)([([1, 2], 1), ([3], 0)])
    assert cls.labels.tolist() == [1, 0] and cls.loss_items == 2


def test_length_grouped_batches_cut_padding_and_keep_the_samples():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 200, (1000,), generator=g).tolist()
    rnd, smart = RandomBatches(lengths, 16, seed=3), LengthGroupedBatches(lengths, 16, seed=3)
    assert len(rnd) == len(smart) == 62

    def padded(batches):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    r, s = list(rnd), list(smart)
    assert sorted(i for b in r for i in b) == sorted(i for b in s for i in b), "same samples per epoch"
    assert padded(s) < 0.7 * padded(r)
    smart.set_epoch(1)
    assert list(smart) != s, "a new order each epoch"


def test_sortish_puts_the_longest_batch_first_keeping_samples():
    from trainwise.strategies.batching.samplers import SortishBatches

    lengths = [(i * 37) % 101 + 1 for i in range(400)]
    for epoch in range(3):
        rnd, sortish = RandomBatches(lengths, 16, seed=5), SortishBatches(lengths, 16, seed=5)
        rnd.set_epoch(epoch)
        sortish.set_epoch(epoch)
        batches = list(sortish)
        assert sorted(i for b in batches for i in b) == sorted(i for b in rnd for i in b)
        assert max(lengths[i] for i in batches[0]) == max(lengths[i] for b in batches for i in b)

        def padding(bs):
            return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in bs)

        assert padding(batches) < 0.5 * padding(list(rnd))


def test_a_checkpoint_with_another_head_gets_a_new_one(tmp_path, cls_csv, capsys):
    """Issue 17: a local classifier saved with 2 labels, fine-tuned on data with more: the head is
    re-initialised and said so in one line (it used to be an error row per trial)."""
    from trainwise.cli import main
    from trainwise.training.models import PRESETS, train_tokenizer

    model_dir = tmp_path / "two-label-bert"
    train_tokenizer(["some words to learn a vocabulary from"] * 20, "bert-tiny", model_dir)
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model("bert", **PRESETS["bert-tiny"][1], pad_token_id=0, num_labels=2)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(model_dir)
    out = tmp_path / "study"
    argv = ["compare", "--model", str(model_dir), "--train-file", str(cls_csv), "--strategies", "baseline"]
    argv += ["--max-steps", "2", "--warmup-steps", "1", "--batch-size", "8", "--max-length", "32", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "classification head" in line]
    n = len({r["target"] for r in csv.DictReader(cls_csv.read_text().splitlines())})
    assert notes == [
        f"trainwise: note: two-label-bert was saved with a 2-label classification head and the data has {n} labels: "
        "the head is re-initialised (its other weights are kept)"
    ]
    assert read_rows(out / "results.json")[0]["status"] == "ok"


def test_a_study_says_and_records_what_it_skipped(tmp_path, capsys, monkeypatch):
    """Issue 27 end to end: 1 of 300 training rows has an empty text and 1 of 40 held-out records has no
    target key: the study trains (exit 0), prints a line per file, and origin.json has the counts."""
    from trainwise.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = [{"text": r["text"], "target": r["target"]} for r in make_rows(300, "classification")]
    rows[15]["text"] = ""
    train_csv = write_csv(tmp_path / "train.csv", rows)
    held = [{"text": r["text"], "target": r["target"]} for r in make_rows(40, "classification", seed=1)]
    del held[8]["target"]
    eval_jsonl = tmp_path / "eval.jsonl"
    eval_jsonl.write_text("".join(json.dumps(r) + "\n" for r in held))
    out = tmp_path / "study"
    argv = ["compare", "--model-preset", "bert-tiny", "--strategies", "baseline", "--max-steps", "2"]
    argv += ["--warmup-steps", "1", "--batch-size", "8", "--max-length", "32", "--out", str(out)]
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--train-file", "train.csv", "--eval-file", str(eval_jsonl)]) == 0, "its trial ran: exit 0"
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trainwise: data:")]
    assert notes == [
        "trainwise: data: skipped 1 of 300 rows of train.csv (1 empty 'text', first at line 17)",
        f"trainwise: data: skipped 1 of 40 rows of {eval_jsonl} (1 no 'target' key, first at line 9)",
    ]
    origin = json.loads((out / "data" / "origin.json").read_text())
    assert origin["source"] == f"file:{train_csv.resolve()}"
    assert [(r["read"], r["kept"], r["reasons"]) for r in origin["reads"]] == [
        (300, 299, {"empty 'text'": {"rows": 1, "first": 17}}),
        (40, 39, {"no 'target' key": {"rows": 1, "first": 9}}),
    ]


def test_the_first_builtin_dataset_used_writes_all_three(tmp_path, monkeypatch):
    """Parsing the stdlib is most of a build: one reading makes every built-in dataset, and a later one is read from
    the cache, not built again."""
    from trainwise.training.data import builtin

    calls = []
    rows = {name: [{"text": f"{name} row {i}", "target": "t"} for i in range(20)] for name in builtin.BUILTIN_DATASETS}
    monkeypatch.setattr(builtin, "_all_pairs", lambda: calls.append(1) or rows)
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    train, evals = load_builtin("stdlib-topic")
    assert len(train) + len(evals) == 20 and calls == [1]
    for name in builtin.BUILTIN_DATASETS:
        train, evals = load_builtin(name)
        assert {r["text"] for r in train + evals} == {r["text"] for r in rows[name]}
    assert calls == [1], "built once, for all three"
