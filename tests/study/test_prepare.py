"""A trial child's settings: an option declared on StudyConfig reaches TrialSettings by its name, once."""

import dataclasses

from trainwise.core.config import TrialSettings
from trainwise.spec.config import StudyConfig
from trainwise.study.prepare import STUDY_ONLY, shared_settings


def test_every_shared_option_reaches_the_trial_settings_by_name(tmp_path):
    cfg = StudyConfig(
        out=str(tmp_path),
        strategies=["baseline"],
        batch_size=4,
        accum_steps=3,
        max_length=77,
        max_target_length=33,
        warmup_steps=2,
        lr=0.01,
        seed=9,
        eval_samples=5,
        profile=True,
    )
    copied = shared_settings(cfg, exclude={"device"})
    shared = {f.name for f in dataclasses.fields(StudyConfig)} & {f.name for f in dataclasses.fields(TrialSettings)}
    assert set(copied) == shared - STUDY_ONLY - {"device"}
    assert copied["max_length"] == 77 and copied["accum_steps"] == 3 and copied["profile"] is True
    assert all(copied[name] == getattr(cfg, name) for name in copied)


def test_a_per_cell_setting_is_not_copied_from_the_study(tmp_path):
    cfg = StudyConfig(out=str(tmp_path), strategies=["baseline"], num_workers=(0, 2))
    assert "num_workers" not in shared_settings(cfg)
