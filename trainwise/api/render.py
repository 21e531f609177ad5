"""How a caller shows a running verb. The application layer prints nothing: it calls these, and each
defaults to showing nothing (the CLI's are rich on the terminal; a notebook reads the returned result)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@contextlib.contextmanager
def _silent(_prepared: Any) -> Iterator[tuple[Callable, Callable]]:
    yield (lambda *_: None), (lambda *_: None)


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Render:
    """progress(prepared): a context manager giving (on_event(spec, event), on_done(spec, result, stored));
    table(report): a study's table; quality(rows, seeds): the quality phase's verdicts;
    status(text): a context manager shown while the input is checked and prepared (its `update(text)`, when
    it has one, says what the work is doing now); note(line): what the user should know (rows skipped, a
    head trained new, a plan's precision); event(dict): a training run's progress; line(text): a line of
    a search's progress."""

    progress: Callable = _silent
    table: Callable[[Any], None] = _nothing
    quality: Callable[[list, int], None] = _nothing
    status: Callable[[str], Any] = lambda _text: contextlib.nullcontext()
    note: Callable[[str], None] = _nothing
    event: Callable[[dict], None] = _nothing
    line: Callable[[str], None] = _nothing

    def update(self, status: Any) -> Callable[[str], None]:
        """The status's update, or nothing (a null context has none)."""
        return getattr(status, "update", _nothing)
