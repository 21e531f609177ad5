"""A study's trials on a Ray cluster (`--ray-address`, trainwise.run.cluster): a local cluster of two nodes started here
on loopback addresses other than 127.0.0.1 (Ray rewrites that one to the host's address), each held to a CPU of
its own, with a token made here (never ~/.ray); a study lands on both, a node killed mid-trial is a row and the
study finishes; nodes of two device kinds each get the baseline and the table compares within a kind; tune's
trials run side by side (random search, and PBT's members), find-batch's probes on the cluster. The test that kills
a node runs last."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import here
from trainwise.core.env import KIND_LABEL
from trainwise.core.errors import ConfigError
from trainwise.core.results import TrialResult
from trainwise.run import cluster
from trainwise.spec.config import TrialSpec
from trainwise.study.aggregate import aggregate
from trainwise.study.run import per_kind

pytestmark = pytest.mark.slow

HEAD, WORKER, THIRD = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two nodes of one CPU each (the head on CPU 0, a worker on CPU 1), token authentication on. The head checks
    its nodes every second and calls one dead after 3 failed checks (Ray's defaults: 3 s and 5), so the killed
    node's trial is a row seconds after the kill, as Ray's own tests of node death do."""
    env, home = here.ray_env(tmp_path_factory.mktemp("cluster"))
    env |= {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    port = here.free_port(HEAD)
    head = ["--head", f"--node-ip-address={HEAD}", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"]
    with here.ray_node(env, *head, cpus="0"):
        join = [f"--address={HEAD}:{port}", "--num-cpus=1"]
        with here.ray_node(env, *join, f"--node-ip-address={WORKER}", cpus="1") as worker:
            yield {"env": env, "address": f"{HEAD}:{port}", "worker": worker, "join": join, "home": home}


def _study(rows: str, *more: str) -> list[str]:
    """A tiny compare study's options (no cluster, no --out)."""
    argv = ["compare", "--model-preset", "bert-tiny", "--strategies", rows, "--max-steps", "4", "--warmup-steps", "1"]
    return [*argv, "--eval-samples", "16", "--device", "cpu", "--retries", "0", *more]


def _compare(c: dict, out: Path, rows: str, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainwise.cli",
        *_study(rows, *more),
        "--ray-address",
        c["address"],
        "--out",
        str(out),
    ]


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["rows"]


def _trials_running(text: str) -> list[int]:
    pids = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if text in (p / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


# the grouping is the unit tests' below (aggregate, per_kind) in CI; a third node of its own kind in `make bench`
@pytest.mark.bench
def test_nodes_of_two_device_kinds_each_measure_the_baseline(ray_cluster, tmp_path):
    """A node that says it is another kind of device (TRAINWISE_NODE_KIND): the baseline runs on each kind, and
    each row is compared with its own kind's baseline."""
    c = ray_cluster
    env = {**c["env"], KIND_LABEL: "other-device"}
    with here.ray_node(env, *c["join"], f"--node-ip-address={THIRD}", cpus="1"):
        out = tmp_path / "kinds"
        run = subprocess.run(
            _compare(c, out, "baseline,smart_batch", "--no-remeasure"), env=c["env"], capture_output=True, text=True
        )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = _rows(out)
    kinds = {r.get("device_kind") for r in rows}
    assert "other-device" in kinds and len(kinds) == 2, rows
    for kind in kinds:
        mine = [r for r in rows if r.get("device_kind") == kind]
        base = [r for r in mine if r["baseline"]]
        assert len(base) == 1 and base[0]["rel_time"] == 1.0, mine
        assert base[0]["env"]["device_kind"] == kind
        assert all(kind in r["strategy"] for r in mine)
    assert "| smart_batch [" in (out / "report.md").read_text(), "the table says which kind each row is"
    assert "baseline [other-device] #1: ok" in run.stderr, "the progress says which kind a baseline ran on"


# tune's trials side by side, one on each node: PBT's members below, at every commit; the random search's trials
# (their evaluations streamed back through the pool, as compare's trials stream their steps) in `make bench`
@pytest.mark.bench
def test_random_search_runs_its_trials_side_by_side(ray_cluster, tmp_path, cls_csv):
    """tune --search random with --ray-address: two trials at once, one per node, their evaluations streamed back
    as they happen (what the pruner reads)."""
    c = ray_cluster
    space = tmp_path / "space.yaml"
    space.write_text("lr: {low: 1.0e-4, high: 1.0e-2, log: true}\n")
    out = tmp_path / "tune"
    argv = [sys.executable, "-m", "trainwise.cli", "tune", "--space", str(space), "--search", "random"]
    argv += ["--trials", "2", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--max-length", "32"]
    argv += ["--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--eval-samples", "16", "--device", "cpu"]
    run = subprocess.run([*argv, "--ray-address", c["address"], "--out", str(out)], env=c["env"], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    trials = json.loads((out / "tune_result.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["complete", "complete"], trials
    assert all(t["steps"] == 4 for t in trials), "each trial's last evaluation came back"
    assert {t["node"] for t in trials} == {HEAD, WORKER}, ("side by side, one on each node", trials)


# one probe after another on the cluster (ClusterLaunch): `make bench` (the suite's minutes go to the tests above)
@pytest.mark.bench
def test_find_batch_probes_run_on_the_cluster(ray_cluster, tmp_path, cls_csv):
    c = ray_cluster
    fb = tmp_path / "fb"
    find = [sys.executable, "-m", "trainwise.cli", "find-batch", "--model-preset", "bert-tiny", "--train-file"]
    find += [str(cls_csv), "--max-length", "32", "--candidates", "8,16", "--steps", "3", "--device", "cpu"]
    run = subprocess.run([*find, "--ray-address", c["address"], "--out", str(fb)], env=c["env"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "on node 127.0.0." in run.stderr, run.stderr[-2000:]
    assert json.loads((fb / "find_batch.json").read_text())["points"], "the probes measured sizes"


def test_a_trial_over_both_nodes_takes_one_machines_steps(ray_cluster, tmp_path):
    """--nodes-per-trial 2: one trial, one rank on each node (torchrun's static rendezvous at the first), its row
    combining both; it takes the steps of the same two ranks on one machine (--nproc 2), loss for loss."""
    c = ray_cluster
    out = tmp_path / "span"
    run = subprocess.run(
        _compare(c, out, "baseline", "--nodes-per-trial", "2", "--no-remeasure"), env=c["env"], capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = _rows(out)
    assert row["status"] == "ok" and row["world_size"] == 2, row
    assert sorted(json.loads((out / "results.json").read_text())["rows"][0]["env"]["nodes"]) == [HEAD, WORKER]
    one = tmp_path / "one"
    alone = here.trainwise(*_study("baseline", "--no-remeasure", "--nproc", "2"), "--out", str(one))
    assert alone.returncode == 0, alone.stderr[-2000:]
    # every step's loss, not train_loss (a study's one-process trials count autorange's added steps in it)
    assert row["losses"] == pytest.approx(_rows(one)[0]["losses"], rel=1e-5)


def test_pbt_runs_its_members_on_the_cluster(ray_cluster, tmp_path, cls_csv):
    """PBT with two tiny members on the cluster (`--search pbt --ray-address`): they run there (no local Ray), one
    on each node, every member evaluates at every interval, the worse one continues from the better one's checkpoint
    with a mutated lr, the cost is priced, and a second run into the same --out is refused. (A local Ray differs only
    in the address given to ray.init and where members keep checkpoints: tests/search/test_tune.py.)"""
    c = ray_cluster
    space = tmp_path / "space.yaml"
    space.write_text("lr: {low: 1.0e-4, high: 1.0e-2, log: true}\nbatch_size: {choices: [8]}\n")
    out = tmp_path / "pbt"
    argv = [sys.executable, "-m", "trainwise.cli", "tune", "--space", str(space), "--search", "pbt", "--trials", "2"]
    argv += ["--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--max-length", "32"]
    argv += ["--monitor", "eval_loss", "--max-steps", "4", "--eval-every", "2", "--eval-samples", "16"]
    argv += ["--device", "cpu", "--price-per-hour", "3.6", "--ray-address", c["address"], "--out", str(out)]
    sessions = set(glob.glob("/tmp/ray/session_2*"))
    run = subprocess.run(argv, capture_output=True, text=True, env=c["env"], timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(glob.glob("/tmp/ray/session_2*")) == sessions, "the members ran on the cluster: no local Ray started"
    result = json.loads((out / "tune_result.json").read_text())
    assert [t["state"] for t in result["trials"]] == ["complete", "complete"]
    assert [t["steps"] for t in result["trials"]] == [4, 4], "no step is run twice, none skipped"
    assert {t["node"] for t in result["trials"]} == {HEAD, WORKER}, ("side by side, one on each node", result)
    assert result["curve"][-1][0] == 8
    reports = [json.loads(line) for line in (out / "pbt_reports.jsonl").read_text().splitlines()]
    for member in (0, 1):
        assert sorted(r["step"] for r in reports if r["member"] == member) == [2, 4]
    # with two members the worse one continues from the better one's checkpoint at every interval
    # ... and none is handed a checkpoint at the last step, where it would start again with nothing to train
    moved = result["mutations"]
    assert moved and all(m["step"] is not None for m in moved), moved
    for m in moved:
        assert m["step"] == 2, ("continued from a checkpoint, not from step 0", m, reports)
        assert m["new"]["lr"] != m["old"]["lr"] and m["new"]["batch_size"] == m["old"]["batch_size"] == 8
        after = [r for r in reports if r["member"] == m["member"] and r["config"]["lr"] == m["new"]["lr"]]
        assert min(r["step"] for r in after) == m["step"] + 2
    assert "continues from member" in run.stdout and "cost $" in run.stdout
    assert result["cost"]["usd"] == pytest.approx(result["machine_s"] / 3600 * 3.6)
    again = here.trainwise(*argv[3:])  # refused before Ray is reached: no process of its own needed
    assert again.returncode == 2 and "already holds a PBT study; PBT studies do not resume" in again.stderr
    assert not list(c["home"].glob(".ray/auth_token*")), "no test reads or writes ~/.ray"
    # (a driver without the token: the next test's compare; PBT's driver joins through the same cluster.connect)


def test_a_study_uses_both_nodes_and_a_killed_node_is_a_row(ray_cluster, tmp_path):
    """A study runs on both nodes, and a node killed mid-trial is a row."""
    c = ray_cluster
    out = tmp_path / "study"
    argv = _compare(c, out, "baseline,dynamic_pad,smart_batch,sortish", "--no-remeasure")
    study = subprocess.Popen(argv, env=c["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = c["worker"]
    # the worker node's second trial, once its process is running there: the node is killed with it
    deadline, killed, trial = time.monotonic() + 300, False, []
    while time.monotonic() < deadline and study.poll() is None:
        done_there = (
            sum(r["env"].get("node_ip") == WORKER for r in _rows(out)) if (out / "results.json").is_file() else 0
        )
        trial = [p for p in _trials_running("trainwise.run.worker") if _ran_under(p, worker.pid)]
        if done_there >= 1 and trial:
            os.killpg(worker.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.2)
    assert killed, "no second trial ran on the worker node"
    stdout, stderr = study.communicate(timeout=600)
    assert study.returncode == 0, stderr[-3000:]
    rows = _rows(out)
    assert {r["env"].get("node_ip") for r in rows} == {HEAD, WORKER}, "trials landed on both nodes"
    lost = [r for r in rows if r["status"] != "ok"]
    assert len(lost) == 1 and lost[0]["status"] == "crashed", rows
    assert f"node {WORKER}" in lost[0]["message"] and "left the cluster" in lost[0]["message"], lost[0]["message"]
    assert all(r["status"] == "ok" for r in rows if r is not lost[0]), "the study went on on the node left"
    time.sleep(2)
    assert not any(p in _trials_running("trainwise.run.worker") for p in trial), "the killed node's trial is gone too"
    # (--retry-failed runs such a row again and keeps the rest: tests/study/test_study.py, on one machine, where a
    # driver of its own and a fresh worker per trial do not cost it 20 s)
    assert not list((c["home"]).glob(".ray/auth_token*")), "no test reads or writes ~/.ray"
    # without the cluster's token the driver is refused: one line that says where Ray looks for one
    alone = {k: v for k, v in c["env"].items() if k != "RAY_AUTH_TOKEN_PATH"}
    refused = subprocess.run(_compare(c, tmp_path / "refused", "baseline"), env=alone, capture_output=True, text=True)
    assert refused.returncode == 2 and "RAY_AUTH_TOKEN" in refused.stderr, refused.stderr[-2000:]
    assert len([line for line in refused.stderr.splitlines() if "error" in line]) == 1, refused.stderr[-2000:]


def _ran_under(pid: int, node_pid: int) -> bool:
    """Whether process `pid` descends from the node's process (the trial's own session is its own)."""
    while pid > 1:
        if pid == node_pid:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


# ---- no cluster needed ----------------------------------------------------------------------------


def _result(row: str, kind: str | None, samples: float, repeat: int = 0) -> TrialResult:
    env = {} if kind is None else {cluster.KIND: kind}
    return TrialResult(row, "ok", repeat, samples_per_s=samples, step_time_s=16 / samples, env=env)


def test_rows_are_compared_with_the_baseline_of_their_own_kind(cls_study):
    specs = {s.row: s for s in cls_study.specs if s.repeat == 0}
    base, other = specs["baseline"], next(s for r, s in specs.items() if r != "baseline")
    trials: list[tuple[TrialSpec, TrialResult]] = [
        (base, _result("baseline", "fast", 200.0)),
        (base, _result("baseline", "slow", 50.0)),
        (other, _result(other.row, "slow", 100.0)),
    ]
    table = aggregate([c for c in cls_study.cells if c.row.text in ("baseline", other.row)], trials)
    by = {(e.row_text, e.device_kind): e for e in table}
    assert by[("baseline", "fast")].rel_time == 1.0 and by[("baseline", "slow")].rel_time == 1.0
    assert by[(other.row, "slow")].rel_time == pytest.approx(0.5), "against the slow kind's baseline, not 200/100"
    assert (other.row, "fast") not in by
    one_kind = aggregate(cls_study.cells, [(base, _result("baseline", "fast", 200.0))])
    assert [e.device_kind for e in one_kind] == [None] and "[" not in one_kind[0].strategy, "one kind: as before"


def test_each_kind_gets_a_baseline_and_quality_runs_anywhere(cls_study):
    """On nodes of several kinds the baseline runs on each, and a quality study's trials anywhere."""
    specs = cls_study.specs
    assert per_kind(specs, cls_study, ["a"]) == specs, "one kind: the trials as they are"
    two = per_kind(specs, cls_study, ["a", "b"])
    baseline = [s for s in specs if s.row == "baseline"]
    assert len(two) == len(specs) + len(baseline)
    pinned = [s.extra.get(cluster.KIND) for s in two if s.row == "baseline"]
    assert sorted(pinned) == sorted(["a", "b"] * len(baseline)), "each baseline trial once per kind, pinned to it"
    assert all(cluster.KIND not in s.extra for s in two if s.row != "baseline"), "the other rows anywhere"
    assert len({s.key() for s in two}) == len(two), "a baseline per kind is a trial of its own in the store"
    quality = dataclasses.replace(cls_study, config=dataclasses.replace(cls_study.config, seed_per_repeat=True))
    assert per_kind(specs, quality, ["a", "b"]) == specs, "a quality study's seeds run wherever there is room"


def test_an_address_is_checked_before_anything_runs(tmp_path):
    for bad, said in (("nothere", "expected HOST:PORT"), ("127.0.0.5:1", "cannot connect")):
        run = here.trainwise("compare", "--ray-address", bad, "--out", str(tmp_path / "x"))
        assert run.returncode == 2 and said in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert not (tmp_path / "x").exists()


def test_a_refusal_by_ray_is_one_line_naming_where_the_token_is_read(monkeypatch):
    """Every verb joins a cluster through `cluster.connect` (compare's and tune's drivers, PBT's): a cluster that
    refuses the driver for want of a token is a ConfigError naming where Ray reads one (a real refusal: the killed-node
    test's driver without the token)."""
    refusal = type("AuthenticationError", (Exception,), {})("no token")  # what ray.init raises, by its name
    monkeypatch.setattr(cluster.ray_module(), "init", lambda **_k: (_ for _ in ()).throw(refusal))
    with pytest.raises(ConfigError) as e:
        cluster.connect("10.0.0.9:6379")
    said = str(e.value)
    assert said.startswith("--ray-address 10.0.0.9:6379: the cluster uses token authentication") and "\n" not in said
    assert cluster.TOKEN_SOURCES in said
