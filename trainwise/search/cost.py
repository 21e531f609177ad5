"""What a row or a run costs: machine price x time, and for low-priority (spot) machines the work
a preemption throws away.

Prices come from `--price-per-hour`, or `--sku NAME` looked up in the built-in table below, which
a JSON file (`--price-file`) extends or overrides: {"NAME": {"dedicated": 22.03, "low_priority":
4.41, "device": "8x V100"}}. The built-in table holds only prices a seed case study quoted.

Low-priority re-work (first order, Poisson preemptions): a job of T hours that checkpoints every C
hours and is preempted `rate` times per hour loses on average C/2 of work plus a restart overhead R
per preemption, so it runs T x (1 + rate x (C/2 + R)) hours.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from trainwise.core.errors import ConfigError, check_number, read_json

# seed 000: Azure ND40rs_v2 (8x V100 32 GB), pay-as-you-go vs low-priority, USD per hour
BUILTIN_PRICES: dict[str, dict] = {
    "ND40rs_v2": {"dedicated": 22.03, "low_priority": 4.41, "device": "8x V100 32GB (seed 000)"},
}


@dataclass(frozen=True)
class Price:
    per_hour: float  # USD per machine-hour, of the tier in use
    label: str  # what to print: "$22.03/h ND40rs_v2 dedicated"
    low_priority: bool = False
    preemptions_per_hour: float = 0.0
    checkpoint_hours: float = 0.0
    restart_hours: float = 0.0
    hardware: str | None = None  # what the SKU is, from the price table ("8x V100 32GB"), when it says

    def flags(self) -> list[str]:
        """The options that price a command the same way (the SKU's resolved price, its tier, and the
        re-work assumptions of a low-priority machine)."""
        flags = ["--price-per-hour", f"{self.per_hour:g}"]
        if self.low_priority:
            flags += ["--low-priority", "--preemptions-per-hour", f"{self.preemptions_per_hour:g}"]
            flags += ["--checkpoint-minutes", f"{60 * self.checkpoint_hours:g}"]
        return flags

    def mismatch(self, device_name: str) -> str | None:
        """A line when the SKU's hardware is not the device the figures were measured on (a GPU SKU's
        price on a CPU run, a V100 machine's on an H100): the cost is then this machine's times at that
        machine's rate, not what the SKU would cost."""
        if not self.hardware:
            return None
        models = re.findall(r"[A-Z]+\d{2,4}[A-Za-z]*", self.hardware)  # V100, A100, H100, MI300X
        if models and any(m.lower() in device_name.lower() for m in models):
            return None
        return (
            f"the price is for {self.hardware}, but the times were measured on {device_name}: "
            "$ = these times at that machine's rate, not a prediction for it"
        )

    def rework_factor(self) -> float:
        """Expected wall time over the preemption-free time (1 for dedicated machines)."""
        if not self.low_priority:
            return 1.0
        return 1.0 + self.preemptions_per_hour * (self.checkpoint_hours / 2 + self.restart_hours)

    def cost(self, seconds: float) -> float:
        return self.per_hour * seconds / 3600 * self.rework_factor()


def load_prices(price_file: str | None) -> dict[str, dict]:
    prices = {k: dict(v) for k, v in BUILTIN_PRICES.items()}
    if price_file is None:
        return prices
    extra = read_json(price_file, "a price table", option="--price-file")
    if not isinstance(extra, dict):
        raise ConfigError(f'--price-file {price_file}: expected {{"SKU": {{"dedicated": USD/h, ...}}}}')
    for sku, entry in extra.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("dedicated"), int | float):
            raise ConfigError(f"--price-file {price_file}: {sku!r} needs a numeric 'dedicated' USD/h price")
        prices[sku] = {**prices.get(sku, {}), **entry}
    return prices


def resolve_price(
    price_per_hour: float | None,
    sku: str | None,
    price_file: str | None = None,
    low_priority: bool = False,
    preemptions_per_hour: float = 0.5,
    checkpoint_minutes: float = 30.0,
    restart_minutes: float = 5.0,
) -> Price | None:
    """The price to report with, or None when none was asked for. Validates every input."""
    if price_per_hour is not None and sku is not None:
        raise ConfigError("give either --price-per-hour or --sku, not both")
    check_number("--preemptions-per-hour", preemptions_per_hour, inclusive=True)
    check_number("--checkpoint-minutes", checkpoint_minutes, inclusive=True)
    check_number("--restart-minutes", restart_minutes, inclusive=True)

    def price(per_hour: float, label: str) -> Price:
        return Price(per_hour, label, low_priority, preemptions_per_hour, checkpoint_minutes / 60, restart_minutes / 60)

    if price_per_hour is not None:
        check_number("--price-per-hour", price_per_hour)
        tier = " low-priority" if low_priority else ""
        return price(price_per_hour, f"${price_per_hour:g}/h{tier}")
    if sku is None:
        if low_priority or price_file:
            raise ConfigError("--low-priority and --price-file need --sku (or give --price-per-hour)")
        return None
    prices = load_prices(price_file)
    if sku not in prices:
        raise ConfigError(
            f"--sku {sku!r}: not in the price table ({', '.join(sorted(prices))}); add it with --price-file"
        )
    entry = prices[sku]
    key = "low_priority" if low_priority else "dedicated"
    if key not in entry:
        raise ConfigError(f"--sku {sku!r} has no {key.replace('_', '-')} price; add one with --price-file")
    per_hour = float(entry[key])
    priced = price(per_hour, f"${per_hour:g}/h {sku} {key.replace('_', '-')}")
    return dataclasses.replace(priced, hardware=entry.get("device"))
