"""--profile: a torch.profiler trace of a trial's training steps, and named phase ranges.

The loop marks its phases (data, forward, backward, optimizer) with `Tracer.range`. On CUDA the
ranges are NVTX ranges too, so `nsys profile trainwise compare ...` shows them (seed 003 used nsys).
With a trace path, torch.profiler records the training steps (CPU, plus CUDA kernels on a GPU) and
writes a Chrome / Perfetto JSON trace (open it in chrome://tracing or ui.perfetto.dev).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch


class Tracer:
    def __init__(self, path: Path | None, cuda: bool):
        self.path, self.cuda = path, cuda
        self._profiler: torch.profiler.profile | None = None

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.cuda:
                stack.enter_context(torch.cuda.nvtx.range(name))
            if self._profiler is not None:
                stack.enter_context(torch.profiler.record_function(name))
            yield

    def start(self) -> None:
        if self.path is not None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=False)
            self._profiler.__enter__()

    def stop(self) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._profiler.export_chrome_trace(str(self.path))
            self._profiler = None
