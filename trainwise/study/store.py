"""Everything a study keeps on disk, and the only code that reads or writes it: the directory (ours, locked,
removed under us), the SQLite store of finished trials, the data files, the reports (results.json rows,
results.csv, report.md, chart.png, progress.json: written whole, read back typed), the options file (study.yaml)
and the quality phase's verdicts (quality/quality.json)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from trainwise.core.errors import ConfigError, read_json
from trainwise.core.files import MARK, failed, hold, write_atomic, writing
from trainwise.core.quality import QualityVerdicts
from trainwise.core.results import StudyRow, TrialResult
from trainwise.report.html import report_html
from trainwise.report.write import caption, chart, csv_text, markdown
from trainwise.spec.config import TrialSpec
from trainwise.study.origin import DataOrigin

STORE = "study.sqlite"  # the finished trials (Store)
RESULTS = "results.json"  # the table's rows (StudyRow) beside the study's settings (`study`)
STUDY_FILE = "study.yaml"  # the options a study ran with (`compare --config` reruns it; trainwise.api writes it)
PAGE = "report.html"  # the report as one self-contained page (trainwise.report.html), written when the study ends
PROGRESS = "progress.json"  # how many of the study's trials the reports hold, and which (their store keys)
QUALITY = "quality/quality.json"  # the quality phase's verdicts (its own study is in OUT/quality/)
ESTIMATES = "estimates.json"  # each row's memory as `trainwise estimate` predicts it (`trainwise report --estimate`)
PLAN = "plan.json"  # a `trainwise plan` search in this study: the plan, its candidates and reasons
PLAN_MD = "plan.md"  # the same, as text
FIND_BATCH = "find_batch.json"  # a `trainwise find-batch` search (its own --out, or a study's)
REPLACED = "replaced"  # OUT/replaced/N/: the reports of a study --replace replaced
# what a study's report is (its files, and its quality phase's verdicts): kept whole when it is replaced
REPORTS = (
    RESULTS,
    "results.csv",
    "report.md",
    "chart.png",
    PAGE,
    PROGRESS,
    STUDY_FILE,
    QUALITY,
    ESTIMATES,
    PLAN,
    PLAN_MD,
)
# of those, what only the replaced study's rows are about (no run of the new study rewrites them): moved aside
OF_ITS_ROWS = (ESTIMATES, PLAN, PLAN_MD)


def check_ours(out: Path, force: bool) -> None:
    """--out must be a directory this process can write (or one it can create), and one trainwise wrote:
    an --out that exists with files trainwise did not write is the user's, refused unless --force."""
    _check_writable(out)
    if force or not out.is_dir():
        return
    entries = sorted(p.name for p in out.iterdir())
    ours = MARK in entries or STORE in entries or (out / "data" / "labels.json").is_file()
    if entries and not ours:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(
            f"--out {out} holds files trainwise did not write ({shown}); choose another --out, "
            "or pass --force to write into it"
        )


