"""`gpufleet up` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="up")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet up is not built yet")
