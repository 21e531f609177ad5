"""Where a study's data came from, as the user gave it (data/origin.json beside the prepared data; export writes it back
into the commands it writes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainwise.core.config import DEFAULT_DATASET, IMAGE_TASK
from trainwise.spec.config import StudyConfig
from trainwise.training.data.sources import Skipped, TaskData, data_source, skip_notes


@dataclass(frozen=True)
class DataOrigin:
    """Where a study's data came from, as the user gave it: a study writes it beside its prepared data
    (data/origin.json), and export writes it back into the `trainwise train` command it exports."""

    dataset: str | None = None
    train_file: str | None = None  # absolute
    eval_file: str | None = None  # absolute
    text_column: str | None = None
    target_column: str | None = None
    max_train_samples: int | None = None
    eval_samples: int = 160
    # what was read, not options: `builtin:stdlib-topic`, `file:/abs/t.csv`, `hub:NAME` (None: before trainwise said)
    source: str | None = None
    reads: tuple[Skipped, ...] = ()  # per file read: rows read, kept, and skipped by reason with the first line
    not_evaluated: int = 0  # held-out rows of a class no training row has
    prompt_column: str | None = None  # causal-lm's prompt/response data
    response_column: str | None = None
    messages_column: str | None = None  # causal-lm's chat transcripts

    @classmethod
    def of(cls, cfg: StudyConfig, data: TaskData | None = None) -> DataOrigin:
        """`data`: what a text task read (without it, the source is named from the options alone)."""

        def absolute(path: str | None) -> str | None:
            return None if path is None else str(Path(path).resolve())

        if data is not None:
            source = data.source
        elif cfg.task == IMAGE_TASK:
            source = f"file:{absolute(cfg.train_file)}" if cfg.train_file else f"builtin:{cfg.dataset or 'digits'}"
        else:
            source = data_source(cfg.dataset or (None if cfg.train_file else DEFAULT_DATASET[cfg.task]), cfg.train_file)
        return cls(
            cfg.dataset,
            absolute(cfg.train_file),
            absolute(cfg.eval_file),
            cfg.text_column,
            cfg.target_column,
            cfg.max_train_samples,
            cfg.eval_samples,
            source,
            data.reads if data is not None else (),
            data.not_evaluated if data is not None else 0,
            cfg.prompt_column,
            cfg.response_column,
            cfg.messages_column,
        )

    @classmethod
    def from_dict(cls, d: dict) -> DataOrigin:
        """An origin.json read back (one written before `source` and `reads` existed lacks them)."""
        return cls(**{**d, "reads": tuple(Skipped.from_dict(r) for r in d.get("reads", ()))})

    def notes(self) -> list[str]:
        """What reading the data left out, a line each (none when nothing was)."""
        return skip_notes(self.reads, self.not_evaluated)

    def flags(self) -> list[str]:
        """The command-line options that load the same data (the study's default corpus: none)."""
        named = [
            ("--dataset", self.dataset),
            ("--train-file", self.train_file),
            ("--eval-file", self.eval_file),
            ("--text-column", self.text_column),
            ("--target-column", self.target_column),
            ("--prompt-column", self.prompt_column),
            ("--response-column", self.response_column),
            ("--messages-column", self.messages_column),
            ("--max-train-samples", self.max_train_samples),
        ]
        return [
            *(x for flag, value in named if value is not None for x in (flag, str(value))),
            "--eval-samples",
            str(self.eval_samples),
        ]

    def describe(self, data_format: str = "") -> str:
        """The data in words; `data_format`: what was read (TrialSettings.data_format), when known."""
        where = self.train_file or self.dataset or "the built-in corpus"
        columns = (
            f" (text {self.text_column or 'text'!r}, target {self.target_column or 'target'!r})"
            if self.train_file
            else ""
        )
        if self.train_file and (self.prompt_column or self.response_column):
            columns = f" (prompt {self.prompt_column or 'prompt'!r}, response {self.response_column or 'response'!r})"
        if self.train_file and (self.messages_column or data_format == "chat"):  # named, or found
            columns = f" (messages {self.messages_column or 'messages'!r})"
        held = f", evaluated on {self.eval_file}" if self.eval_file else ""
        return f"{where}{columns}{held}"
