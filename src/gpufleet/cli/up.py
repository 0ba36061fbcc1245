"""`gpufleet up [FLEET_YAML] [--demo] [--port 8000] [--backend local|ray]`: gateway, autoscaler
and replicas as one (replicas as local processes, or on a Ray cluster: docs/ray.md)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import click

from gpufleet.cli.jsonout import JsonOut, json_option
from gpufleet.cli.ports import bind_error, check_port_free
from gpufleet.errors import UserError


@click.command(name="up")
@click.argument("fleet_yaml", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--demo",
    is_flag=True,
    help="Also drive built-in traffic (quiet, ramp, burst, quiet) and show it live.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="Gateway port [default: 8000]."
)
@click.option("--host", default=None, help="Gateway address [default: 127.0.0.1].")
@click.option(
    "--policy",
    default=None,
    help="Override autoscale.policy (default, queue_depth, hpa, kpa, ray_serve).",
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where replicas run: local processes, or a Ray cluster [default: backend.kind].",
)
@click.option(
    "--ray-address",
    default=None,
    help="Ray cluster: auto | ray://HOST:10001 | HOST:PORT [default: backend.address; "
    "unset: a local Ray cluster of its own].",
)
@click.option(
    "--fleet-name",
    default=None,
    help="Name of this fleet on the Ray cluster (one controller per name) "
    "[default: backend.fleet_name].",
)
@json_option("the run's summary")
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="At the end, write PNG plots and an HTML summary here (needs the plot extra).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log every decision and replica event.")
def command(
    fleet_yaml: str | None,
    demo: bool,
    port: int | None,
    host: str | None,
    policy: str | None,
    backend: str | None,
    ray_address: str | None,
    fleet_name: str | None,
    json_path: str | None,
    report_dir: str | None,
    verbose: bool,
) -> None:
    """Start the gateway, the autoscaler and the replicas from one config; Ctrl-C stops all.

    With no FLEET_YAML: Llama-3.1-8B on simulated h100-sxm replicas (`gpufleet replica`),
    1 to 8 replicas, prefix_aware routing, the default autoscaling policy, gateway on
    127.0.0.1:8000. See README.md ("gpufleet up") for the config keys.
    """
    from rich.console import Console

    from gpufleet.fleet.config import load_fleet, validate_fleet
    from gpufleet.fleet.demo import demo_fleet
    from gpufleet.fleet.run import run_up

    # The demo fleet gives each policy targets set alike (fleet/demo.py).
    cfg = demo_fleet(policy or "default") if fleet_yaml is None and demo else load_fleet(fleet_yaml)
    if policy is not None and cfg.groups:
        raise UserError(
            "--policy applies to a single-group fleet; this config has `groups:`",
            field="--policy",
            fix="set autoscale.policy in each group of the YAML",
        )
    if policy is not None and policy != cfg.autoscale.policy:
        data = cfg.model_dump()
        data["autoscale"]["policy"] = policy
        data["autoscale"]["params"] = (
            {} if policy != cfg.autoscale.policy else data["autoscale"]["params"]
        )
        cfg = validate_fleet(data)
    overrides = {"kind": backend, "address": ray_address, "fleet_name": fleet_name}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        data = cfg.model_dump()
        data["backend"].update(overrides)
        cfg = validate_fleet(data, source="--backend/--ray-address/--fleet-name")
    if cfg.backend.kind != "ray" and (ray_address or fleet_name):
        raise UserError(
            "--ray-address and --fleet-name apply to the Ray backend",
            field="--backend",
            fix="add --backend ray (or backend: {kind: ray} in the YAML)",
        )
    settings = cfg.gateway_settings()
    listen_host = host or settings.get("host", "127.0.0.1")
    listen_port = port if port is not None else int(settings.get("port", 8000))
    check_port_free(listen_host, listen_port)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    console = Console()

    async def main() -> object:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await run_up(
            cfg,
            demo=demo,
            stop=stop,
            console=console,
            port=port,
            host=host,
            report_dir=Path(report_dir) if report_dir else None,
        )

    with JsonOut(json_path) as json_out:
        try:
            summary = asyncio.run(main())
        except OSError as e:  # lost a race for the port after the check
            raise bind_error(e, listen_host, listen_port) from None
        if summary is not None:
            out = summary.to_json()  # type: ignore[attr-defined]
            cap = cfg.capacity()
            out["capacity_per_replica"] = cap.to_json() if cap is not None else None
            written = json_out.write(out)
            if written:
                click.echo(f"wrote {written}")
