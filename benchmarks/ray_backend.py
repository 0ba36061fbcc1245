"""Ray backend against local processes: decision → ready for 1 → 3 replicas, and what the
Ray path costs per replica (issue 10).

    python benchmarks/ray_backend.py [--rounds 3] [--out STEM]

Both peers in one run, each with the real in-process gateway and real `gpufleet replica`
processes (TP=2, no emulated load time, so the figure is the backend's own overhead plus
the replica's import and /health): with one replica ready, `start(2)` is called (the
decision) and the clock stops when both new replicas are ready and registered with the
gateway; then two are drained and the round repeats. The Ray peer runs on a local Ray
cluster as the tests start it: a head and two nodes declaring 4 GPUs each (loopback,
dashboard off). Faults, both peers: seconds from SIGKILL of a replica's process until the
gateway no longer lists it; Ray only: the same from killing the raylet of a replica's node.

Per-replica overhead of the Ray path: the resident memory and CPU seconds of each replica's
`ReplicaHost` actor process (the Ray worker that holds the GPUs and runs the command), and
the cluster's fixed cost (GCS, raylet and agents: every process of the benchmark's tree that
is neither a replica nor an actor). The replica processes themselves are alike in both peers.
On a shared 2-core machine the numbers include contention with whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.autoscale.gateway_link import InProcessGateway
from gpufleet.autoscale.local import DEFAULT_COMMAND, LocalProcessActuator
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.routing.types import ReplicaState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

MODEL = "meta-llama/Llama-3.1-8B"
VALUES = {"model": MODEL, "gpu": "h100-sxm", "tp": 2, "startup_s": 0.0, "time_scale": 1.0}
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> tuple[float, float] | None:
    """(resident MiB, CPU seconds) of a process, from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
    return rss_pages * PAGE / (1 << 20), cpu_s


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parent.items() if pp == pid]
        out += kids
        frontier += kids
    return out


async def _wait(cond: Any, timeout_s: float = 300.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("not ready in time")
        await asyncio.sleep(0.02)


def _ready(act: Any, n: int) -> bool:
    reps = act.list()
    return len(reps) == n and all(r.state == ReplicaState.READY for r in reps)


async def _rounds(act: Any, rounds: int) -> list[dict[str, float]]:
    out = []
    await act.start(1)
    await _wait(lambda: _ready(act, 1))
    for _ in range(rounds):
        t0 = time.monotonic()
        new = await act.start(2)
        await _wait(lambda: _ready(act, 3))
        ready = sorted((r.ready_at_s or t0) - t0 for r in new)
        out.append({"first_ready_s": ready[0], "both_ready_s": ready[-1]})
        for r in new:
            await act.drain(r.replica_id)
        await _wait(lambda: len(act.list()) == 1)
    return out


async def _gateway() -> Gateway:
    gw = Gateway(validate_config({"models": [MODEL], "health": {"probe_interval_s": 0.5}}))
    await gw.start("127.0.0.1", 0)
    return gw


async def run_local(rounds: int) -> dict[str, Any]:
    gw = await _gateway()
    act = LocalProcessActuator(
        DEFAULT_COMMAND, values=VALUES, registry=InProcessGateway(gw), drain_deadline_s=30
    )
    try:
        timings = await _rounds(act, rounds)
        [r] = act.list()
        replica = _proc(r.pid or 0)
    finally:
        await act.close()
        await gw.stop()
    return {"peer": "local processes", "rounds": timings, "replica_rss_mib": replica and replica[0]}


def _cluster() -> Any:
    """A head (no GPU) and two nodes declaring 4 GPUs each, all on loopback, as the tests."""
    from gpufleet.autoscale.raycluster import require_ray

    ray = require_ray()
    from ray.cluster_utils import Cluster

    node = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, **node,
                        "_system_config": {"health_check_period_ms": 500,
                                           "health_check_failure_threshold": 3}},
    )  # fmt: skip
    for _ in range(2):
        cluster.add_node(num_cpus=4, num_gpus=4, **node)
    ray.init(address=cluster.address, namespace="gpufleet-bench", _node_ip_address="127.0.0.1",
             log_to_driver=False)  # fmt: skip
    return cluster


async def _ejected_after(gw: Gateway, url: str) -> float:
    t0 = time.monotonic()
    await _wait(lambda: url not in {r["url"] for r in gw.list_replicas()}, 60.0)
    return time.monotonic() - t0


async def _faults(act: Any, gw: Gateway, cluster: Any) -> dict[str, float]:
    """Seconds from a replica's process being killed, and from its node's raylet being
    killed, until the gateway no longer routes to it."""
    import signal

    out: dict[str, float] = {}
    victim = act.placement(act.list()[0].replica_id)
    os.kill(victim["pid"], signal.SIGKILL)
    out["process_killed_to_ejected_s"] = await _ejected_after(gw, victim["url"])
    await _wait(lambda: _ready(act, 3))
    victim = act.placement(act.list()[-1].replica_id)
    node = next(n for n in cluster.worker_nodes if n.node_id == victim["node_id"])
    node.kill_raylet()
    out["node_lost_to_ejected_s"] = await _ejected_after(gw, victim["url"])
    return out


