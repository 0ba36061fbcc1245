"""The live gateway and the simulator drive the one fleet core: the same scripted
arrivals, replica changes and finishes give the same routing decisions and the same
refusals (404, the queue's 503s with Retry-After) through both.

Live: the gateway's own admission code (`gateway.admission.choose_replica`: asyncio events
and `wait_for` deadlines) on an asyncio loop whose clock is virtual (no sleeping), with
the fleet core built as `Gateway` builds it. Simulated: the simulator's gateway
(`sim.gateway.SimGateway`) with its event queue and QUEUE_TIMEOUT handler.
"""

from __future__ import annotations

import asyncio
import heapq

import pytest

from gpufleet.engine import EngineConfig
from gpufleet.fleet_state import FleetReplica, FleetState, QueueTicket, Refusal
from gpufleet.gateway.admission import TableChanges, choose_replica
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.server import build_fleet as gateway_fleet
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.routing import make_policy
from gpufleet.routing.types import RequestInfo, RoutingPolicy
from gpufleet.sim.clients import LiveRequest
from gpufleet.sim.config import SimConfig
from gpufleet.sim.events import EventQueue, SimClock
from gpufleet.sim.gateway import SimGateway
from gpufleet.sim.gateway import build_fleet as sim_fleet
from gpufleet.sim.results import RequestResult
from gpufleet.workload import SimRequest

from .virtual_time import run_virtual

TIMEOUT_S, MAX_SIZE, RETRY_AFTER_S = 4.0, 2, 7
Event = tuple[float, str, str]  # (time, what, request or replica id)
# Times are multiples of 1/8 s (exact in binary), never two at the same instant.
SCRIPT: list[Event] = [
    (0.25, "arrive", "q1"),  # no replica yet: waits
    (0.5, "arrive", "q2"),  # waits
    (0.75, "arrive", "q3"),  # the queue is full: 503
    (1.0, "ready", "r1"),  # q1, q2 go to r1, in arrival order
    (1.25, "arrive", "q4"),
    (1.5, "first", "q1"),
    (1.625, "ready", "r2"),
    (1.75, "arrive", "q5"),
    (2.0, "arrive", "q6"),
    (2.25, "finish", "q1"),
    (2.375, "first", "q2"),
    (2.5, "arrive", "q7"),
    (2.625, "finish", "q4"),
    (2.75, "arrive", "q8"),
    (2.875, "arrive", "q9"),
    (3.0, "drain", "r1"),
    (3.125, "arrive", "q10"),  # only r2
    (3.25, "finish", "q2"),
    (3.375, "remove", "r2"),
    (3.5, "arrive", "q11"),  # nothing ready: waits
    (3.75, "arrive", "q12"),  # waits
    (4.0, "arrive", "q13"),  # full: 503
    (4.25, "arrive", "x:q14"),  # a model nobody serves: 404
    (6.0, "ready", "r3"),  # q11 and q12 go to r3
    (6.25, "arrive", "q15"),
    (6.5, "arrive", "q16"),
    (6.75, "remove", "r3"),
    (7.0, "arrive", "q17"),  # waits ...
    (11.0, "ready", "r4"),  # ... past its deadline at 11.0 + ... (see below)
    (11.25, "arrive", "q18"),
]
# q17 arrives at 7.0 and times out at 11.0 exactly when r4 would be ready: move r4 later.
SCRIPT = [(11.5, w, x) if x == "r4" else (t, w, x) for t, w, x in SCRIPT]
SCRIPT.sort()


def _info(name: str) -> RequestInfo:
    model, _, rid = name.rpartition(":")
    # Two sessions, so the session policy has something to stick to.
    return RequestInfo(request_id=rid, model=model or "m", session_key=f"s{int(rid[1:]) % 2}")


Outcome = tuple[float, str, str]  # (time, request id, replica id or "503 ...")


def _refusal(r: Refusal) -> str:
    return f"{r.status} {r.message} Retry-After={r.retry_after_s}"


def live_gateway(policy: str) -> tuple[list[Outcome], FleetState[Replica]]:
    cfg = validate_config({
        "policy": policy, "seed": 3, "models": ["m"],
        "queue": {"max_size": MAX_SIZE, "timeout_s": TIMEOUT_S, "retry_after_s": RETRY_AFTER_S},
    })  # fmt: skip
    fleet = gateway_fleet(cfg)
    outcomes: list[Outcome] = []
    placed: dict[str, tuple[RequestInfo, Replica]] = {}

    async def request(info: RequestInfo) -> None:
        loop = asyncio.get_running_loop()
        policy = fleet.policy_for(None)
        chosen = await choose_replica(fleet, info, policy, None, loop.time() + TIMEOUT_S,
                                      changes, clock=loop.time)  # fmt: skip
        if isinstance(chosen, Refusal):
            outcomes.append((loop.time(), info.request_id, _refusal(chosen)))
            return
        assert chosen is not None
        fleet.started(info, chosen, policy)  # as Proxy.attempt does, before any await
        placed[info.request_id] = (info, chosen)
        outcomes.append((loop.time(), info.request_id, chosen.replica_id))

    async def script() -> None:
        loop = asyncio.get_running_loop()
        tasks = []
        for t, what, name in SCRIPT:
            await asyncio.sleep(t - loop.time())
            if what == "arrive":
                tasks.append(asyncio.create_task(request(_info(name))))
            else:
                _apply(fleet, what, name, placed, Replica.create(name, f"http://{name}", None,
                                                                 ["m"]))  # fmt: skip
        await asyncio.gather(*tasks)

    changes = TableChanges(fleet)
    run_virtual(script())
    return outcomes, fleet


