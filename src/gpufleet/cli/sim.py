"""`gpufleet sim` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="sim")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet sim is not built yet")
