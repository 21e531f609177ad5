"""`trainwise env` as a call: the environment trainwise records beside every figure (versions, the commit,
the device), with what the device can do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.options import EnvOptions
from trainwise.core.env import environment


def start(options: EnvOptions) -> dict[str, Any]:
    from trainwise.study.prepare import resolve_device  # heavy: trainwise.study.prepare loads numpy

    resolved, caps = resolve_device(options.device)
    return {**environment(resolved), "capabilities": sorted(caps)}


def env(config: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """`trainwise env` in Python: the environment as a dict (what `trainwise env` prints as JSON)."""
    return start(EnvOptions.of(options, config))
