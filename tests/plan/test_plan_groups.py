"""`gpufleet plan --groups`: each group planned as `plan` plans it alone, its replicas kept
within [min, max], and the groups' GPUs summed against one budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.errors import UserError
from gpufleet.plan.groups import GroupDemand, plan_groups
from gpufleet.plan.search import plan
from gpufleet.plan.types import PlanRequest
from gpufleet.specs import load_gpu, load_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "multi-model.md"


def _demand(name: str, model: str, rps: float, lo: int = 0, hi: int = 8) -> GroupDemand:
    req = PlanRequest(model=load_model(model), gpu=load_gpu("h100-sxm"), rps=rps,
                      disaggregation="off")  # fmt: skip
    return GroupDemand(name, req, lo, hi)


def test_each_group_is_the_plan_of_its_own_request() -> None:
    demands = [_demand("llama", "meta-llama/Llama-3.1-8B", 30.0),
               _demand("big", "meta-llama/Llama-3.1-70B", 5.0)]  # fmt: skip
    result = plan_groups(demands, max_gpus=None)
    for d, g in zip(demands, result.groups, strict=True):
        alone = plan(d.request).chosen
        assert g.plan.chosen.layout == alone.layout
        assert g.gpus == alone.total_gpus == g.replicas * alone.layout.num_gpus
    assert result.gpus == sum(g.gpus for g in result.groups)
    assert result.groups[1].gpus_per_replica >= 2  # 70B bf16 does not fit one H100
    assert result.fits and result.fits_at_peak


def test_the_budget_verdicts() -> None:
    demands = [_demand("a", "meta-llama/Llama-3.1-8B", 30.0, hi=4),
               _demand("b", "Qwen/Qwen3-8B", 2.0, hi=2)]  # fmt: skip
    planned = plan_groups(demands, max_gpus=None)
    assert planned.peak_gpus == 6 and planned.gpus < planned.peak_gpus
    short = plan_groups(demands, max_gpus=planned.gpus - 1)
    assert not short.fits and short.verdict().startswith("does not fit")
    between = plan_groups(demands, max_gpus=planned.gpus)
    assert between.fits and not between.fits_at_peak and "not with every group" in between.verdict()
    roomy = plan_groups(demands, max_gpus=planned.peak_gpus)
    assert roomy.fits and roomy.fits_at_peak


def test_replicas_stay_within_the_groups_bounds() -> None:
    capped, floored = plan_groups(
        [_demand("hot", "meta-llama/Llama-3.1-8B", 200.0, hi=2),
         _demand("warm", "Qwen/Qwen3-8B", 0.1, lo=3)], max_gpus=None,
    ).groups  # fmt: skip
    assert capped.needed_replicas > 2 and capped.replicas == 2
    assert "max_replicas 2 caps it" in capped.notes[0]
    assert floored.needed_replicas == 1 and floored.replicas == 3 and floored.notes == ()


@pytest.mark.process
def test_cli_plans_the_documented_fleet(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    # the fleet YAML of docs/multi-model.md, as a user saves it
    text = DOC.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    path.write_text(text)
    assert yaml.safe_load(text)["groups"]
    cli = [sys.executable, "-c", "from gpufleet.cli import main; main()", "plan", "--groups",
           str(path)]  # fmt: skip
    ok = subprocess.run([*cli, "--max-gpus", "8", "--json"], capture_output=True, text=True,
                        timeout=60, check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert [(g["name"], g["engine"]) for g in data["groups"]] == [("llama", "vllm"),
                                                                  ("qwen", "sglang")]  # fmt: skip
    assert data["fits"] and data["peak_gpus"] == 6  # 4 + 2 single-GPU replicas at max
    over = subprocess.run([*cli, "--max-gpus", "1"], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert over.returncode == 1 and "does not fit" in over.stdout


def test_a_layout_the_config_states_is_the_one_costed() -> None:
    """`up` starts the config's tp/pp, so the budget must count that layout's GPUs (the
    plan's own choice used to be costed whatever the group said)."""
    free = _demand("free", "meta-llama/Llama-3.1-8B", 30.0)
    best = plan_groups([free], max_gpus=None).groups[0]
    assert best.chosen.layout.tp == 1 and best.notes == ()
    stated = GroupDemand("tp2", free.request, 0, 8, stated_layout=(2, 1))
    g = plan_groups([stated], max_gpus=None).groups[0]
    assert g.chosen.layout.tp == 2 and g.gpus_per_replica == 2
    assert g.gpus == g.replicas * 2
    assert g.to_dict()["layout_from"] == "config"
    assert "from the config; the plan would choose " in g.notes[0]
    assert g.notes[0].endswith(best.chosen.layout.label)


def test_a_stated_layout_the_model_cannot_fit_names_the_field() -> None:
    big = _demand("big", "meta-llama/Llama-3.1-70B", 1.0)
    stated = GroupDemand("big", big.request, 0, 8, stated_layout=(1, 1),
                         stated_where="groups[0].replicas")  # fmt: skip
    with pytest.raises(UserError) as err:
        plan_groups([stated], max_gpus=None)
    assert err.value.field == "groups[0].replicas.tp"
    assert "does not fit TP=1 PP=1" in str(err.value)
