"""The controller process in the cluster (`gpufleet controller k8s --config FILE`).

Every pod of the controller Deployment runs this; the Lease picks the one that acts. The
leader, each tick: follows the gateway pods, reads the replica group back from the cluster
(`KubernetesActuator.sync`: adopt, register, resume drains), merges the gateways'
signals (its model's alone when the gateways serve several groups, one controller each),
and — with `scale: true` — asks the policy and scales. With a KEDA or HPA scaler
(`scale: false`) it only registers and drains. A pod that loses the lease stops acting at
once; whoever leads next reads everything back, so nothing is lost in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.autoscale.controller import Controller
from gpufleet.autoscale.policies import make_policy
from gpufleet.fleet_state import GatewaySignals
from gpufleet.k8s.actuator import KubernetesActuator
from gpufleet.k8s.api import KubeApi
from gpufleet.k8s.controller_config import ControllerConfig
from gpufleet.k8s.lease import LeaderElector
from gpufleet.k8s.peers import GatewayPeers

log = logging.getLogger("gpufleet.k8s")


@dataclass
class ClusterController:
    """One leadership term's worth of objects: built when the lease is won, closed when lost."""

    cfg: ControllerConfig
    api: KubeApi
    admin_key: str
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.peers = GatewayPeers(
            self.api, cfg.namespace, cfg.gateway_peers, cfg.gateway_port, self.admin_key,
            model=cfg.model,
        )  # fmt: skip
        self.actuator = KubernetesActuator(self.api, cfg, self.peers, clock=self.clock)
        a = cfg.autoscale
        self.controller = Controller(
            make_policy(a.policy, a.bounds(), a.params),
            self.actuator,
            self.read_signals,
            interval_s=a.interval_s,
            clock=self.clock,
        )

    async def read_signals(self) -> GatewaySignals:
        await self.peers.refresh()
        await self.actuator.sync()
        signals = await self.peers.read_signals()
        if self.cfg.model is None:
            return signals
        # One group of several: its model's queue, latencies and replicas alone.
        own = {r.replica_id for r in self.actuator.list()}
        return signals.for_model(self.cfg.model, own)

    async def tick(self) -> None:
        if self.cfg.scale:
            await self.controller.tick()
        else:
            await self.read_signals()  # register and drain; KEDA or the HPA scales

    async def close(self) -> None:
        await self.actuator.close()
        await self.peers.close()


async def run_controller(
    cfg: ControllerConfig, api: KubeApi, identity: str, admin_key: str, stop: asyncio.Event
) -> None:
    elector = LeaderElector(api, cfg.namespace, cfg.lease_name, identity, cfg.lease)
    election = asyncio.create_task(elector.run(stop), name="lease")
    term: ClusterController | None = None
    try:
        while not stop.is_set():
            if elector.leading and term is None:
                log.info("%s leads: reading the fleet back", identity)
                term = ClusterController(cfg, api, admin_key)
            elif not elector.leading and term is not None:
                log.warning("%s no longer leads: stopping", identity)
                await term.close()
                term = None
            if term is not None:
                try:
                    await term.tick()
                except Exception:  # keep controlling: a failed read is retried next tick
                    log.exception("controller tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.autoscale.interval_s)
    finally:
        if term is not None:
            await term.close()
        stop.set()
        await election  # releases the lease