async def run_ray(rounds: int) -> dict[str, Any]:
    from gpufleet.autoscale.raycluster import ReplicaShape, require_ray
    from gpufleet.autoscale.raycluster.actuator import RayActuator

    ray = require_ray()
    cluster = _cluster()
    gw = await _gateway()
    act = RayActuator(
        DEFAULT_COMMAND,
        shape=ReplicaShape(tp=2, cpus_per_bundle=1),
        fleet="bench",
        namespace="gpufleet-bench",
        values=VALUES,
        registry=InProcessGateway(gw),
        drain_deadline_s=30,
    )
    try:
        timings = await _rounds(act, rounds)
        await act.start(2)
        await _wait(lambda: _ready(act, 3))
        infos = [act.placement(r.replica_id) for r in act.list()]
        hosts = {i["host_pid"] for i in infos}
        replicas = {i["pid"] for i in infos}
        before = {p: _proc(p) for p in hosts}
        await asyncio.sleep(10.0)  # idle: what an actor costs while its replica serves
        after = {p: _proc(p) for p in hosts}
        host_rss = [a[0] for a in after.values() if a]
        idle_cpu = [
            (after[p][1] - before[p][1]) / 10.0  # type: ignore[index]
            for p in hosts
            if before[p] and after[p]
        ]
        fixed = [
            _proc(p)
            for p in _descendants(os.getpid())
            if p not in hosts and p not in replicas and not _is_worker(p)
        ]
        replica = _proc(next(iter(replicas)))
        faults = await _faults(act, gw, cluster)
        out = {
            "peer": "Ray (local cluster)",
            "rounds": timings,
            "replica_rss_mib": replica and replica[0],
            "actor_rss_mib": statistics.mean(host_rss),
            "actor_cpu_s_at_start": statistics.mean(b[1] for b in before.values() if b),
            "actor_idle_cpu_fraction": statistics.mean(idle_cpu),
            "cluster_fixed_rss_mib": sum(f[0] for f in fixed if f),
            **faults,
        }
    finally:
        await act.close()
        await gw.stop()
        ray.shutdown()
        cluster.shutdown()
    return out


async def local_faults() -> dict[str, float]:
    gw = await _gateway()
    act = LocalProcessActuator(DEFAULT_COMMAND, values=VALUES, registry=InProcessGateway(gw))
    try:
        [r] = await act.start(1)
        await _wait(lambda: _ready(act, 1))
        os.kill(r.pid or 0, 9)
        return {"process_killed_to_ejected_s": await _ejected_after(gw, r.url)}
    finally:
        await act.close()
        await gw.stop()


def _is_worker(pid: int) -> bool:
    """An idle pooled Ray worker (not part of the cluster's fixed cost)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::IDLE")
    except OSError:
        return False


def _table(peers: list[dict[str, Any]]) -> str:
    lines = [
        "| peer | 1 → 3 ready, median s (rounds) | first of two ready, median s "
        "| replica RSS MiB | per-replica actor RSS MiB | actor CPU s to start "
        "| actor idle CPU | cluster fixed RSS MiB | process killed → ejected s "
        "| node lost → ejected s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in peers:
        both = [r["both_ready_s"] for r in p["rounds"]]
        first = [r["first_ready_s"] for r in p["rounds"]]

        def f(key: str, fmt: str, p: dict[str, Any] = p) -> str:
            return fmt.format(p[key]) if p.get(key) is not None else "—"

        lines.append(
            f"| {p['peer']} | {statistics.median(both):.2f} ({', '.join(f'{b:.2f}' for b in both)})"
            f" | {statistics.median(first):.2f} | {f('replica_rss_mib', '{:.0f}')} "
            f"| {f('actor_rss_mib', '{:.0f}')} | {f('actor_cpu_s_at_start', '{:.2f}')} "
            f"| {f('actor_idle_cpu_fraction', '{:.1%}')} | {f('cluster_fixed_rss_mib', '{:.0f}')} "
            f"| {f('process_killed_to_ejected_s', '{:.2f}')} "
            f"| {f('node_lost_to_ejected_s', '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "ray_backend",
                    help="results stem: STEM.json and STEM.md")  # fmt: skip
    args = ap.parse_args()
    local = asyncio.run(run_local(args.rounds))
    local.update(asyncio.run(local_faults()))
    peers = [local, asyncio.run(run_ray(args.rounds))]
    table = _table(peers)
    write_result(args.out, {"peers": peers}, table)
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