def simulated_gateway(policy: RoutingPolicy) -> tuple[list[Outcome], FleetState[FleetReplica]]:
    engine = EngineConfig(num_gpu_blocks=64, block_size=16, max_model_len=1024)
    cfg = SimConfig(engine=engine, step_time_model=LinearStepTimeModel(0.01, 0.0), model="m",
                    queue_timeout_s=TIMEOUT_S, queue_max_size=MAX_SIZE,
                    queue_retry_after_s=RETRY_AFTER_S)  # fmt: skip
    fleet = sim_fleet(cfg, policy)
    clock = SimClock()
    events = EventQueue()
    outcomes: list[Outcome] = []
    placed: dict[str, tuple[RequestInfo, FleetReplica]] = {}

    def dispatch(live: LiveRequest, replica: FleetReplica) -> None:
        fleet.started(live.info, replica, policy)  # as SimFleet.dispatch does
        placed[live.info.request_id] = (live.info, replica)
        outcomes.append((clock.now_s, live.info.request_id, replica.replica_id))

    def refuse(live: LiveRequest, refusal: Refusal) -> None:
        outcomes.append((clock.now_s, live.info.request_id, _refusal(refusal)))

    def fail(live: LiveRequest, why: str) -> None:  # a retry's end: the script has none
        raise AssertionError(f"{live.info.request_id} failed: {why}")

    gateway = SimGateway(fleet, events, clock, dispatch, refuse, fail)
    script = list(SCRIPT)
    while script or events.heap:
        if events.heap and (not script or events.heap[0][0] < script[0][0]):
            clock.now_s, _, _, ticket = heapq.heappop(events.heap)
            assert isinstance(ticket, QueueTicket)
            gateway.on_queue_timeout(ticket)
            continue
        clock.now_s, what, name = script.pop(0)
        if what == "arrive":
            info = _info(name)
            req = SimRequest(0, clock.now_s, (), 1)
            gateway.arrive(LiveRequest(req, info, RequestResult(0, clock.now_s, 0, 0), policy))
        else:
            view = FleetReplica(replica_id=name, url=f"sim://{name}", models=frozenset({"m"}),
                                fixed_models=True)  # fmt: skip
            _apply(fleet, what, name, placed, view)
    return outcomes, fleet


def _apply(fleet, what, name, placed, new_replica):  # type: ignore[no-untyped-def]
    """A replica change or a request's progress, as both drivers report it to the core."""
    policy = fleet.policy
    if what == "ready":
        fleet.table.add(new_replica)
        fleet.table.probe_passed(new_replica)
        fleet.table.mark_ready(new_replica)
    elif what == "drain":
        fleet.table.drain(name)
    elif what == "remove":
        fleet.table.remove(name)
    elif what == "first":
        info, replica = placed[name]
        fleet.first_token(info, replica, policy)
    elif what == "finish":
        info, replica = placed.pop(name)
        fleet.finished(info, replica, policy, ok=True, streamed=True)


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "power_of_two",
                                    "session", "random"])  # fmt: skip
def test_gateway_and_simulator_decide_alike(policy: str) -> None:
    live, live_fleet = live_gateway(policy)
    sim, sim_fleet_state = simulated_gateway(make_policy(policy, seed=3))
    assert live == sim
    assert len(live) == sum(1 for _, w, _ in SCRIPT if w == "arrive")
    refusals = [o for _, _, o in live if not o.startswith("r")]
    assert refusals == [
        "503 no replica ready for model 'm' (the queue is full) Retry-After=7",  # q3
        "503 no replica ready for model 'm' (the queue is full) Retry-After=7",  # q13
        "404 the model 'x' does not exist Retry-After=None",  # q14
        "503 no replica ready for model 'm' (timed out in the queue) Retry-After=7",  # q17
    ]
    by_id = {rid: (t, o) for t, rid, o in live}
    assert by_id["q1"] == (1.0, "r1") and by_id["q2"] == (1.0, "r1")  # in arrival order
    assert by_id["q10"][1] == "r2" and by_id["q11"] == (6.0, "r3")
    assert by_id["q17"][0] == 11.0  # its deadline, 7.0 + 4.0
    assert {o for _, _, o in live if o.startswith("r")} >= {"r1", "r2", "r3", "r4"}

    # And the core is left in the same state: same in-flight counts, nothing queued.
    def counts(f: FleetState) -> list[tuple[str, int, int]]:  # type: ignore[type-arg]
        return [(r.replica_id, r.in_flight, r.streaming) for r in f.table]

    assert counts(live_fleet) == counts(sim_fleet_state)
    assert len(live_fleet.queue) == len(sim_fleet_state.queue) == 0
