"""The case studies as shipped study files: one YAML file per seed study (`trainwise recipes` lists them;
`trainwise compare --recipe seed-001` runs one, flags over its keys). Each file opens with comment lines that
say what it is for, read here:

    # verb: compare                 the command that runs it
    # question: ...                 what the study asked
    # rows: ...                     its rows
    # offline: ...                  the model and data it runs with here (CPU, no network)
    # published: ...                what the published run used
    # to publish: ...               the keys to change to run it at that scale

The rest of the file is the verb's options, as `--config FILE` reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainwise.core.errors import ConfigError

DIR = Path(__file__).parent
FIELDS = ("verb", "question", "rows", "offline", "published", "to publish")


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    verb: str
    question: str
    rows: str
    offline: str
    published: str
    to_publish: str

    @classmethod
    def read(cls, path: Path) -> Recipe:
        said: dict[str, str] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            key, sep, value = line[1:].strip().partition(": ")
            if sep and key in FIELDS:
                said[key.replace(" ", "_")] = value.strip()
        return cls(path.stem, path, **{k.replace(" ", "_"): said.get(k.replace(" ", "_"), "") for k in FIELDS})


def names() -> list[str]:
    return sorted(p.stem for p in DIR.glob("*.yaml"))


def all_recipes() -> list[Recipe]:
    return [Recipe.read(DIR / f"{name}.yaml") for name in names()]


def recipe(name: str, verb: str | None = None) -> Recipe:
    """The shipped recipe `name` (a ConfigError naming the others when there is none); with `verb`, one for
    that command (a recipe for another command says which to run)."""
    path = DIR / f"{name}.yaml"
    if not path.is_file() or "/" in name:
        raise ConfigError(f"--recipe {name!r}: no such recipe; the recipes: {', '.join(names())}")
    found = Recipe.read(path)
    # a compare study is also where `trainwise plan` starts (plan takes compare's options)
    if verb is not None and found.verb != verb and not (found.verb == "compare" and verb == "plan"):
        raise ConfigError(
            f"--recipe {name} is a recipe for `trainwise {found.verb}`: run trainwise {found.verb} --recipe {name}"
        )
    return found
