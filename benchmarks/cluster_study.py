"""One study on a local Ray cluster of one node, then of two (issue 39's figure): wall time, trials per node, and
the rows side by side.

    .venv/bin/python benchmarks/cluster_study.py OUT [trainwise compare options...]

Each node is held to a CPU of its own (taskset) with one Ray CPU, on loopback addresses 127.0.0.2 / 127.0.0.3
(Ray rewrites 127.0.0.1 to the host's address), with a token made here. The same command runs into OUT/one-node
and OUT/two-nodes; each trial gets one thread either way, so the rows should agree within the noise floor and
the wall time should fall with the second node. Started and stopped here (never a host-wide `ray stop`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.here import ray_node  # noqa: E402  (the tests' node: its own temp dir, its own process group)


def study(env: dict, address: str, out: Path, extra: list[str]) -> tuple[float, Counter]:
    """The study's wall time, and its trials per node (from its progress: "on node IP")."""
    argv = [sys.executable, "-m", "trainwise.cli", "compare", *extra, "--ray-address", address, "--out", str(out)]
    start = time.perf_counter()
    run = subprocess.run(argv, env=env, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    sys.stderr.write(run.stderr)
    run.check_returncode()
    placed = Counter(line.split("on node ")[1].split()[0] for line in run.stderr.splitlines() if "on node " in line)
    return wall, placed


def main(out: Path, extra: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    token = out / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    env |= {"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.2:{port}"
    head = ["--head", "--node-ip-address=127.0.0.2", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"]
    walls, placed = {}, {}
    with ray_node(env, *head, cpus="0"):
        walls["one-node"], placed["one-node"] = study(env, address, out / "one-node", extra)
        join = [f"--address={address}", "--node-ip-address=127.0.0.3", "--num-cpus=1"]
        with ray_node(env, *join, cpus="1"):
            walls["two-nodes"], placed["two-nodes"] = study(env, address, out / "two-nodes", extra)
    rows = {k: json.loads((out / k / "results.json").read_text())["rows"] for k in walls}
    for k, wall in walls.items():
        floor = next((r["noise_floor"] for r in rows[k] if r["baseline"]), None)
        print(f"{k}: wall {wall:.1f} s; trials per node {dict(placed[k])}; noise floor ±{100 * (floor or 0):.1f}%")
    one = {r["strategy"]: r for r in rows["one-node"]}
    print("row | time % one node | time % two nodes | samples/s one | samples/s two | node (two)")
    for r in rows["two-nodes"]:
        o = one.get(r["strategy"], {})
        print(
            f"{r['strategy']} | {100 * (o.get('rel_time') or 0):.1f}% | {100 * (r.get('rel_time') or 0):.1f}% | "
            f"{o.get('samples_per_s') or 0:.1f} | {r.get('samples_per_s') or 0:.1f} | {r['env'].get('node_ip')}"
        )
    print(f"wall two / one: {walls['two-nodes'] / walls['one-node']:.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
