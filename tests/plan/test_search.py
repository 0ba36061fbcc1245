"""Layout search: the seeds' decisions of issue 2, the decision trail, actionable errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.layout import Layout
from gpufleet.plan.render import render_launch_commands
from gpufleet.plan.search import MIN_USEFUL_CONCURRENCY, PlanRequest, plan
from gpufleet.specs import load_gpu, load_model

H100 = load_gpu("h100-sxm")


def request(model: str, **kw: object) -> PlanRequest:
    return PlanRequest(model=load_model(model), gpu=kw.pop("gpu", H100), **kw)  # type: ignore[arg-type]


def test_llama_70b_bf16_needs_tp_of_at_least_2() -> None:
    p = plan(request("meta-llama/Llama-3.1-70B", quant="bf16", rps=20))
    assert p.chosen.layout.tp >= 2 and p.chosen.layout.weight_dtype == "bf16"
    first = p.decisions[0]
    assert first.step == "precision" and not first.kept
    assert "bf16 weights 131.4 GiB" in first.reason and "1 × h100-sxm" in first.reason
    assert all(c.layout.tp >= 2 for c in p.candidates)


def test_llama_70b_int4_fits_one_80gb_gpu_with_kv_room() -> None:
    for gpu in ("h100-sxm", "a100-80gb"):
        p = plan(request("meta-llama/Llama-3.1-70B", gpu=load_gpu(gpu), quant="int4"))
        assert p.chosen.layout == Layout(tp=1, weight_dtype="int4", kv_dtype="bf16")
        assert p.chosen.kv_concurrent_requests >= MIN_USEFUL_CONCURRENCY
        assert p.chosen.memory.max_concurrent_seqs >= 1


@pytest.mark.parametrize("rps", [0.5, 5, 20, 80, 400, 2000])
def test_llama_8b_is_replicated_never_tp(rps: float) -> None:
    p = plan(request("meta-llama/Llama-3.1-8B", rps=rps))
    assert p.chosen.layout.tp == 1 and p.chosen.layout.pp == 1
    assert p.chosen.replicas is not None and p.chosen.performance is not None
    assert p.chosen.replicas * p.chosen.performance.max_requests_per_s >= rps
    assert p.chosen.total_gpus == p.chosen.replicas


def test_405b_bf16_needs_pp_across_nodes() -> None:
    p = plan(request("meta-llama/Llama-3.1-405B", quant="bf16", rps=1))
    layout = p.chosen.layout
    assert layout.pp >= 2 and layout.tp == 8 and layout.num_gpus > 8
    tp_rejections = [d for d in p.decisions if d.step == "tp" and not d.kept]
    assert any("TP=8" in d.option for d in tp_rejections)
    assert any(d.step == "pp" and d.kept for d in p.decisions)
    assert "--pipeline-parallel-size 2" in p.launch.vllm


def test_auto_quantizes_before_splitting() -> None:
    p = plan(request("meta-llama/Llama-3.1-70B", rps=5))
    steps = [d.step for d in p.decisions]
    # precision decisions come before any TP decision, TP before performance and replicas
    assert steps.index("tp") > max(i for i, s in enumerate(steps) if s == "precision")
    assert steps[-1] == "disagg" and steps[-2] == "replicas"
    assert p.chosen.layout.weight_dtype == "fp8"
    assert any("int4 would fit 1 GPU" in d.reason for d in p.decisions)


def test_auto_keeps_checkpoint_precision_when_it_fits() -> None:
    assert plan(request("llama-3.1-8b")).chosen.layout.weight_dtype == "bf16"
    assert plan(request("gpt-oss-20b")).chosen.layout.weight_dtype == "mxfp4"
    ds = plan(request("deepseek-v3", gpu=load_gpu("h200")))
    assert ds.chosen.layout.weight_dtype == "fp8" and ds.chosen.layout.num_gpus == 8


def test_moe_gets_an_ep_decision_with_numbers() -> None:
    p = plan(request("deepseek-ai/DeepSeek-V3", gpu=load_gpu("h200"), rps=5))
    ep = [d for d in p.decisions if d.step == "ep"]
    assert len(ep) == 1 and "EP=8" in ep[0].option
    assert "tok/s per GPU" in ep[0].reason
    dense = plan(request("llama-3.1-8b"))
    assert not any(d.step == "ep" for d in dense.decisions)


def test_larger_tps_rejected_with_numbers() -> None:
    p = plan(request("meta-llama/Llama-3.1-8B", rps=50))
    rejected = [d for d in p.decisions if d.step == "performance" and not d.kept]
    assert {d.option.split()[0] for d in rejected} == {"TP=2", "TP=4", "TP=8"}
    for d in rejected:
        assert "over-provisioned" in d.reason and "all-reduce" in d.reason and "%" in d.reason


def test_replicas_and_cost_follow_rps_and_price() -> None:
    base = plan(request("llama-3.1-8b", rps=10, gpu_price_per_hour_usd=2.0))
    more = plan(request("llama-3.1-8b", rps=100, gpu_price_per_hour_usd=2.0))
    assert more.chosen.replicas is not None and base.chosen.replicas is not None
    assert more.chosen.replicas > base.chosen.replicas
    assert more.chosen.cost_per_hour_usd == pytest.approx(2.0 * more.chosen.replicas)
    c = more.chosen
    assert c.cost_per_million_output_tokens_usd == pytest.approx(
        c.cost_per_hour_usd / (100 * 256 * 3600) * 1e6  # type: ignore[operator]
    )


def test_kv_fp8_used_only_when_it_makes_a_layout_fit() -> None:
    # 70B fp8 on 4 × L4 (24 GB): a bf16 KV cache holds too few requests, fp8 KV enough.
    p = plan(request("meta-llama/Llama-3.1-70B", gpu=load_gpu("l4"), rps=1))
    assert p.chosen.layout == Layout(tp=4, weight_dtype="fp8", kv_dtype="fp8")
    rejected = [d for d in p.decisions if d.step == "tp" and not d.kept]
    assert any(d.option == "TP=4 fp8/kv-bf16" and "want ≥" in d.reason for d in rejected)
    assert "--kv-cache-dtype fp8" in p.launch.vllm
    roomy = plan(request("llama-3.1-8b"))
    assert roomy.chosen.layout.kv_dtype == "bf16"
    forced = plan(request("llama-3.1-8b", kv_dtype="fp8"))
    assert forced.chosen.layout.kv_dtype == "fp8"


def test_impossible_request_names_smallest_fitting_layout() -> None:
    with pytest.raises(UserError) as e:
        plan(request("meta-llama/Llama-3.1-405B", quant="bf16", max_gpus=8))
    msg = str(e.value)
    assert "needs 2 nodes of 8 × h100-sxm with PP=2" in msg and "--max-gpus 8 allows none" in msg
    assert "--quant fp8" in msg  # a lower precision that fits the limit


def test_rps_beyond_max_gpus_is_an_error_with_the_ceiling() -> None:
    with pytest.raises(UserError) as e:
        plan(request("llama-3.1-8b", rps=1000, max_gpus=2))
    assert e.value.field == "--max-gpus" and "lower --rps" in str(e.value)


def test_bad_traffic_is_rejected() -> None:
    with pytest.raises(UserError) as e:
        plan(request("llama-3.1-8b", input_tokens=9000, max_model_len=8192))
    assert e.value.field == "--max-model-len"
    with pytest.raises(UserError):
        plan(request("llama-3.1-8b", rps=0))


def test_plan_to_dict_is_complete() -> None:
    d = plan(request("mixtral-8x7b", rps=3)).to_dict()
    assert d["chosen"]["layout"]["num_gpus"] >= 1
    assert {"memory", "performance", "replicas", "cost_per_hour_usd"} <= set(d["chosen"])
    assert d["decisions"] and d["launch"]["vllm"].startswith("vllm serve")


def test_render_flags() -> None:
    ds = load_model("deepseek-v3")
    cmds = render_launch_commands(
        ds,
        load_gpu("h200"),
        Layout(tp=8, ep=8, weight_dtype="fp8", kv_dtype="fp8"),
        max_model_len=8192,
    )
    for flag in ("--tensor-parallel-size 8", "--enable-expert-parallel", "--kv-cache-dtype fp8",
                 "--max-model-len 8192", "--gpu-memory-utilization 0.9", "--enable-prefix-caching"):  # fmt: skip
        assert flag in cmds.vllm
    assert "--quantization" not in cmds.vllm  # the checkpoint is already fp8
    for flag in (
        "--tp-size 8",
        "--ep-size 8",
        "--kv-cache-dtype fp8_e4m3",
        "--context-length 8192",
    ):
        assert flag in cmds.sglang
    llama = render_launch_commands(
        load_model("llama-3.1-70b"), H100, Layout(tp=2, weight_dtype="fp8"), max_model_len=4096
    )
    assert "--quantization fp8" in llama.vllm and "--quantization fp8" in llama.sglang
    int4 = render_launch_commands(
        load_model("llama-3.1-70b"), H100, Layout(weight_dtype="int4"), max_model_len=4096
    )
    assert "--quantization awq_marlin" in int4.vllm and any("AWQ" in n for n in int4.notes)


def test_unmeetable_slo_gives_a_warning_with_numbers() -> None:
    p = plan(request("llama-3.1-8b", tpot_slo_s=0.0005))
    assert p.chosen.replicas is None and p.chosen.performance is not None
    assert not p.chosen.performance.slo_met
    assert p.warnings and "TPOT" in p.warnings[0] and "--tpot-slo" in p.warnings[0]


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "l40s"])
def test_every_catalog_model_gets_a_plan(gpu: str) -> None:
    from gpufleet.specs import model_names

    for name in model_names():
        p = plan(request(name, gpu=load_gpu(gpu), rps=5))
        c = p.chosen
        assert c.memory.fits and c.kv_concurrent_requests >= MIN_USEFUL_CONCURRENCY, name
        assert c.layout.tp <= 8 and p.decisions, name


def test_small_nodes_push_to_pp_sooner() -> None:
    p = plan(
        request("meta-llama/Llama-3.1-70B", quant="bf16", gpus_per_node=2, rps=1, input_tokens=4096)
    )
    assert p.chosen.layout.tp == 2 and p.chosen.layout.pp >= 2
    assert "--pipeline-parallel-size" in p.launch.vllm


def test_config_directory_model_launches_from_its_path(tmp_path: Path) -> None:
    src = Path(__file__).parents[2] / "src/gpufleet/specs/data/models/Qwen--Qwen3-8B.json"
    (tmp_path / "config.json").write_text(src.read_text())
    p = plan(request(str(tmp_path)))
    assert p.chosen.layout.tp == 1
    assert p.launch.vllm.startswith(f"vllm serve {tmp_path}")


def test_quantizes_before_splitting_when_one_gpu_is_too_slow() -> None:
    # 8B bf16 fits one 24 GB L4 but reads 16 GB per token at 300 GB/s: TPOT > 50 ms.
    p = plan(request("meta-llama/Llama-3.1-8B", gpu=load_gpu("l4"), rps=1))
    assert p.chosen.layout == Layout(tp=1, weight_dtype="fp8")
    precision = [d for d in p.decisions if d.step == "precision"]
    assert [d.kept for d in precision] == [False, True]
    assert "TPOT" in precision[1].reason and "quantize before splitting" in precision[1].reason
    # With the precision pinned, it has to split instead.
    pinned = plan(request("meta-llama/Llama-3.1-8B", gpu=load_gpu("l4"), rps=1, quant="bf16"))
    assert pinned.chosen.layout.tp >= 2


@pytest.mark.parametrize(
    ("model", "gpu"), [("MiniMaxAI/MiniMax-M2", "h100-sxm"), ("deepseek-ai/DeepSeek-V3", "b200")]
)
def test_each_layout_is_listed_once(model: str, gpu: str) -> None:
    """The EP step's alternative (TP without EP) was listed a second time beside the same
    layout from the performance step: two identical rows in the memory table."""
    result = plan(PlanRequest(model=load_model(model), gpu=load_gpu(gpu), rps=5))
    layouts = [c.layout for c in result.candidates]
    assert len(layouts) == len(set(layouts))
    assert result.chosen in result.candidates
