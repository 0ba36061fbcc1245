"""`gpufleet plan --groups FLEET_YAML --max-gpus N`: every model group's layout and
replicas, and whether the groups fit one GPU budget together."""

from __future__ import annotations

import sys

import click

from gpufleet.cli.jsonout import JsonOut
from gpufleet.errors import UserError

PLAN_ENGINES = ("vllm", "sglang", "trtllm")  # engines whose memory rules the plan knows


def plan_groups_command(path: str, max_gpus: int | None, json_path: str | None) -> None:
    from gpufleet.fleet.config import load_fleet
    from gpufleet.plan.groups import GroupDemand, plan_groups
    from gpufleet.plan.types import PlanRequest
    from gpufleet.specs import load_gpu, load_model

    cfg = load_fleet(path, derive=False)
    demands = []
    for i, g in enumerate(cfg.fleet_groups()):
        rs, t = g.replicas, g.traffic
        slo = g.autoscale.params.get("ttft_p90_slo_s")
        ttft_slo_s = t.ttft_slo_s or (float(slo) if isinstance(slo, int | float) else 1.0)
        try:
            request = PlanRequest(
                model=load_model(rs.model),
                gpu=load_gpu(rs.gpu),
                input_tokens=t.input_tokens,
                output_tokens=t.output_tokens,
                rps=t.rps,
                ttft_slo_s=ttft_slo_s,
                tpot_slo_s=t.tpot_slo_s,
                engine=rs.engine if rs.engine in PLAN_ENGINES else "vllm",
                disaggregation="off",
            )
        except UserError as e:
            where = f"groups[{i}].replicas" if cfg.groups else "replicas"
            raise UserError(str(e), field=f"{where} in {path}") from None
        a = g.autoscale
        where = f"groups[{i}].replicas" if cfg.groups else "replicas"
        # A layout the config states is what `up` starts: cost that one, not the plan's.
        stated = {"tp", "pp"} & rs.model_fields_set
        layout = (rs.tp, rs.pp) if stated else None
        demands.append(GroupDemand(g.label, request, a.min_replicas, a.max_replicas, layout, where))
    result = plan_groups(demands, max_gpus)
    data = result.to_dict()
    with JsonOut(json_path) as out:
        if out.to_stdout:
            out.write(data)
            return
        _print(data, width=None if sys.stdout.isatty() else 140)
        written = out.write(data)
        if written:
            click.echo(f"wrote {written}")
    if not result.fits:
        sys.exit(1)


def _print(data: dict[str, object], width: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width)
    table = Table(title="model groups", title_justify="left")
    for col in ("group", "model", "gpu", "engine", "rps", "layout", "replicas", "GPUs", "max",
                "GPUs at max", "SLOs"):  # fmt: skip
        table.add_column(col)
    groups = data["groups"]
    assert isinstance(groups, list)
    for g in groups:
        table.add_row(g["name"], g["model"], g["gpu"], g["engine"], f"{g['rps']:g}",
                      g["layout"], f"{g['replicas']} (needs {g['needed_replicas']})",
                      str(g["gpus"]), str(g["max_replicas"]), str(g["peak_gpus"]),
                      "met" if g["slo_met"] else "missed")  # fmt: skip
    console.print(table)
    for g in groups:
        for note in g["notes"]:
            console.print(f"{g['name']}: {note}", markup=False, highlight=False)
    console.print(f"budget: {data['verdict']}", markup=False, highlight=False)
