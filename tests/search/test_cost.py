"""Cost: price x time, low-priority re-work, the price table and its override file, bad input."""

from __future__ import annotations

import json

import pytest

from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.core.results import StudyRow
from trainwise.report.format import add_cost, headers
from trainwise.search.cost import Price, resolve_price
from trainwise.study.store import read_rows


def test_dedicated_and_low_priority_costs_at_seed_000_prices():
    dedicated = resolve_price(None, "ND40rs_v2")
    assert dedicated is not None and dedicated.per_hour == 22.03 and dedicated.rework_factor() == 1.0
    assert dedicated.cost(2 * 3600) == pytest.approx(44.06)
    spot = resolve_price(None, "ND40rs_v2", low_priority=True, preemptions_per_hour=0.5, checkpoint_minutes=30)
    assert spot is not None and spot.per_hour == 4.41
    # each preemption loses half a checkpoint interval (15 min) + a 5 min restart: 0.5/h x 20 min = +1/6
    assert spot.rework_factor() == pytest.approx(1 + 0.5 * (0.25 + 5 / 60))
    assert spot.cost(2 * 3600) == pytest.approx(4.41 * 2 * (1 + 0.5 * (0.25 + 5 / 60)))
    assert spot.cost(3600) < dedicated.cost(3600) / 4, "seed 000: low priority is ~5x cheaper even with re-work"
    assert resolve_price(None, None) is None


def test_a_price_file_adds_and_overrides_skus(tmp_path):
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"mybox": {"dedicated": 1.5}, "ND40rs_v2": {"dedicated": 20.0}}))
    assert resolve_price(None, "mybox", str(f)).per_hour == 1.5
    nd = resolve_price(None, "ND40rs_v2", str(f), low_priority=True)
    assert nd.per_hour == 4.41, "fields the file does not give keep the built-in value"
    assert resolve_price(None, "ND40rs_v2", str(f)).per_hour == 20.0


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"price_per_hour": 3.0, "sku": "ND40rs_v2"}, "either --price-per-hour or --sku"),
        ({"price_per_hour": -1.0}, "--price-per-hour must be a finite number > 0"),
        ({"sku": "H100x8"}, "not in the price table .ND40rs_v2.; add it with --price-file"),
        ({"sku": "ND40rs_v2", "price_file": "/nonexistent.json"}, "not found"),
        ({"low_priority": True}, "--low-priority and --price-file need --sku"),
        ({"sku": "ND40rs_v2", "preemptions_per_hour": -2}, "--preemptions-per-hour must be a finite number >= 0"),
    ],
)
def test_bad_price_input(kw, message):
    args = {"price_per_hour": None, "sku": None, **kw}
    with pytest.raises(ConfigError, match=message):
        resolve_price(**args)


def test_priced_tables_get_a_cost_column_and_a_note():
    table = [StudyRow("baseline", status="ok", epoch_time_s=1800.0), StudyRow("x", status="oom")]
    table = add_cost(table, Price(10.0, "$10/h"))
    assert headers(table)[-1] == "$/epoch" and table[0].cost_per_epoch == pytest.approx(5.0)
    assert table[1].cost_per_epoch is None and table[1].to_dict()["cost_per_epoch"] is None
    assert headers([StudyRow("a")])[-1] == "MFU", "no price, no column"


def test_compare_reports_cost_per_row(tmp_path, cls_csv, capsys):
    out = tmp_path / "s"
    argv = ["compare", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--strategies", "baseline"]
    argv += ["--max-steps", "2", "--warmup-steps", "1", "--eval-samples", "0", "--batch-size", "8", "--device", "cpu"]
    assert main([*argv, "--sku", "ND40rs_v2", "--low-priority", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "$/epoch" in printed and "$4.41/h ND40rs_v2 low-priority, x1.167 expected re-work" in printed
    row = read_rows(out / "results.json")[0]
    assert row["cost_per_epoch"] == pytest.approx(4.41 * row["epoch_time_s"] / 3600 * (1 + 0.5 * (0.25 + 5 / 60)))
    assert "$/epoch" in (out / "report.md").read_text()
    assert main([*argv, "--sku", "nope", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_a_sku_for_other_hardware_is_said_in_the_note():
    """Issue 17: a GPU SKU's price applied to a CPU run (or a V100's to an H100 run) says so."""
    from trainwise.search.cost import resolve_price

    sku = resolve_price(None, "ND40rs_v2")
    assert sku is not None and sku.hardware == "8x V100 32GB (seed 000)"
    rows = lambda device: [StudyRow("baseline", epoch_time_s=60.0, env={"device_name": device})]  # noqa: E731
    for device in ("Intel(R) Xeon(R) Processor", "NVIDIA H100 80GB HBM3"):
        [row] = add_cost(rows(device), sku)
        assert f"the times were measured on {device}" in (row.cost_note or "")
        assert "not a prediction for it" in (row.cost_note or "")
    [row] = add_cost(rows("Tesla V100-SXM2-32GB"), sku)
    assert "note" not in (row.cost_note or ""), "the SKU's own GPU: no note"
    [row] = add_cost(rows("Intel(R) Xeon(R) Processor"), resolve_price(3.0, None))
    assert row.cost_note == "$3/h", "a bare price names no hardware"
