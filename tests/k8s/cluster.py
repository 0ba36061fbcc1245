"""A small stand-in cluster for the actuator tests: the fake API server (fake_api.py), two
REAL gateways (gpufleet's, in this event loop) on 127.0.0.2 and 127.0.0.3 behind a peers
Service, and small engines that answer on each pod's address (127.0.1.N), all on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.k8s.actuator import KubernetesActuator
from gpufleet.k8s.api import KubeApi
from gpufleet.k8s.controller_config import ControllerConfig, ScaleTarget
from gpufleet.k8s.objects import GROUP_LABEL, ROLE_LABEL
from gpufleet.k8s.peers import GatewayPeers

from .fake_api import FakeApiServer

NS, GROUP, KEY = "llm", "vllm-tiny", "admin-key"
GATEWAY_IPS = ("127.0.0.2", "127.0.0.3")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class Engine:
    """What the gateway and the actuator need of a vLLM pod: /health, /v1/models, and
    /metrics with the requests it is running (the test sets `running`)."""

    def __init__(self) -> None:
        self.running = 0
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        async def health(_: web.Request) -> web.Response:
            return web.Response(status=200)

        async def models(_: web.Request) -> web.Response:
            return web.json_response(
                {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
            )

        async def metrics(_: web.Request) -> web.Response:
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="tiny"}} {self.running}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{model_name="tiny"} 0\n'
            )
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class Cluster:
    server: FakeApiServer
    ordered: bool = False
    models: tuple[str, ...] = ("tiny",)  # what the gateways serve
    clock_s: float = 1_700_000_000.0
    gateways: list[Gateway] = field(default_factory=list)
    engines: dict[str, Engine] = field(default_factory=dict)  # by pod name
    peers: list[GatewayPeers] = field(default_factory=list)
    actuators: list[KubernetesActuator] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = self.server.cluster
        self.cluster.now_s = self.clock_s
        self.engine_port = free_port("127.0.1.1")
        self.gateway_port = free_port(GATEWAY_IPS[0])
        labels = {GROUP_LABEL: GROUP} | ({ROLE_LABEL: "leader"} if self.ordered else {})
        plural = "leaderworkersets" if self.ordered else "deployments"
        self.workload = self.cluster.add_workload(plural, NS, GROUP, labels, ordered=self.ordered)
        self.cluster.add_service(NS, GROUP, labels, self.engine_port)
        gw_labels = {"app.kubernetes.io/component": "gateway"}
        self.cluster.add_service(NS, "gpufleet-gateway-peers", gw_labels, self.gateway_port)
        for i, ip in enumerate(GATEWAY_IPS):
            self.cluster.add_pod(NS, f"gpufleet-gateway-{i}", gw_labels, ip=ip, ready=True)
        target = (
            ScaleTarget(group="leaderworkerset.x-k8s.io", plural="leaderworkersets",
                        kind="LeaderWorkerSet", name=GROUP, ordered_scale_in=True)
            if self.ordered
            else ScaleTarget(name=GROUP)
        )  # fmt: skip
        self.config = ControllerConfig(
            namespace=NS, group=GROUP, target=target, engine_port=self.engine_port,
            gateway_port=self.gateway_port, drain_deadline_s=30.0, expected_startup_s=120.0,
        )  # fmt: skip

    def add_group(self, name: str, model: str) -> ControllerConfig:
        """Another model group (a Deployment and its Service) beside GROUP, and its
        controller's config (as `deploy k8s` writes it for a fleet with `groups:`)."""
        labels = {GROUP_LABEL: name}
        self.cluster.add_workload("deployments", NS, name, labels)
        self.cluster.add_service(NS, name, labels, self.engine_port)
        return self.config.model_copy(
            update={"group": name, "target": ScaleTarget(name=name), "model": model,
                    "lease_name": f"gpufleet-controller-{name}"}
        )  # fmt: skip

    def now(self) -> float:
        return self.clock_s

    async def start_gateways(self) -> None:
        for ip in GATEWAY_IPS:
            gw = Gateway(
                validate_config(
                    {"admin_key": KEY, "models": list(self.models), "scrape_interval_s": 0.1,
                     "health": {"probe_interval_s": 0.1, "probe_timeout_s": 1.0}}
                )
            )  # fmt: skip
            await gw.start(ip, self.gateway_port)
            self.gateways.append(gw)

    def actuator(self) -> KubernetesActuator:
        """A fresh controller's actuator (as after a restart: it knows nothing yet)."""
        api = KubeApi.for_host(self.server.url)
        peers = GatewayPeers(api, NS, "gpufleet-gateway-peers", self.gateway_port, KEY)
        act = KubernetesActuator(api, self.config, peers, clock=self.now, poll_s=0.05)
        self.peers.append(peers)
        self.actuators.append(act)
        return act

    async def sync(self, act: KubernetesActuator) -> None:
        await act.registry.refresh()  # type: ignore[attr-defined]
        await act.sync()

    async def schedule_and_serve(self, pod: str) -> None:
        """The pod gets a node and an address, and its engine starts answering."""
        ip = self.cluster.schedule(NS, pod)
        engine = self.engines[pod] = Engine()
        await engine.start(ip, self.engine_port)

    def gateway_view(self, i: int) -> dict[str, str]:
        """Replica id → state, as gateway i sees it."""
        return {r["id"]: r["state"] for r in self.gateways[i].list_replicas()}

    async def close(self) -> None:
        for act in self.actuators:
            await act.close()
        for peers in self.peers:
            await peers.close()
        for gw in self.gateways:
            await gw.stop()
        for engine in self.engines.values():
            await engine.stop()


async def wait_until(cond: Callable[[], Any], timeout_s: float = 20.0) -> None:
    """Poll a condition; the timeout is only a hang guard."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met before the hang guard"
        await asyncio.sleep(0.02)
