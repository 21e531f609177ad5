"""Optimizer choice."""

from trainwise.strategies.base import Strategy

STRATEGIES = [
    Strategy(
        "adafactor",
        "Adafactor (factored second moments, no first moment) instead of AdamW; optimizer state "
        "~8 bytes/param -> ~0, may converge differently",
        lambda plan, _n: plan.with_(optimizer="adafactor"),
    ),
]
