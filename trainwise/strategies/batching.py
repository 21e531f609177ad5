"""How samples are grouped and padded into batches (the baseline pads every batch to max length)."""

from trainwise.strategies.base import TEXT_TASKS, Strategy

STRATEGIES = [
    Strategy(
        "dynamic_pad",
        "pad each batch to its longest sample instead of max length; less padding compute, batch shapes vary",
        lambda plan, _n: plan.with_(padding="longest"),
        tasks=TEXT_TASKS,
    ),
    Strategy(
        "smart_batch",
        "length-grouped batches (shuffled mega-batches sorted by length) + dynamic padding; "
        "least padding, batches less random",
        lambda plan, _n: plan.with_(padding="longest", sampler="length_grouped"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"sortish"}),
    ),
    Strategy(
        "sortish",
        "fastai / old HF Seq2Seq sortish sampler: random chunks sorted by length, longest batch first "
        "(an OOM shows at step 1) + dynamic padding; less padding, batches less random",
        lambda plan, _n: plan.with_(padding="longest", sampler="sortish"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"smart_batch"}),
    ),
]
