"""trainwise: controlled trials of training strategies, measured honestly.

The Python API (docs/python-api.md): `trainwise.compare(...)` runs a study as `trainwise compare` does
and returns it; `trainwise.open(path)` reads one; `advise`, `plan`, `estimate`, `find_batch`, `export`,
`train`, `tune`, `doctor` and `env` are the other verbs, each with the CLI's options as keyword arguments (and
`config=` a study file; `trainwise.recipe(name)` is a shipped one's path). They are looked up on first use,
so that `import trainwise` (and the CLI's start) stays light.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any

# bitsandbytes 0.50.2, imported on a CPU with avx512_bf16 (by every `import peft` once it is installed, in any
# process: a trial, the zygote, the study), warns that an optional Hub kernel (the `kernels` package) is missing and
# falls back to its own C kernels: noise on every row. Set here, before anything can import it.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


class _DropMessages(logging.Filter):
    def __init__(self, *starts: str):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


# DeepSpeed (imported by accelerate and transformers in every process once installed) logs "Setting accelerator to
# CPU. If you have GPU ..." to STDOUT on a machine without a GPU: the first line of the table's stream. Its logger
# sets its own level and handler when deepspeed is imported, but keeps a filter put on it before: only this line is
# dropped (trainwise says the device itself), DeepSpeed's other warnings still show.
logging.getLogger("DeepSpeed").addFilter(_DropMessages("Setting accelerator to CPU"))
# peft reads the deprecated `model.is_gradient_checkpointing` when it wraps a model (LoRA, QLoRA), and transformers 5
# warns on every read: a FutureWarning about peft's code, not the user's, under compare, train and estimate
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

__version__ = "0.1.0"
__all__ = [
    "advise",
    "compare",
    "doctor",
    "env",
    "estimate",
    "export",
    "find_batch",
    "open",
    "plan",
    "recipe",
    "train",
    "tune",
]
# each trainwise.api.<verb>.<verb>: a verb exists only there, so no module of the package shadows one of these names
_VERBS = {"advise", "compare", "doctor", "env", "estimate", "export", "find_batch", "plan", "train", "tune"}


def __getattr__(name: str) -> Any:
    # the API modules import the study machinery, which `import trainwise` and the CLI's bad-input paths never need
    if name in _VERBS:
        return getattr(importlib.import_module(f"trainwise.api.{name}"), name)
    if name == "open":
        from trainwise.api.study import open_study  # on first use: `import trainwise` stays light

        return open_study
    if name == "recipe":  # a shipped study file by name: trainwise.compare(config=trainwise.recipe("seed-001"))
        from trainwise.api.recipes import recipe  # on first use: `import trainwise` stays light

        return lambda name, verb=None: recipe(name, verb).path
    raise AttributeError(f"module 'trainwise' has no attribute {name!r}")
