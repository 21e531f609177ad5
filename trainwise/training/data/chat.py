"""causal-lm chat transcripts: a column of conversations, rendered with the tokenizer's chat template, the loss
on the assistant turns only.

A conversation is a list of {"role", "content"} messages (roles: ROLES); a CSV cell holds it as JSON text, a
JSON/JSONL record as a real list. `read_conversation` checks one when the data is read: a conversation that
cannot be used (not JSON, not a list of role/content objects, an unknown role, no assistant turn) is a skipped
row with its reason, counted like every other (trainwise.training.data.sources). It is stored as canonical JSON text.

Labels, the way TRL's `assistant_only_loss` marks them but without needing `{% generation %}` in the template
(most templates lack it): the conversation is rendered prefix by prefix. For each assistant message i, the
messages before it rendered with `add_generation_prompt=True` (everything up to where the model starts
answering) and the messages through it (its content and the template's end-of-turn token) must both tokenize
to a prefix of the whole conversation's tokens; the tokens between the two carry the loss, less trailing
whitespace-only tokens (the newline some templates put after the end-of-turn token). A template that renders
an earlier turn differently once later turns follow (one that drops past reasoning, say) breaks that prefix
property: one line names the row, since the assistant tokens could not be found honestly.

Truncation: a conversation longer than --max-length keeps its first --max-length tokens (its later turns are
cut); one left with no assistant token is left out, and counted (`ChatEncoded.dropped`), never silently.

TRL's own conversational path (a 'messages' column, `SFTConfig(assistant_only_loss=True)`) labels the spans the
template marks with `{% generation %}`; `trl_labels_as_ours` says whether, on a study's conversations, that is
exactly this labelling (trainwise export then writes that form, else the tokens with a completion mask).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trainwise.core.batch import IGNORE_INDEX
from trainwise.core.errors import ConfigError

ROLES = ("system", "user", "assistant")
MESSAGES = "messages"  # the column read when no column is named and the data has no 'text'


def read_conversation(value: object, column: str) -> list[dict[str, str]] | str:
    """A column's value as a conversation ([{"role", "content"}], strings), or why it cannot be one (a
    skip reason, short: it is counted and shown with the first line it happened on)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return f"{column!r} not JSON"
        except RecursionError:
            return f"{column!r} nested too deeply"
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        return f"{column!r} not a list of role/content objects"
    messages = []
    for m in value:
        for key in ("role", "content"):
            if key not in m:
                return f"a message without {key!r}"
            if not isinstance(m[key], str):
                return f"a message whose {key!r} is not text"
        if m["role"] not in ROLES:
            return f"unknown role {m['role']!r} (roles: {', '.join(ROLES)})"
        messages.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return "no assistant turn"
    return messages


def conversation_text(messages: list[dict[str, str]]) -> str:
    """How a conversation is stored in a study's rows (their "text"): canonical JSON."""
    return json.dumps(messages, ensure_ascii=False)


