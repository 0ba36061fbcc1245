"""`gpufleet plan` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="plan")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet plan is not built yet")
