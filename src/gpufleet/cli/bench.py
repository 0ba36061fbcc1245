"""`gpufleet bench` (being built; see the open issue for this verb)."""

from __future__ import annotations

import click


@click.command(name="bench")
def command() -> None:
    """Not built yet."""
    raise click.ClickException("gpufleet bench is not built yet")
