"""A device's facts, as the strategies' verdicts read them (measured by trainwise.training.measure.device)."""

from __future__ import annotations

from dataclasses import dataclass, field

# the CPU flags that decide a 16-bit precision's verdict (the rest of /proc/cpuinfo's list is not kept)
PRECISION_FLAGS = ("avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "avx512f", "avx2", "amx_tile")


@dataclass(frozen=True)
class DeviceFacts:
    kind: str  # "cpu" | "cuda"
    name: str  # the CPU model or the GPU's name
    cpu_flags: frozenset[str] = field(default_factory=frozenset)  # PRECISION_FLAGS the CPU reports
    capability: tuple[int, int] | None = None  # CUDA compute capability (major, minor)
    memory_bytes: int | None = None  # the GPU's memory, or the machine's RAM
    injected: bool = False  # facts given by TRAINWISE_CPU_FLAGS / TRAINWISE_CUDA_CAPABILITY, not read

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "cpu_flags": sorted(self.cpu_flags),
            "capability": ".".join(map(str, self.capability)) if self.capability else None,
            "memory_bytes": self.memory_bytes,
            "injected": self.injected,
        }