def keep_reports(out: Path) -> Path:
    """Before a study of other settings replaces the one in `out` (--replace): its reports, copied as they
    are into OUT/replaced/N/ (the next free N). Its trials stay in the store, keyed by their settings, so
    its study file run again with --replace brings its report back without running a trial."""
    n = 1
    while (out / REPLACED / str(n)).exists():
        n += 1
    kept = out / REPLACED / str(n)
    with writing(kept, kept):
        for name in REPORTS:
            if (out / name).is_file():
                (kept / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(out / name, kept / name)
    for name in OF_ITS_ROWS:  # never drawn beside the new study's rows
        (out / name).unlink(missing_ok=True)
    return kept


def mark(out: Path) -> None:
    """Mark `out` as trainwise's, in place: `hold` locks this file, and a rename would swap the inode a
    running command holds its lock on."""
    with writing(out / MARK), open(out / MARK, "a+") as f:
        if f.tell() == 0:
            f.write("written by trainwise\n")


def _check_writable(out: Path) -> None:
    """Tried for real (a temporary file in the nearest existing folder, removed at once): permission bits
    say nothing for root, and /proc or a read-only mount refuse writes whatever they say."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {out}: {probe} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write in {probe} ({e.strerror}); choose a writable directory") from None


def write_data(out: Path, labels: list, origin: DataOrigin, train: list[dict] | None = None, evals=None) -> Path:
    """The study's prepared data in OUT/data/ (trials read it: trainwise.training.data.prepared): its labels, where it
    came
    from (origin.json) and, for text, the training and held-out rows (JSON lines). Returns the directory."""
    data_dir = out / "data"
    for path, rows in (("train.jsonl", train), ("eval.jsonl", evals)):
        if rows is not None:
            write_atomic(data_dir / path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    write_atomic(data_dir / "labels.json", json.dumps(labels))
    write_atomic(data_dir / "origin.json", json.dumps(dataclasses.asdict(origin)))
    return data_dir


class Store:
    """The study's embedded SQLite store: one row per finished trial, written as it ends. The only code
    that reads study.sqlite."""

    VERSION = 1  # PRAGMA user_version of study.sqlite: a store written by a newer trainwise is refused

    def __init__(self, path: Path, flag: str = "--out", write: bool = True, keys: list[str] | None = None):
        self.path = path
        # the trials the study's reports hold (progress.json): a store also keeps the trials of the settings a
        # study ran with before (--replace), and `spec` must answer for the study the reports show
        self.keys = keys
        self.check(path, flag)
        self.db = sqlite3.connect(path)
        if write:
            with writing(path):
                self._create()

    def _create(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS trials (key TEXT PRIMARY KEY, strategy TEXT, repeat INTEGER, "
            "status TEXT, spec TEXT, result TEXT, finished_at REAL)"
        )
        self.db.execute(f"PRAGMA user_version = {self.VERSION}")
        self.db.commit()

    @classmethod
    def check(cls, path: Path, flag: str) -> None:
        """An existing study.sqlite must be a store this trainwise reads (opened read-only: nothing is
        written); ConfigError when it is damaged, not a database, or from a newer trainwise."""
        if not path.exists():
            return
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "trials" in tables:
                    db.execute("SELECT key, strategy, status, spec FROM trials LIMIT 1").fetchall()
            finally:
                db.close()
        except sqlite3.Error as e:
            raise ConfigError(
                f"{path} is not a trainwise store ({e}); move it away, or choose another {flag}"
            ) from None
        if version > cls.VERSION:
            raise ConfigError(
                f"{path} was written by a newer trainwise (store version {version}; this one reads up to "
                f"{cls.VERSION}): upgrade trainwise to read it"
            )
        if tables - {"trials"}:
            raise ConfigError(
                f"{path} is not a trainwise store (it holds tables {', '.join(sorted(tables))}); move it away, "
                f"or choose another {flag}"
            )

    @classmethod
    def of(cls, study: Path, flag: str = "--study") -> Store:
        """The store of a finished compare study (ConfigError when `study` is not one)."""
        if not (study / STORE).is_file() or not (study / RESULTS).is_file():
            raise ConfigError(f"{flag} {study}: not a finished trainwise compare study (no study.sqlite/results.json)")
        return cls(study / STORE, flag, write=False, keys=read_trial_keys(study))

    @classmethod
    def spec_of(cls, study: Path, flag: str = "--out", row: str | None = None) -> TrialSpec | None:
        """A trial spec of the study its reports show (the settings every trial shares; `row`'s when it has one:
        a `row@bsN` trial runs at its own batch), read-only; None when `study` has no store or no trial yet."""
        if not (study / STORE).is_file():
            return None
        store = cls(study / STORE, flag, write=False, keys=read_trial_keys(study))
        try:
            return (store.spec(row) if row is not None else None) or store.spec()
        finally:
            store.close()

    def get(self, key: str) -> TrialResult | None:
        row = self.db.execute("SELECT result FROM trials WHERE key = ?", (key,)).fetchone()
        return TrialResult.from_dict(json.loads(row[0])) if row else None

    def put(self, spec: TrialSpec, result: TrialResult) -> None:
        """Store a finished trial (one transaction: a full disk leaves the store as it was: OutputFailed)."""
        with writing(self.path):
            self._put(spec, result)

    def _put(self, spec: TrialSpec, result: TrialResult) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                spec.key(),
                spec.row,
                spec.repeat,
                result.status,
                json.dumps(spec.to_dict()),
                json.dumps(result.to_dict()),
                time.time(),
            ),
        )
        self.db.commit()

    def rows(self) -> list[str]:
        return [r for (r,) in self.db.execute("SELECT strategy FROM trials GROUP BY strategy ORDER BY MIN(rowid)")]

    def spec(self, row: str | None = None) -> TrialSpec | None:
        """The spec of a trial of `row` (any trial when None): the settings every trial shares, and its plan.
        One of the trials the reports hold when the store knows them, else the latest stored."""
        where, args = ("WHERE strategy = ?", [row]) if row is not None else ("WHERE 1", [])
        if self.keys is not None:
            where += f" AND key IN ({', '.join('?' * len(self.keys))})"
            args += self.keys
        found = self.db.execute(f"SELECT spec FROM trials {where} ORDER BY rowid DESC LIMIT 1", args).fetchone()
        return None if found is None else TrialSpec.from_dict(json.loads(found[0]))

    def origin(self) -> DataOrigin | None:
        """Where the study's data came from (None for a study written before trainwise recorded it)."""
        return read_origin(self.path.parent)

    def close(self) -> None:
        self.db.close()


Trials = list[tuple[TrialSpec, TrialResult]]


def still_there(out: Path) -> None:
    """OutputFailed when --out was removed while the command ran: a trial would recreate it empty, and
    the store, open on the removed file, would keep nothing."""
    if not (out / MARK).is_file():
        raise failed(out, "the directory was removed")


def read_origin(out: Path) -> DataOrigin | None:
    """Where the study's data came from (None when it does not say: written before trainwise recorded it)."""
    try:
        return DataOrigin.from_dict(json.loads((out / "data" / "origin.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


# ---- the reports: written whole, read back typed ------------------------------------------------------------


def write_reports(
    out: Path,
    table: list[StudyRow],
    title: str,
    done: int | None = None,
    total: int | None = None,
    study: dict | None = None,
    trials: list[str] | None = None,
    page: bool = False,
) -> list[Path]:
    """Every file replaced whole: all of them are written aside first and renamed into place only when
    each was written, so a reader, a kill or a full disk never leaves half of one (a set of reports that
    disagree only if a rename itself fails, which needs no space). `study` (the run's settings:
    `aggregate.study_settings`) opens report.md, sits beside the rows in results.json and captions the chart.
    `progress.json` says how many of the study's trials are in them (a killed study's reports are
    partial), and which: `trials`, their keys in the store (which may hold trials of other settings).
    report.html (its figures take a second or two to draw) is written with `page`, the study's last write; the
    writes before it remove an earlier one, which no longer holds every row (`trainwise report` draws it)."""
    paths = [out / RESULTS, out / "results.csv", out / "report.md", out / "chart.png"]
    texts = {
        paths[0]: json.dumps({"study": study or {}, "rows": [e.to_dict() for e in table]}, indent=1, default=str),
        paths[1]: csv_text(table),
        paths[2]: markdown(table, title, study),
    }
    if done is not None and total is not None:
        texts[out / PROGRESS] = json.dumps({"done": done, "total": total, "trials": trials or []})
    if page:  # the study's last write: every trial is in it (a partial study's page: `trainwise report`)
        texts[out / PAGE] = page_of(out, table, title, study)
        paths.append(out / PAGE)
    else:
        (out / PAGE).unlink(missing_ok=True)
    tmps = {path: path.with_name(f".{path.stem}.tmp{path.suffix}") for path in [*texts, paths[3]]}
    for path, text in texts.items():
        with writing(path, *tmps.values()):
            tmps[path].write_text(text, encoding="utf-8")
    with writing(paths[3], *tmps.values()):
        chart(table, tmps[paths[3]], title, caption(study))
    for path, tmp in tmps.items():
        with writing(path, *tmps.values()):
            tmp.replace(path)
    return paths


def page_of(out: Path, table: list[StudyRow], title: str, study: dict | None, partial: str | None = None) -> str:
    """The study's report.html: its rows, and what else its directory holds (the quality phase's verdicts, the
    rows' memory estimates, a plan search, a find-batch search), each drawn when there; a file that cannot be read
    is said on the page, never the loss of the page."""
    extras, not_read = {}, []
    for key, name in (("estimates", ESTIMATES), ("plan", PLAN), ("batch_search", FIND_BATCH)):
        if (out / name).is_file():
            try:
                extras[key] = json.loads((out / name).read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as e:
                not_read.append(f"{name}: {type(e).__name__}: {e}")
    return report_html(table, title, study, partial, read_quality(out), **extras, not_read=not_read)


def write_estimates(out: Path, estimates: dict[str, dict]) -> Path:
    """The rows' memory estimates (row -> MemoryEstimate as a dict), written whole, for the page to draw."""
    write_atomic(out / ESTIMATES, json.dumps(estimates, indent=1))
    return out / ESTIMATES


def rows_of(payload: Any) -> Any:
    """A results.json's rows: its `rows` beside the `study` settings, or the bare list a study wrote
    before the settings were stored; anything else is returned whole for the caller to refuse."""
    if isinstance(payload, dict) and isinstance(payload.get("rows"), list):
        return payload["rows"]
    return payload


def read_rows(path: Path) -> Any:
    """The rows of a results.json as the file holds them: dicts, keys as written (benchmarks read them so).
    Typed (StudyRow): `read_results` on the study's directory."""
    return rows_of(json.loads(path.read_text(encoding="utf-8")))


def read_results(study: Path, runs: bool = True) -> list[StudyRow]:
    """A study's results.json rows, typed (ConfigError when it is missing or not one; `runs`: the verb can run
    the study itself, with --run). A results.json of every earlier release opens: the bare list of rows, and
    rows without the fields added since."""
    path = study / RESULTS
    if study.exists() and not study.is_dir():
        raise ConfigError(f"{study}: not a study directory (a file); give the --out of `trainwise compare`")
    if not path.is_file():
        run = f"run `trainwise compare --out {study}` first" + (", or add --run" if runs else "")
        raise ConfigError(f"{study}: no results.json (no trial of it has finished); {run}")
    rows = rows_of(read_json(path, "a trainwise results file"))
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "strategy" in r for r in rows):
        raise ConfigError(f"{path}: not a trainwise results file (expected a list of rows with 'strategy')")
    return [StudyRow.from_dict(r) for r in rows]


def write_report(study: Path, path: Path, text: str) -> Path:
    """A report drawn again (`trainwise report`) written whole, into a study no other command is running in."""
    with hold(study):
        write_atomic(path, text)
    return path


def read_settings(study: Path) -> dict:
    """What the study ran with (results.json's `study` object); {} for a study written before it was stored."""
    payload = read_json(study / RESULTS, "a trainwise results file")
    return payload.get("study") or {} if isinstance(payload, dict) else {}


def read_progress(study: Path) -> tuple[int, int] | None:
    """(trials done, trials in the study), or None when the study does not say (written before it did)."""
    try:
        progress = json.loads((study / PROGRESS).read_text(encoding="utf-8"))
        return int(progress["done"]), int(progress["total"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def read_trial_keys(study: Path) -> list[str] | None:
    """The store keys of the trials a study's reports hold, or None when it does not say (written before)."""
    try:
        keys = json.loads((study / PROGRESS).read_text(encoding="utf-8"))["trials"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return [str(k) for k in keys] if isinstance(keys, list) and keys else None


def partial_note(study: Path) -> str | None:
    """A line saying the study is partial (killed or still running), or None when it is whole."""
    progress = read_progress(study)
    if progress is None or progress[0] >= progress[1]:
        return None
    done, total = progress
    return (
        f"{study} is partial: {done} of {total} trials finished (interrupted, or still running); "
        "the same compare command finishes it"
    )


def write_quality(out: Path, verdicts: QualityVerdicts) -> Path:
    """The quality phase's verdicts into its study's own directory (OUT/quality/quality.json)."""
    path = out / Path(QUALITY).name
    write_atomic(path, json.dumps(verdicts.to_dict(), indent=1))
    return path


def read_quality(study: Path) -> QualityVerdicts | None:
    """A study's quality verdicts, typed, or None when it has none (ConfigError when the file is not one)."""
    path = study / QUALITY
    if not path.is_file():
        return None
    try:
        return QualityVerdicts.from_dict(read_json(path, "a trainwise quality file"))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ConfigError(f"{path}: not a trainwise quality file (expected seeds and rows)") from None
