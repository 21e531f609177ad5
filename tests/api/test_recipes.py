"""The five case studies as shipped study files (issue 37): each recipe says what it is, validates as its verb's
options, is listed by `trainwise recipes`, runs by name with flags over its keys, and a wrong name or verb is one
line, exit 2."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests import here
from trainwise.api import recipes
from trainwise.api.options import CompareOptions, TuneOptions
from trainwise.core.errors import ConfigError

OPTIONS = {"compare": CompareOptions, "tune": TuneOptions}


def cli(*argv: str) -> subprocess.CompletedProcess:
    return here.trainwise(
        *argv
    )  # in this process: its trials fork from the session's zygote, its cache is the session's


def test_every_case_study_has_a_recipe_its_verb_validates():
    """Every case study has a recipe that says what it is and validates as its verb's options."""
    found = {r.name: r for r in recipes.all_recipes()}
    assert {"seed-000", "seed-000-tune", "seed-001", "seed-002", "seed-003", "seed-004"} <= set(found)
    for r in found.values():
        assert r.verb in OPTIONS and all((r.question, r.rows, r.offline, r.published, r.to_publish)), r.name
        options = OPTIONS[r.verb].of({}, r.path)  # every key known, every value of its type
        if r.verb == "compare":
            cfg = options.resolve()[0]  # rows parsed by the registry, lengths and batches checked
            assert cfg.rows[0].is_baseline and len(cfg.rows) >= 4, r.name
        else:
            options.resolve()
    assert "fp16+grad_accum+grad_ckpt+adafactor" in CompareOptions.of({}, found["seed-001"].path).strategies
    assert CompareOptions.of({}, found["seed-003"].path).num_workers == "0,1,2,4"


def test_recipes_lists_each_with_its_question_and_both_scales():
    done = cli("recipes")
    assert done.returncode == 0, done.stderr
    for r in recipes.all_recipes():
        assert f"trainwise {r.verb} --recipe {r.name}" in done.stdout
    assert "published:" in done.stdout and "to publish:" in done.stdout and "bert-base-uncased" in done.stdout


@pytest.mark.parametrize(
    "argv, says",
    [
        (["compare", "--recipe", "seed-999"], "no such recipe; the recipes: seed-000"),
        (["compare", "--recipe", "seed-000-tune"], "is a recipe for `trainwise tune`"),
        (["tune", "--recipe", "seed-001"], "is a recipe for `trainwise compare`"),
        (["compare", "--recipe", "seed-001", "--config", "x.yaml"], "--recipe and --config: give one"),
    ],
)
def test_a_wrong_recipe_is_one_line_and_exit_2(argv, says):
    done = cli(*argv)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_recipe_for_compare_also_starts_a_plan():
    assert recipes.recipe("seed-004", "plan").verb == "compare"
    with pytest.raises(ConfigError, match="trainwise compare --recipe seed-001"):
        recipes.recipe("seed-001", "tune")


@pytest.mark.slow
def test_seed_004_runs_by_name_with_flags_over_its_keys(tmp_path):
    """The recipe's own model (the distilbert-base preset, new for it) trains; the flags shrink the study."""
    out = tmp_path / "s004"
    done = cli(
        "compare", "--recipe", "seed-004", "--out", str(out), "--strategies", "baseline,dynamic_pad+smart_batch",
        "--num-workers", "0", "--max-steps", "2", "--warmup-steps", "1", "--batch-size", "8", "--max-length", "32",
        "--max-train-samples", "64", "--eval-samples", "0", "--device", "cpu", "--no-remeasure",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["strategy"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"baseline", "dynamic_pad+smart_batch"} and all(r["status"] == "ok" for r in rows.values())
    # DistilBERT's 66M parameters: fp32 weights, gradients and AdamW's two moments, 16 bytes each
    assert 60e6 < rows["baseline"]["state_bytes"] / 16 < 70e6
    study = (out / "study.yaml").read_text()
    assert "model_preset: distilbert-base" in study and "max_steps: 2" in study  # the recipe, the flags over it


# the tiny preset of each recipe's model family, so every row of every recipe trains in seconds (seed 001's own
# model, the bundled MiniLM, is BERT's architecture: its six rows took 17-19 s; seed 000's quality phase as short as
# it goes)
TINY = {"seed-000": "bart-tiny", "seed-001": "bert-tiny", "seed-002": "t5-tiny", "seed-003": "resnext-tiny"}
# rows that build a DeepSpeed op on first use (CPU Adam, ~90 s once): left out here; the offload rows train in the
# ZeRO contract test under `make bench` (its `bench` entries), not at every commit
BUILDS = {"zero3_offload", "zero2_offload"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_every_recipe_row_trains_two_steps_on_a_tiny_preset(tmp_path, name):
    """A recipe can never rot: its rows, keys and verb run end to end (seed 004's in the test above, seed 000's tune
    in the next), with the tiny preset of its family and 2 steps a row."""
    r = recipes.recipe(name, "compare")
    rows = [row for row in CompareOptions.of({}, r.path).strategies.split(",") if row not in BUILDS]
    out = tmp_path / name
    tiny = ["--model-preset", TINY[name]]
    phase = ["--quality-steps", "2", "--seeds", "1"] if "quality_steps:" in r.path.read_text() else []
    done = cli(
        "compare", "--recipe", name, *tiny, "--strategies", ",".join(rows), "--num-workers", "0",
        "--max-steps", "2", "--warmup-steps", "1", "--batch-size", "8", "--max-train-samples", "64",
        "--max-length", "16", "--max-target-length", "8", "--eval-samples", "4", *phase, "--no-remeasure",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = {e["strategy"]: e["status"] for e in json.loads((out / "results.json").read_text())["rows"]}
    assert set(got) == set(rows), got
    assert all(s == "ok" for row, s in got.items() if "fp16" not in row), got  # fp16 needs CUDA: unsupported on a CPU


@pytest.mark.slow
def test_seed_000s_tune_recipe_runs_its_search(tmp_path):
    out = tmp_path / "tune"
    done = cli(
        "tune", "--recipe", "seed-000-tune", "--trials", "1", "--max-steps", "2", "--eval-every", "2",
        "--eval-samples", "4", "--max-length", "16", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "tune_result.json").read_text())
    assert [t["state"] for t in result["trials"]] == ["complete"], result["trials"]


@pytest.mark.probe
def test_the_estimate_knows_distilberts_shapes(tmp_path, monkeypatch):
    """The distilbert family is probed on a tiny config of its own shapes (estimate's FAMILY_KEYS), not on the
    whole model: seed 004's preset is estimated as fast as BERT's."""
    import importlib

    from transformers import DistilBertConfig

    from trainwise.estimating.probe import calibrate
    from trainwise.strategies.knobs import TrialPlan

    est = importlib.import_module("trainwise.estimating.probe")
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))  # a quarter of the design, in a cache of its own: the
    monkeypatch.setattr(est, "PROBE_DESIGN", est.PROBE_DESIGN[::4])  # shapes the probe builds, not the fit

    config = DistilBertConfig(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, num_labels=4)
    cal = calibrate(config, "classification", TrialPlan(), "cpu")
    assert cal.how == "tiny-config probe" and cal.family == "distilbert"


