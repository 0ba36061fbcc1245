"""The `gpufleet` command. Each verb lives in its own module and is imported only when used,
so `gpufleet plan` does not pay for the HTTP stack."""

from __future__ import annotations

import importlib
import sys

import click

from gpufleet import __version__
from gpufleet.errors import UserError
from gpufleet.native import refuse_stale_compiled

# verb -> (module, one-line help). The module defines a click command named `command`.
VERBS: dict[str, tuple[str, str]] = {
    "plan": ("gpufleet.cli.plan", "Does the model fit, how to split it, how many replicas."),
    "replica": ("gpufleet.cli.replica", "Run a simulated vLLM-compatible replica (no GPU needed)."),
    "gateway": ("gpufleet.cli.gateway", "Run the OpenAI-compatible gateway in front of replicas."),
    "bench": ("gpufleet.cli.bench", "Measure any OpenAI-compatible endpoint the way vLLM does."),
    "up": ("gpufleet.cli.up", "Start gateway, autoscaler and replicas from one config."),
    "sim": ("gpufleet.cli.sim", "Replay a trace through a simulated fleet."),
    "deploy": ("gpufleet.cli.deploy", "Write Kubernetes manifests for a fleet (deploy k8s)."),
    "controller": (
        "gpufleet.cli.controller",
        "Run the autoscaling controller inside a cluster (controller k8s).",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in VERBS:
            return None
        module = importlib.import_module(VERBS[cmd_name][0])
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in VERBS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpufleet")
def cli() -> None:
    """gpufleet — plan, run, route, autoscale and measure LLM inference fleets."""


def main() -> None:
    try:
        refuse_stale_compiled()
        cli.main(standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
