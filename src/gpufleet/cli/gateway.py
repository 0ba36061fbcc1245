"""`gpufleet gateway` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="gateway")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet gateway is not built yet")
