"""Issue 35: each option is declared once. The CLI's flags, the Python API's keyword arguments (a verb's
Options fields) and the library configs' fields share one declaration per option: the same help and default
objects, not copies that can drift. Fast: nothing is trained."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import typer

from trainwise.api import options as api
from trainwise.api.groups import given_fields
from trainwise.cli import app
from trainwise.core.config import TrainConfig
from trainwise.core.option import declared, option, take
from trainwise.estimating.data import EstimateConfig
from trainwise.exporting.scripts import ExportConfig
from trainwise.search.batch_size import FindBatchConfig
from trainwise.search.hyperparams import TuneConfig
from trainwise.spec import groups
from trainwise.spec.config import StudyConfig

GROUPS = (groups.Model, groups.Data, groups.ModelData, groups.Batch, groups.Lengths, groups.Shape)
GROUPS += (groups.Training, groups.Measurement, groups.Scale)
CONFIGS = (*GROUPS, StudyConfig, TrainConfig, EstimateConfig, ExportConfig, TuneConfig, FindBatchConfig)
VERBS = {
    cls.VERB: cls for cls in vars(api).values() if isinstance(cls, type) and issubclass(cls, api.Options) and cls.VERB
}


def test_every_verb_has_options():
    assert set(VERBS) == {
        *("compare", "advise", "plan", "estimate", "export", "find-batch", "train", "tune", "doctor", "env", "report"),
    }


def _declaration(f: dataclasses.Field) -> dataclasses.Field:
    """The field that declares the option `f` is (itself, or the field named in its `source`: a library config's, or
    a verb's own option another verb takes, as plan takes advise's constraints)."""
    source = f.metadata.get("source")
    if source is None:
        return f
    owner, name = source.split(".")
    config = next(c for c in (*CONFIGS, api.Limits, *VERBS.values()) if c.__name__ == owner)
    found = declared(config, name)
    assert "source" not in found.metadata, f"{source} is itself taken from {found.metadata['source']}"
    return found


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_verbs_options_share_the_configs_declarations(verb):
    """Every option a verb takes from a library config has that config field's help, flags and default (the
    same objects), unless the verb names its own (`take(..., default=)` / `help=`, marked in the metadata)."""
    for f in given_fields(VERBS[verb]):
        d = _declaration(f)
        assert "help" in f.metadata and f.metadata["help"], f"{verb} --{f.name} has no help"
        assert f.metadata["flags"] is d.metadata["flags"], f.name
        if not f.metadata.get("verb_help"):
            assert f.metadata["help"] is d.metadata["help"], f"{verb} --{f.name}: a copy of the help"
        else:
            assert f.metadata["help"] != d.metadata["help"], f"{verb} --{f.name}: its own help is the declaration's"
        if not f.metadata.get("verb_default"):
            assert f.default is d.metadata["default"], f"{verb} --{f.name}: a copy of the default"
        assert f.default is f.metadata["default"]


def test_no_help_text_is_written_twice():
    """Two declarations never carry the same help: an option several verbs or configs offer is taken from its
    one declaration (the same text object), not re-typed (an equal text, another object)."""
    written: dict[int, tuple[str, str]] = {}  # a help text object -> where it is first met
    for owner in (*CONFIGS, *VERBS.values()):
        for f in dataclasses.fields(owner):
            if "help" in f.metadata:
                written.setdefault(id(f.metadata["help"]), (f"{owner.__name__}.{f.name}", f.metadata["help"]))
    by_text: dict[str, list[str]] = defaultdict(list)
    for where, text in written.values():
        by_text[text].append(where)
    twice = {text: places for text, places in by_text.items() if len(places) > 1}
    assert not twice, twice


def test_a_field_shared_by_configs_is_one_option():
    """EstimateConfig, ExportConfig and TuneConfig read some of StudyConfig's options (the data, the batch, the
    seed): they take them, so a default changed in StudyConfig changes everywhere."""
    assert _declaration(declared(EstimateConfig, "accum_steps")) is declared(StudyConfig, "accum_steps")
    assert _declaration(declared(ExportConfig, "zero")) is declared(EstimateConfig, "zero")
    assert _declaration(declared(TuneConfig, "seed")) is declared(StudyConfig, "seed")
    estimate = EstimateConfig(strategies=("baseline",))
    assert estimate.accum_steps == StudyConfig(out="x", strategies=["baseline"]).accum_steps


def test_the_clis_flags_are_the_options():
    """Each verb's command has one parameter per option, with the option's help and default objects (and
    --config, --recipe, --json, --help besides)."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for verb, cls in VERBS.items():
        params = {p.name: p for p in commands[verb].params}
        own = {f.name: f for f in given_fields(cls)}
        assert set(params) - {"ctx", "config", "recipe", "as_json", "help"} == set(own), verb
        for name, f in own.items():
            p = params[name]
            assert p.help is f.metadata["help"], f"{verb} --{name}"
            if f.default is not dataclasses.MISSING:
                assert p.default is f.default, f"{verb} --{name}"


