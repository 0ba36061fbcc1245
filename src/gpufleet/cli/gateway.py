"""`gpufleet gateway`: the OpenAI-compatible load balancer in front of replicas."""

from __future__ import annotations

import logging
import os
from typing import Any

import click


@click.command(name="gateway")
@click.option("--replica", "replicas", multiple=True, help="Replica base URL (repeatable).")
@click.option("--policy", default=None, help="Routing policy (default round_robin).")
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port to listen on (default 8000).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(),
    default=None,
    help="YAML config (replicas, tenants, limits); reloaded on change or SIGHUP.",
)
@click.option(
    "--admin-key",
    default=None,
    envvar="GPUFLEET_ADMIN_KEY",
    help="Enables /admin/* for 'Authorization: Bearer <key>'.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="A model the fleet serves even while no replica is up (repeatable).",
)
@click.option("--log-level", default="INFO", show_default=True)
def command(
    replicas: tuple[str, ...],
    policy: str | None,
    host: str | None,
    port: int | None,
    config_path: str | None,
    admin_key: str | None,
    models: tuple[str, ...],
    log_level: str,
) -> None:
    """Route OpenAI-compatible requests to replicas by load, prefix or session."""
    from gpufleet.gateway.config import load_config, validate_config
    from gpufleet.gateway.server import Gateway, run_gateway

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    overrides: dict[str, Any] = {}
    if policy:
        overrides["policy"] = policy
    if admin_key:
        overrides["admin_key"] = admin_key
    if host:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if config_path:
        config = load_config(config_path, overrides)
    else:
        config = validate_config(overrides, source="flags")
    extra = [{"url": u} for u in replicas]
    if extra or models:
        data = config.model_dump()
        data["replicas"] = data["replicas"] + extra
        data["models"] = sorted({*data["models"], *models})
        config = validate_config(data, source="--replica")
    from gpufleet.cli.ports import bind_error, check_port_free

    listen_host = host or config.host
    listen_port = port if port is not None else config.port
    check_port_free(listen_host, listen_port)
    gateway = Gateway(config, config_path=os.fspath(config_path) if config_path else None)
    try:
        run_gateway(gateway, host, port)
    except OSError as e:  # lost a race for the port after the check
        raise bind_error(e, listen_host, listen_port) from None
