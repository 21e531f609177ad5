"""The environment stored beside every figure: device, library versions, commit."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path


def package_version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


KIND_LABEL = "TRAINWISE_NODE_KIND"  # a machine's own name for its device kind, where its operator gives one


def device_kind(device: str, cpus: int | None = None) -> str:
    """The kind of device a row is measured on, what rows are compared within: the operator's label, else the GPU's
    name, else the CPU's model with the CPUs a trial gets (`cpus`; default: those this process may run on)."""
    if label := os.environ.get(KIND_LABEL, "").strip():
        return label
    if device == "cuda":
        import torch  # heavy: torch, only for a GPU

        return torch.cuda.get_device_name(0)
    return f"{cpu_name()}, {cpus or len(os.sched_getaffinity(0))} CPUs"


@cache
def git_commit() -> str | None:
    """The commit of trainwise's own checkout (None where trainwise is not run from one: an installed package whose
    folder lies inside another repository, a user's project with its .venv, records no commit of that project)."""
    repo = Path(__file__).resolve().parents[2]  # trainwise/core/env.py -> the checkout
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != repo:
        return None
    out.stdout = lines[1]
    dirty = subprocess.run(
        # "-dirty" means the code differs from the commit; edits to docs do not count
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", "trainwise"],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def environment(device: str) -> dict[str, object]:
    import torch  # heavy: torch

    if device == "cuda":
        name = torch.cuda.get_device_name()
        cuda = torch.version.cuda
    else:
        name, cuda = cpu_name(), None
    return {
        "device": device,
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "transformers": package_version("transformers"),
        "accelerate": package_version("accelerate"),
        "trainwise": package_version("trainwise"),
        "commit": git_commit(),
        "platform": platform.platform(),
        "host": platform.node(),
        "device_kind": device_kind(device),  # rows are compared within a kind (a study over several machines)
        # a trial forked from the zygote (torch imported before the fork) or a fresh interpreter: the RSS
        # of a forked one leaves out the pages only the import touched (docs/measurement.md)
        "process": "forked" if os.environ.get("TRAINWISE_FORKED") == "1" else "fresh",
    }
