"""`gpufleet controller k8s --config FILE`: the autoscaling controller inside a cluster."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import click

from gpufleet.errors import UserError


@click.group(name="controller")
def command() -> None:
    """Run the autoscaling controller next to a fleet's gateways (today: on Kubernetes)."""


@command.command(name="k8s")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The controller's YAML (written by `gpufleet deploy k8s` into its ConfigMap).",
)
@click.option(
    "--identity",
    default=None,
    envvar="POD_NAME",
    help="Its name in the Lease [default: $POD_NAME, else the host name].",
)
@click.option(
    "--admin-key",
    default=None,
    envvar="GPUFLEET_ADMIN_KEY",
    help="The gateways' admin key [default: $GPUFLEET_ADMIN_KEY].",
)
@click.option("--log-level", default="INFO", show_default=True)
def k8s(config_path: str, identity: str | None, admin_key: str | None, log_level: str) -> None:
    """Hold the Lease, read the replica group back from the cluster, keep every gateway's
    replica list in step, and scale through the scale subresource."""
    from gpufleet.k8s import require_client

    require_client()
    from gpufleet.k8s.api import KubeApi
    from gpufleet.k8s.controller import run_controller
    from gpufleet.k8s.controller_config import load_controller_config

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    cfg = load_controller_config(config_path)
    if not admin_key:
        raise UserError(
            "no admin key for the gateways",
            field="--admin-key",
            fix="set GPUFLEET_ADMIN_KEY (the manifests take it from the gpufleet-admin Secret)",
        )
    key: str = admin_key
    api = KubeApi.from_environment()
    who = identity or os.environ.get("HOSTNAME") or socket.gethostname()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_controller(cfg, api, who, key, stop)

    asyncio.run(main())
