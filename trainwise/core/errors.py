"""The exception types the CLI turns into one line: bad user input (exit 2), work that failed (exit 1),
and writes the machine refused (exit 3: `trainwise.core.files`).

Anything raised as `ConfigError` is printed by the CLI as a single line and exits with code 2;
it is raised at the edge (config, strategy parsing, data and model resolution) before any model
is built or any file is written.
"""

import difflib
import json
import math
from pathlib import Path


class ConfigError(ValueError):
    """Bad input from the user: the message says what is wrong and what to do instead."""


class RunFailed(RuntimeError):
    """The input was fine but the work failed as a whole (every trial of a study, or training ranks that
    died): the CLI prints the message as one line and exits with code 1."""


class OutputFailed(RuntimeError):
    """A write the environment refused (a full disk, a quota, a read-only file system, an output folder
    removed): the message names the file and the space left; the CLI prints it as one line, exit 3."""


def check_number(option: str, value: float, low: float = 0.0, *, inclusive: bool = False) -> None:
    """A numeric option must be finite and above `low` (at least `low` when inclusive): NaN and inf,
    which compare false with everything, are refused here rather than trained with."""

    if not (math.isfinite(value) and (value >= low if inclusive else value > low)):
        raise ConfigError(f"{option} must be a finite number {'>=' if inclusive else '>'} {low:g}, got {value:g}")


def read_json(path, what: str, missing: str | None = None, option: str | None = None):
    """A JSON file the user points at, parsed; every way it can be wrong is one ConfigError naming the
    file (and the option that gave it): missing (`missing`, when given, says what to do), unreadable,
    not UTF-8, not JSON, nested too deeply."""

    path = Path(path)
    name = f"{option} {path}" if option else str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{name}: not found" + (f"; {missing}" if missing else "")) from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not {what} (not UTF-8: byte 0x{e.object[e.start]:02x} at {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name}: not {what} (not JSON: {e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise ConfigError(f"{name}: not {what} (JSON nested too deeply)") from None


def check_names(verb: str, given, known) -> None:
    """Keyword arguments of a Python call must be its CLI options' names: an unknown one is one
    ConfigError naming the closest valid name."""

    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(sorted(known))}"
            raise ConfigError(f"{verb}: unknown option {name!r}{hint}")
