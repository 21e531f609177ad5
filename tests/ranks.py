"""Run under torchrun by tests/strategies/test_contract.py: each spec as compare's trial and as train's run, on every
rank.

python -m torch.distributed.run --nproc_per_node=2 -m tests.ranks SPECS.json LOSSES.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from trainwise.run.events import Step
from trainwise.spec.config import TrialSpec
from trainwise.training.fit import TrainConfig, TrainJob, run_train
from trainwise.training.trial import run_trial


def main(specs_path: str, out_path: str) -> None:
    rank = int(os.environ["RANK"])
    losses = {}
    for blob in json.loads(Path(specs_path).read_text()):
        spec = TrialSpec.from_dict(blob)
        measured: list[float] = []
        r = run_trial(spec, progress=lambda e, m=measured: m.append(e.loss) if isinstance(e, Step) else None)
        trained: list[float] = []
        tc = TrainConfig(epochs=10, max_steps=spec.steps, eval_every=1, checkpoints=False)
        with tempfile.TemporaryDirectory() as out:  # each rank its own run directory
            on_event = lambda e, t=trained: t.append(e.loss) if isinstance(e, Step) else None  # noqa: E731
            run_train(TrainJob(spec, tc, Path(out)), on_event)
        losses[spec.row] = [measured, trained, r.state_bytes, r.n_params]
    if rank == 0:
        Path(out_path).write_text(json.dumps(losses))


if __name__ == "__main__":
    main(*sys.argv[1:])
