"""`gpufleet deploy k8s FLEET_YAML -o DIR`: the fleet as Kubernetes manifests."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from gpufleet.k8s.emit import Emitted


@click.group(name="deploy")
def command() -> None:
    """Write deployment files for a fleet (today: Kubernetes manifests)."""


@command.command(name="k8s")
@click.argument("fleet_yaml", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write the manifests to (created if missing).",
)
@click.option("--namespace", default=None, help="Namespace [default: kubernetes.namespace].")
@click.option(
    "--scaler",
    type=click.Choice(["gpufleet", "keda", "hpa"]),
    default="gpufleet",
    show_default=True,
    help="Who scales the replicas: gpufleet's controller, a KEDA ScaledObject or an HPA.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the files and the summary as JSON.")
def k8s(fleet_yaml: str, out_dir: str, namespace: str | None, scaler: str, as_json: bool) -> None:
    """Plan the fleet's model on its GPU and write the manifests for `kubectl apply -f DIR`:
    the replica group (Deployment, or LeaderWorkerSet when a replica spans nodes), the
    gateway, the controller, and a KEDA ScaledObject or HPA with --scaler keda|hpa.
    With `groups:` (several models), each group is planned and gets its own workload,
    Service, controller and autoscaler; the one gateway serves every group's model.
    The `kubernetes:` section of FLEET_YAML tunes them (docs/kubernetes.md)."""
    from gpufleet.fleet.config import load_fleet
    from gpufleet.k8s.emit import deploy_fleet

    fleet = load_fleet(fleet_yaml, derive=False)
    emitted = deploy_fleet(fleet, out_dir, namespace=namespace, scaler=scaler)
    print_emitted(emitted, out_dir, as_json)


def print_emitted(emitted: Emitted, out_dir: str, as_json: bool) -> None:
    if as_json:
        click.echo(
            json.dumps(
                {"files": [str(p) for p in emitted.paths], "summary": emitted.summary}, indent=2
            )
        )
        return
    for line in emitted.summary:
        click.echo(line)
    click.echo(f"wrote {len(emitted.paths)} files to {out_dir}:")
    for p in emitted.paths:
        click.echo(f"  {p.name}")
    click.echo(f"next: kubectl apply -f {out_dir}")
