"""Freeze parts of the model (or all of it but LoRA adapters): no gradients, no optimizer state for them."""

from trainwise.plan import TrialPlan
from trainwise.strategies.base import TEXT_TASKS, Strategy


def _freeze(part: str):
    def apply(plan: TrialPlan, _n: int) -> TrialPlan:
        return plan.with_(freeze=tuple(sorted({*plan.freeze, part})))

    return apply


STRATEGIES = [
    Strategy(
        "freeze_embeddings",
        "freeze the embedding module(s); saves their grads + optimizer state, usually small quality "
        "effect (seed 000: higher ROUGE per epoch)",
        _freeze("embeddings"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"lora"}),
    ),
    Strategy(
        "freeze_encoder",
        "freeze the encoder stack; large cut in grads, optimizer state and backward time "
        "(seed 000: -5 GB on BART-large), quality may drop",
        _freeze("encoder"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"lora"}),
    ),
    Strategy(
        "freeze_layers",
        "freeze the embeddings and the first N layers (freeze_layers=N, default half of them), keeping the "
        "lower layers' pretrained features; their grads and optimizer state go away, quality may drop",
        lambda plan, _n: plan.with_(freeze_layers=-1),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"lora", "freeze_encoder"}),
        with_value=lambda plan, n: plan.with_(freeze_layers=n),
    ),
    Strategy(
        "lora",
        "LoRA adapters (rank 8) on the attention query/value projections, the rest frozen (the head "
        "trains); grads and optimizer state shrink to ~1-2% of the model; adapts less than full fine-tuning",
        lambda plan, _n: plan.with_(lora_r=8),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"freeze_embeddings", "freeze_encoder", "freeze_layers"}),
        packages=frozenset({"peft"}),
    ),
]