def test_a_saved_dataset_and_a_hub_name_with_its_config(tmp_path, monkeypatch):
    """`--dataset DIR` reads a directory saved by `datasets`' save_to_disk (its train and validation splits);
    `NAME:CONFIG` names a hub dataset's configuration; offline, a hub name says what to pass instead."""
    import datasets

    from trainwise.training.data.sources import data_source, hub_name, load_rows

    def split(n: int, start: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"text": [f"news item {i} about {'sport' if i % 2 else 'trade'}" for i in range(start, start + n)],
             "label": [i % 2 for i in range(start, start + n)]}
        )  # fmt: skip

    saved = tmp_path / "ag_news_like"
    datasets.DatasetDict({"train": split(40, 0), "validation": split(10, 100)}).save_to_disk(str(saved))
    train, evals, _reads = load_rows(str(saved), None, None, None, "label")
    assert (len(train), len(evals)) == (40, 10) and {r["target"] for r in train} == {"0", "1"}
    assert data_source(str(saved), None) == f"disk:{saved.resolve()}"
    plain = tmp_path / "plain"  # a directory of data files (not save_to_disk's): datasets' load_dataset reads it
    plain.mkdir()
    (plain / "train.csv").write_text("text,label\n" + "".join(f"row {i} text,{i % 2}\n" for i in range(30)))
    train, _evals, _reads = load_rows(str(plain), None, None, None, "label")
    assert 20 <= len(train) <= 30 and {r["target"] for r in train} == {"0", "1"}
    assert hub_name("wmt14:de-en") == ("wmt14", "de-en") and hub_name("samsum") == ("samsum", None)
    assert hub_name(str(saved)) == (str(saved), None)
    with pytest.raises(ConfigError, match="NAME:CONFIG"):
        hub_name("glue:")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"cannot load dataset 'samsum:plain'.*save_to_disk \(--dataset DIR\)"):
        load_rows("samsum:plain", None, None, None, None)


def test_pin_memory_is_inert_on_cpu_and_exported_as_measured():
    """Seed 004 measured pin_memory: a strategy (the baseline leaves batches unpinned, as PyTorch's DataLoader
    does), recorded inert on a machine without a GPU, exported as the Trainer's dataloader_pin_memory."""
    from trainwise import strategies
    from trainwise.strategies.base import ExportDoc, Runtime
    from trainwise.training.measure.device import facts

    pinned = strategies.parse_row("pin_memory", 1).plan
    verdict = strategies.support(pinned, facts("cpu"))["pin_memory"]
    assert verdict.status == "inert" and "no copy to a GPU" in verdict.reason
    assert "pin_memory" not in strategies.support(strategies.parse_row("baseline", 1).plan, facts("cpu"))
    knob = strategies.KNOBS["pin_memory"]
    rt = Runtime("classification", "cuda")
    knob.runtime(True, rt)
    assert rt.pin_memory is True
    for value in (True, False):
        doc = ExportDoc("classification", "cuda", 1, 8, 32, {})
        knob.export(value, doc)
        assert doc.args["dataloader_pin_memory"] is value


def test_the_api_names_a_recipe_by_its_file():
    import trainwise

    assert trainwise.recipe("seed-001") == recipes.DIR / "seed-001.yaml"
    with pytest.raises(ConfigError, match="no such recipe"):
        trainwise.recipe("nope")
