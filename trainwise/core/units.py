"""Sizes and durations as the user writes them ('11GB', '512MiB', '30m'): parsed once, at the edge."""

from __future__ import annotations

import re

from trainwise.core.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_bytes(text: str, option: str = "--memory-budget") -> int:
    """'11GB' -> 11e9, '512MiB' -> 512*2**20, '2.5 GiB' -> ...; ConfigError on anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{option} {text!r}: give a size such as 11GB, 11GiB or 500MB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ConfigError(f"{option} must be > 0, got {text!r}")
    return int(value)


_SECONDS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_seconds(text: str, option: str) -> float:
    """'90s' -> 90, '30m' -> 1800, '2.5h' -> 9000, '120' -> 120; ConfigError on anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SECONDS or float(m.group(1)) <= 0:
        raise ConfigError(f"{option} {text!r}: give a positive duration such as 90s, 30m or 2h")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def human_seconds(s: float) -> str:
    """A duration as a person says it, rounded to what matters: '40 s', '12 min', '2 h 41 min'."""
    if s < 90:
        return f"{max(0, round(s))} s"
    minutes = round(s / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"
