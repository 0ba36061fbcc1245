"""`gpufleet replica` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="replica")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet replica is not built yet")