def check_chat_template(tokenizer, name: str) -> None:
    """Chat data needs a tokenizer with a chat template (a size preset's trained tokenizer has none: pass None)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"the tokenizer of {name} has no chat template: use --prompt-column/--response-column or a model with one"
        )


@dataclass
class ChatEncoded:
    """Conversations as (input ids, labels) pairs, and how many were cut or left out at max_length."""

    input_ids: list[list[int]]
    labels: list[list[int]]
    cut: int = 0  # longer than max_length: their first max_length tokens kept
    dropped: int = 0  # of those, the ones left with no assistant token (not in input_ids)


def _render(tokenizer, messages: list[dict[str, str]], generation_prompt: bool, row: int) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # jinja's TemplateError, or a template that raises on this conversation
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ConfigError(f"the chat template fails on conversation {row} ({first})") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # the template writes the specials it wants


def assistant_labels(tokenizer, messages: list[dict[str, str]], row: int = 1) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one whole conversation: -100 except on the assistant turns (see the module doc).
    `row`: the conversation's number, 1-based, for the error."""
    ids = _render(tokenizer, messages, False, row)
    labels = [IGNORE_INDEX] * len(ids)
    special = set(tokenizer.all_special_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(before := _render(tokenizer, messages[:i], True, row))
        end = len(through := _render(tokenizer, messages[: i + 1], False, row))
        if ids[:start] != before or ids[:end] != through or end <= start:
            raise ConfigError(
                f"the chat template does not render conversation {row} prefix by prefix (its message {i + 1}, an "
                "assistant turn, tokenizes differently once later turns follow): its assistant tokens cannot be found"
            )
        while end > start and ids[end - 1] not in special and not tokenizer.decode([ids[end - 1]]).strip():
            end -= 1  # a newline after the end-of-turn token: part of the template, not of the answer
        labels[start:end] = ids[start:end]
    return ids, labels


def encode_chat(rows, tokenizer, max_length: int) -> ChatEncoded:
    """Rows whose "text" is a stored conversation -> (input ids, labels), each at most max_length tokens;
    a conversation cut there with no assistant token left is left out (and counted)."""
    out = ChatEncoded([], [])
    for n, row in enumerate(rows, 1):
        ids, labels = assistant_labels(tokenizer, json.loads(row["text"]), n)
        if len(ids) > max_length:
            out.cut += 1
            ids, labels = ids[:max_length], labels[:max_length]
            if all(y == IGNORE_INDEX for y in labels[1:]):  # position 0 is never predicted
                out.dropped += 1
                continue
        out.input_ids.append(ids)
        out.labels.append(labels)
    return out


def chat_notes(enc: ChatEncoded, rows: int, which: str, max_length: int) -> list[str]:
    """What cutting at --max-length did to `rows` conversations, a line (none when nothing was cut)."""
    if not enc.cut:
        return []
    dropped = f"; {enc.dropped} kept no assistant token and are left out" if enc.dropped else ""
    return [f"{enc.cut} of {rows} {which} conversations are longer than --max-length {max_length}: cut there{dropped}"]


def last_turn(ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
    """(prompt, answer) of an encoded example: the tokens before its last run of labelled tokens, and that run
    (a prompt/response pair's response; a conversation's last assistant turn, its generation prompt before it)."""
    end = len(labels)
    while end > 0 and labels[end - 1] == IGNORE_INDEX:
        end -= 1
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return ids[:start], ids[start:end]


GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")  # TRL 1.16's has_generation_markers, whitespace trims too


def trl_labels_as_ours(tokenizer, rows, max_length: int) -> str | None:
    """None if TRL 1.16's conversational path trains `rows` (stored conversations) on exactly trainwise's tokens and
    labels, else why not, a clause. TRL renders a conversation with `apply_chat_template(tokenize=True,
    return_assistant_tokens_mask=True)` and labels the template's `{% generation %}` spans: the template must have
    them (without, TRL swaps in a training template of its own for the families it knows, or refuses), and on
    every conversation they must be trainwise's labels. A conversation longer than max_length is trainwise's to
    cut: TRL's packing cuts without leaving out the ones with no answer left."""
    template = tokenizer.chat_template
    template = template.get("default", "") if isinstance(template, dict) else template or ""
    if not GENERATION.search(template):
        return "its chat template has no {% generation %} markers, which TRL's assistant_only_loss needs"
    for n, row in enumerate(rows, 1):
        messages = json.loads(row["text"])
        ids, labels = assistant_labels(tokenizer, messages, n)
        if len(ids) > max_length:
            return f"conversation {n} is longer than --max-length {max_length}"
        out = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        if list(out["input_ids"]) != ids or list(out["assistant_masks"]) != [int(y != IGNORE_INDEX) for y in labels]:
            return f"its {{% generation %}} spans are not the assistant turns trainwise labels (conversation {n})"
    return None
