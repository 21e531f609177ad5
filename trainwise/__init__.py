"""trainwise: controlled trials of training strategies, measured honestly.

The Python API (docs/python-api.md): `trainwise.compare(...)` runs a study as `trainwise compare` does
and returns it; `trainwise.open(path)` reads one; `advise`, `estimate`, `find_batch`, `export`,
`train` and `tune` are the other verbs, each with the CLI's options as keyword arguments (and
`config=` a study file). They are looked up on first use, so that `import trainwise` (and the CLI's
start) stays light.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from typing import Any

# bitsandbytes 0.50.2, imported on a CPU with avx512_bf16 (by every `import peft` once it is installed, in any
# process: a trial, the zygote, the study), warns that an optional Hub kernel (the `kernels` package) is missing and
# falls back to its own C kernels: noise on every row. Set here, before anything can import it.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__version__ = "0.1.0"
__all__ = ["advise", "compare", "estimate", "export", "find_batch", "open", "train", "tune"]
_VERBS = {"advise", "compare", "estimate", "export", "find_batch", "train", "tune"}  # each trainwise.api.<verb>.<verb>


class _Package(types.ModuleType):
    """`trainwise.estimate` (and advise, train, tune, export, find_batch) is the API's call, though the library
    has modules of those names: importing `trainwise.estimate` would set the package's attribute to the
    module, so that one attribute is not set; code reaches the modules with `from trainwise.estimate
    import ...` or `importlib.import_module`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _VERBS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    # the API modules import the study machinery, which `import trainwise` and the CLI's bad-input paths never need
    if name in _VERBS:
        return getattr(importlib.import_module(f"trainwise.api.{name}"), name)
    if name == "open":
        from trainwise.api.study import open_study  # on first use: `import trainwise` stays light

        return open_study
    raise AttributeError(f"module 'trainwise' has no attribute {name!r}")
