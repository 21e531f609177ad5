"""causal-lm chat transcripts (--messages-column): rendered with the tokenizer's chat template, the loss on
the assistant turns only.

What is checked, with the real SmolLM2-135M-Instruct tokenizer (its ChatML template): the labelled tokens are
exactly each assistant turn's content and its end-of-turn token, every system/user/template token is -100;
a conversation cut at --max-length keeps its beginning and one with no assistant token left is left out and
counted; a template that renders earlier turns differently is one line; conversations read the same from a CSV
(JSON text) and JSONL (real lists), bad ones skipped with their reason, a 'messages' column found when no column
is named; packed rows keep the labels; a compare and a train on a tiny model with that tokenizer.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from tests.conftest import WORDS
from trainwise.core.errors import ConfigError
from trainwise.training.data.chat import (
    IGNORE_INDEX,
    assistant_labels,
    conversation_text,
    encode_chat,
    read_conversation,
)

IM_END = "<|im_end|>"


def conversations(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Learnable conversations (the answer reverses the first three words) of one or two exchanges, some with
    a system message."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": "Answer in three words."}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            words = [rng.choice(WORDS) for _ in range(rng.choice([3, 5, 8]))]
            messages += [
                {"role": "user", "content": "Reverse the first three: " + " ".join(words)},
                {"role": "assistant", "content": " ".join(words[2::-1])},
            ]
        out.append(messages)
    return out


@pytest.fixture(scope="session")
def chat_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(48)))
    return path


def runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    """The runs of labelled tokens, in order."""
    out: list[list[int]] = []
    for i, (t, y) in enumerate(zip(ids, labels, strict=True)):
        if y != IGNORE_INDEX:
            assert y == t, "a label is its own input token (the model shifts)"
            if i == 0 or labels[i - 1] == IGNORE_INDEX:
                out.append([])
            out[-1].append(t)
    return out


def test_only_the_assistant_turns_carry_loss(chat_tokenizer):
    tok = chat_tokenizer
    for messages in conversations(6):
        ids, labels = assistant_labels(tok, messages)
        assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [tok.decode(r) for r in runs(ids, labels)] == [a + IM_END for a in answers]
        unlabelled = tok.decode([t for t, y in zip(ids, labels, strict=True) if y == IGNORE_INDEX])
        for m in messages:  # every system and user token is -100, and the template's own
            if m["role"] != "assistant":
                assert m["content"] in unlabelled
        assert unlabelled.count("<|im_start|>") == len(messages) + (messages[0]["role"] != "system")
        labelled = sum(y != IGNORE_INDEX for y in labels)  # the answers' own tokens, nothing more
        assert labelled == sum(len(tok(a + IM_END, add_special_tokens=False)["input_ids"]) for a in answers)


def test_a_long_chat_keeps_its_start_and_answerless_ones_count(chat_tokenizer):
    """A long conversation keeps its beginning, and one left without an answer is counted."""
    long = conversations(2)[1]  # two exchanges, no system message: the template adds its default one
    ids, labels = assistant_labels(chat_tokenizer, long)
    first = next(i for i, y in enumerate(labels) if y != IGNORE_INDEX)
    rows = [{"text": conversation_text(long)}] * 2
    cut = encode_chat(rows, chat_tokenizer, first + 3)
    assert (cut.cut, cut.dropped) == (2, 0) and cut.input_ids == [ids[: first + 3]] * 2
    assert cut.labels[0] == labels[: first + 3] and len(runs(cut.input_ids[0], cut.labels[0])) == 1
    gone = encode_chat(rows, chat_tokenizer, first)  # the first answer starts where the rows end
    assert (gone.cut, gone.dropped, gone.input_ids) == (2, 2, [])


def test_a_template_that_rewrites_earlier_turns_is_one_line(chat_tokenizer):
    tok = chat_tokenizer.__class__.from_pretrained(chat_tokenizer.name_or_path)
    # like templates that drop past reasoning: an assistant turn renders shorter once another turn follows
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ConfigError, match=r"not render conversation 2 prefix by prefix \(its message 2, an") as e:
        encode_chat([{"text": conversation_text(m)} for m in conversations(4)], tok, 256)
    assert len(str(e.value).splitlines()) == 1
    tok.chat_template = "{{ raise_exception('only user and assistant roles are supported') }}"
    with pytest.raises(ConfigError, match="the chat template fails on conversation 1 .only user and assistant"):
        encode_chat([{"text": conversation_text(conversations(1)[0])}], tok, 256)


def test_a_conversation_is_a_list_of_role_content_messages():
    good = conversations(1)[0]
    assert read_conversation(good, "messages") == good
    assert read_conversation(json.dumps(good), "messages") == good  # a CSV cell: JSON text
    extra = [{**m, "name": "x"} for m in good]
    assert read_conversation(extra, "messages") == good  # only role and content are kept
    assert read_conversation("[{not json", "chat") == "'chat' not JSON"
    assert read_conversation({"role": "user"}, "chat") == "'chat' not a list of role/content objects"
    assert read_conversation([{"content": "hi"}], "chat") == "a message without 'role'"
    assert read_conversation([{"role": "user", "content": 3}], "chat") == "a message whose 'content' is not text"
    assert read_conversation([{"role": "bot", "content": "hi"}], "chat").startswith("unknown role 'bot'")
    assert read_conversation([{"role": "user", "content": "hi"}], "chat") == "no assistant turn"


def test_chat_files_read_alike_and_bad_ones_are_counted(tmp_path):
    """Chat files read alike, bad conversations are counted, and the messages key is found."""
    from trainwise.training.data.sources import read_task_data

    convs = conversations(40)
    with open(tmp_path / "chat.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "dialogue"])
        writer.writerows([i, json.dumps(m)] for i, m in enumerate(convs))
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"dialogue": m}) + "\n" for m in convs))
    read = [
        read_task_data("causal-lm", None, str(tmp_path / f"chat.{ext}"), None, None, None, messages_column="dialogue")
        for ext in ("csv", "jsonl")
    ]
    assert read[0].data_format == read[1].data_format == "chat"
    assert (read[0].train, read[0].evals) == (read[1].train, read[1].evals)
    assert sorted(r["text"] for r in read[0].train + read[0].evals) == sorted(map(conversation_text, convs))

    # no column named, no 'text', a 'messages' column: chat; one bad conversation in 40 is skipped and said
    rows = [{"messages": m} for m in convs]
    rows[7] = {"messages": [{"role": "user", "content": "no answer"}]}
    (tmp_path / "found.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = read_task_data("causal-lm", None, str(tmp_path / "found.jsonl"), None, None, None)
    assert data.data_format == "chat" and len(data.train) + len(data.evals) == 39
    found = tmp_path / "found.jsonl"
    assert data.notes() == [f"skipped 1 of 40 rows of {found} (1 no assistant turn, first at line 8)"]
    with pytest.raises(ConfigError, match="choose --messages-column$"):  # more than 5% unusable
        rows[9] = rows[11] = {"messages": [{"role": "bot", "content": "hi"}]}
        (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        read_task_data("causal-lm", None, str(tmp_path / "bad.jsonl"), None, None, None)


def test_packed_chat_rows_keep_the_assistant_labels(chat_tokenizer):
    from trainwise.training.data.prepared import packed_rows
    from trainwise.training.data.tasks import Collator, encode_lm

    rows = [{"text": conversation_text(m), "target": ""} for m in conversations(24)]
    enc = encode_lm(rows, chat_tokenizer, "chat", 128)
    data, lengths, collate = packed_rows(enc, chat_tokenizer.pad_token_id, 128)
    assert len(data) < len(enc)  # several conversations to a row
    batch = collate([data[i] for i in range(len(data))])
    alone = Collator("causal-lm", chat_tokenizer.pad_token_id, "longest", 128, 8)(
        list(zip(enc.input_ids, enc.labels, strict=True))
    )
    assert batch.loss_items == alone.loss_items  # every assistant token still carries loss, nothing else does
    labelled = sorted(int(t) for t in batch.labels[batch.labels != IGNORE_INDEX])
    assert labelled == sorted(t for y in enc.labels for t in y if t != IGNORE_INDEX)
    answers = chat_tokenizer.decode(batch.labels[batch.labels != IGNORE_INDEX].tolist())
    assert answers.count(IM_END) == sum(len(runs(x, y)) for x, y in zip(enc.input_ids, enc.labels, strict=True))


def test_compare_and_train_on_chat_data(tiny_chat_model, chat_jsonl, tmp_path, capsys):
    import trainwise
    from trainwise.cli import main

    out = tmp_path / "study"
    argv = ["compare", "--task", "causal-lm", "--model", str(tiny_chat_model), "--train-file", str(chat_jsonl)]
    argv += ["--strategies", "baseline,packing", "--batch-size", "4", "--max-length", "64", "--max-steps", "2"]
    argv += ["--warmup-steps", "1", "--eval-samples", "4", "--max-target-length", "4", "--device", "cpu"]
    argv += ["--retries", "0", "--no-remeasure", "--out", str(out)]
    assert main(argv) == 0  # no column named: the file's 'messages' column is found
    err = capsys.readouterr().err
    assert "training conversations are longer than --max-length 64: cut there" in err, err
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["data"].startswith(f"{chat_jsonl} (messages 'messages'): ")
    rows = results["rows"]
    assert [r["strategy"] for r in rows] == ["baseline", "packing"] and all(r["status"] == "ok" for r in rows), rows
    for r in rows:
        assert 0.05 < r["loss_token_share"] < 0.5  # the short answers, not the template, system and user turns
        assert r["metrics"]["perplexity"] > 1 and 0 <= r["metrics"]["rougeL"] <= 100
    spec = json.loads((out / "data" / "origin.json").read_text())
    assert spec["messages_column"] is None and spec["source"].endswith("chat.jsonl")

    result = trainwise.train(
        task="causal-lm",
        model=str(tiny_chat_model),
        train_file=str(chat_jsonl),
        messages_column="messages",
        strategies="baseline",
        batch_size=4,
        max_length=64,
        max_steps=2,
        eval_every=2,
        eval_samples=4,
        max_target_length=4,
        device="cpu",
        out=str(tmp_path / "run"),
    )
    assert result.steps == 2
    evals = json.loads((tmp_path / "run" / "train_result.json").read_text())["evals"]
    assert evals and all("perplexity" in e and "rougeL" in e for e in evals)
