"""trainwise: controlled trials of training strategies, measured honestly.

The Python API (docs/python-api.md): `trainwise.compare(...)` runs a study as `trainwise compare` does
and returns it; `trainwise.open(path)` reads one. They are looked up on first use, so that `import
trainwise` (and the CLI's start) stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["compare", "open"]


def __getattr__(name: str) -> Any:
    # deferred: the API modules import the study machinery, which the CLI's bad-input paths never need
    if name == "compare":
        from trainwise.api.compare import compare

        return compare
    if name == "open":
        from trainwise.api.study import open_study

        return open_study
    raise AttributeError(f"module 'trainwise' has no attribute {name!r}")