def test_the_apis_defaults_are_the_options():
    """A verb called with nothing but what it requires has every option at its declared default."""
    required = {"advise": {"study": ["s"]}, "report": {"study": "s"}}
    required["tune"] = {"space": "{lr: {low: 1.0e-5, high: 1.0e-3}}"}  # TuneConfig reads it as the options are made
    required["export"] = {"strategies": "bf16"}  # ExportConfig's check, run as the options are made
    for verb, cls in VERBS.items():
        made = cls.of(required.get(verb, {}))
        for f in given_fields(cls):
            if f.default is not dataclasses.MISSING and f.name not in required.get(verb, {}):
                assert getattr(made, f.name) is f.default, f"{verb} {f.name}"


def test_take_refuses_what_is_not_an_option():
    @dataclasses.dataclass
    class Config:
        plain: int = 1
        told: int = option(2, "An option.")

    with pytest.raises(TypeError, match="Config.plain is not an option"):
        take(Config, "plain")
    taken = take(Config, "told", default=3)
    assert (taken.default, taken.metadata["verb_default"], taken.metadata["source"]) == (3, True, "Config.told")


def test_an_option_is_written_once_in_the_package():
    """Issue 60: the verbs and the configs inherit the groups and configs they read (spec/groups.py); a field is
    re-stated with `take` only where a class offers it with its own default, words or type, or alone out of a group.
    The package's count of `take(` stays within the issue's 40 (other functions named take included)."""
    import pathlib

    import trainwise

    root = pathlib.Path(trainwise.__file__).parent
    found = sum(p.read_text(encoding="utf-8").count("take(") for p in root.rglob("*.py"))
    assert found <= 40, found
    # one declaration, inherited: max_length is the same field object's metadata in every verb that reads it
    readers = ("compare", "plan", "train", "tune", "advise", "export", "find-batch")
    helps = {id(declared(VERBS[verb], "max_length").metadata["help"]) for verb in readers}
    assert len(helps) == 1


def test_a_verb_built_on_a_config_checks_as_the_config_does():
    """The verbs that inherit a library config (export, find-batch, train, tune) refuse its bad values as the options
    are made, with the config's own line; the text a config parses (a memory limit, a comma list) it parses once."""
    from trainwise.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--memory-limit 'lots'"):
        api.FindBatchOptions.of({"memory_limit": "lots"})
    assert api.FindBatchOptions.of({"memory_limit": "1GB"}).resolve().limit == 10**9
    with pytest.raises(ConfigError, match="--keep-checkpoints must be >= 1"):
        api.TrainOptions.of({"keep_checkpoints": 0})
    assert api.TrainOptions.of({"keep_checkpoints": 3, "epochs": 2}).train_config().keep_checkpoints == 3
    with pytest.raises(ConfigError, match="--strategies is required without --study"):
        api.ExportOptions.of({})
    with pytest.raises(ConfigError, match="--trials must be > 0"):
        api.TuneOptions.of({"space": "{lr: {low: 1.0e-5, high: 1.0e-3}}", "trials": 0})
    with pytest.raises(ConfigError, match="--max-trials must be >= 1"):
        api.PlanOptions.of({"max_trials": 0})
    estimate = EstimateConfig(strategies="baseline,bf16", device_memory="2GB")
    assert (estimate.rows, estimate.budget) == (("baseline", "bf16"), 2 * 10**9)


def test_advise_runs_compare_with_the_data_it_is_given():
    """advise --run runs compare with the model, data and shape groups (a prompt/response file's columns, its
    lengths), not only the few options it once took."""
    given = {"study": ["s"], "run": True, "task": "causal-lm", "model_preset": "llama-tiny", "train_file": "qa.csv"}
    given |= {"prompt_column": "question", "response_column": "answer", "max_length": 64, "truncation": "keep_end"}
    compare = api.AdviseOptions.of(given).compare_options()
    assert (compare.prompt_column, compare.response_column) == ("question", "answer")
    assert (compare.max_length, compare.truncation, compare.out) == (64, "keep_end", "s")
    tune = api.TuneOptions.of(
        {"space": "{lr: {low: 1.0e-5, high: 1.0e-3}}", "task": "seq2seq", "max_target_length": 20}
    )
    assert tune.resolve()[1].max_target_length == 20  # tune reads the lengths group too


def test_help_lists_the_model_and_data_then_the_verbs_own_then_the_shared_groups():
    """--help's (and a study file's) order: what a verb inherits from its library config counts as its own (train's
    schedule before the shape it shares with compare; export's plan before the batch)."""
    for cls, own, shared in ((api.TrainOptions, "epochs", "batch_size"), (api.ExportOptions, "study", "batch_size")):
        names = [f.name for f in cls.ordered()]
        assert names[:3] == ["model", "model_preset", "task"], cls.VERB
        assert names.index(own) < names.index(shared), cls.VERB
    names = [f.name for f in api.PlanOptions.ordered()]
    assert max(names.index("max_trials"), names.index("objective")) < names.index("max_steps")
