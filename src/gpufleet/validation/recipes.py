"""The launch recipes behind measured rows: engine options their campaigns set away from
the engines' defaults, as the recipes publish them.

The shared CSV's rows whose ids start with a date (`2026_04_06_llama_3_1_70b_h200_sxm_
trtllm_fp8_agg_1024x1024_c16_tp4_...`) or `dsr1_h200_...` are the InferenceMAX grid (ISL x
OSL in 1k/1k, 1k/8k, 8k/1k, concurrency 4-256). Its benchmark scripts
(`benchmarks/<model>_<precision>_h200[_trt]_slurm.sh`) run `benchmark_serving.py
--num-prompts $((CONC * 10)) --max-concurrency $CONC --request-rate inf --ignore-eos`
(every client sends 10 requests, all starting at once) against servers launched with:

* TRT-LLM, Llama-3.1-70B: `--max_num_tokens 16384`; for ISL = OSL = 1024 with TP < 8
  also `batch_wait_max_tokens_ratio: 0.9, batch_wait_timeout_iters: 20` ("will improve
  the performance, by default they are all zeros").
* TRT-LLM, DeepSeek-R1: `--max_num_tokens $(( (CONC + ISL + 64 + 63) / 64 * 64 ))`;
  with attention DP (the script turns it on above 64 clients, 32 for 8k/1k) also
  `attention_dp_config: {enable_balance: true, batching_wait_iters: 0, timeout_iters: 60}`
  (`benchmarks/dsr1_fp8_h200_trt_slurm.sh`).
* vLLM, Llama-3.1-70B: `async-scheduling: true` (the next iteration is scheduled while
  this one runs, as SGLang and TRT-LLM do by default), `max-num-batched-tokens: 8192`,
  `--max-num-seqs $CONC`.
* SGLang, DeepSeek-R1: `--chunked-prefill-size 32768 --max-prefill-tokens 32768`,
  `--max-running-requests` and `--cuda-graph-max-bs` 512 for 1k/1k, 256 otherwise.

Everything else (the aiconfigurator campaigns' rows) runs the engines' defaults.

Not modelled, on purpose: the TRT-LLM 1.0.0rc3 Llama-3.1-8B-Instruct rows (H100, all
TP) at 8-32 clients wait about one completion interval before their first token: TTFT
less prefill ~= 0.9 x (osl - 1) x TPOT / (clients - 1), as if one client were always
queued behind the others (no engine rule we found says so). It is not the engine version:
the same campaign's Qwen3-235B rows here, and its Qwen3-32B rows upstream (aiconfigurator
`silicon_sample.csv`, same version, GPU and harness, 176 rows), show no such slope at
similar iteration times; not the KV cache (it holds every client at TP 8 too); not batch
waiting (that wait would not grow with osl); and aiconfigurator's own TRT-LLM model has no
such term (`_ttft_queuing_factor` scales the prefill only). Keyed on the model name it
would be a fit, so those 177 rows stay a measured miss (26.5 % median TTFT APE; the other 579
rows' median is 13 %).

Off by default (`model_row(..., recipes=True)`, `plan_accuracy.py --recipes`), except the
TRT-LLM Llama batch waiting, which every prediction models (`batch_wait_rules`). TTFT
median APE in-sample / leave-one-model-out / leave-one-GPU-out on the shared CSV:

* engines' defaults, shipped constants: 18.0 / 19.8 / 25.8 %;
* recipes, constants refitted with them (`--recipes`; the held-out refits start from the
  shipped constants, as every held-out refit does): 17.4 / 18.6 / 20.6 %;
* recipes with those refitted constants shipped (the held-out refits start from them):
  17.4 / 21.9 / 23.8 %; leave-one-model-out misses its 20 % target, which is why the
  recipes stay off.

The leave-one-model-out figure moves with where the held-out refits start because the
dense and MoE rows want different first-token overheads: the batch wait explains the
dense TRT-LLM rows' excess that TRT-LLM's single `ttft_overhead_s` absorbed, so without
Qwen3 the refit pulls that constant from 0.15 to 0.08 s and Qwen3's TRT-LLM rows go from
13 to 23 %. Low-load rows (<= 8 clients) show the gap: measured TTFT less the model's GPU
part (own prefill and the iterations ahead) is 13-27 ms on dense models and 110-360 ms on
MoE models, in all three engines and both harnesses; a first-token cost that does not
stall other requests' decodes (their TPOT barely moves with the output length), now
`Calibration.moe_first_token_s` (one constant for all engines, outside the GPU's
iterations). These figures predate it.

The scripts' 10 requests per client are not imposed: every row keeps its backend's fitted
first-wave weight (`BackendCalibration.benchmark_requests_per_client`, 6-12). With the
other recipes and the shipped constants, pinning the InferenceMAX rows to 10 moved
in-sample TTFT from 18.4 to 18.7 % and leave-one-model-out from 18.6 to 23.9 %: the
fitted weight also absorbs first-token time the model lacks.
"""

from __future__ import annotations

import dataclasses
import re

from gpufleet.plan.engines import EngineRules
from gpufleet.validation.rows import MeasuredRow

_INFERENCEMAX_ID = re.compile(r"^(\d{4}_\d\d_\d\d_|dsr1_)")
_CONCURRENCY = re.compile(r"_c(\d+)_")


def is_inferencemax(row: MeasuredRow) -> bool:
    return bool(_INFERENCEMAX_ID.match(row.id))


def recipe_rules(row: MeasuredRow, rules: EngineRules) -> EngineRules:
    """The engine's rules as the row's launch recipe changed them (unchanged otherwise)."""
    if not is_inferencemax(row):
        return rules
    model = row.model_path.lower()
    if rules.name == "vllm":
        return dataclasses.replace(
            rules, overlap_scheduling=True, max_num_batched_tokens=8192, max_num_seqs=_conc(row)
        )
    if rules.name == "sglang":
        running = 512 if row.isl == 1024 and row.osl == 1024 else 256
        return dataclasses.replace(
            rules,
            max_num_batched_tokens=32768,
            max_num_seqs=running,
            cuda_graph_max_batch=running,
        )
    if rules.name != "trtllm":
        return rules
    if "llama" in model:
        return batch_wait_rules(row, dataclasses.replace(rules, max_num_batched_tokens=16384))
    if "deepseek" in model:
        budget = (_conc(row) + row.isl + 64 + 63) // 64 * 64
        balance = ADP_BALANCE_TIMEOUT_ITERS if row.attention_dp > 1 else 0
        return dataclasses.replace(
            rules, max_num_batched_tokens=budget, adp_balance_timeout_iters=balance
        )
    return rules


def batch_wait_rules(row: MeasuredRow, rules: EngineRules) -> EngineRules:
    """The rules with the batch waiting the row's launch recipe turned on (InferenceMAX
    TRT-LLM Llama-3.1-70B at ISL = OSL = 1024, TP < 8: `batch_wait_timeout_iters: 20`,
    `batch_wait_max_tokens_ratio: 0.9`); unchanged for every other row.

    Applied to every prediction of a measured row, recipes or not (`measured.model_row`):
    it is what those 18 rows' servers did to each new prompt — hold it up to 20 iterations
    while decodes run — and the engines' defaults cannot explain their TTFT without it
    (measured 2x the prediction at every concurrency, where the same model's 1k/8k and
    8k/1k rows, no batch wait, fit). Unlike the recipes' token budgets and scheduling
    options it changes no throughput the fit could trade against other constants: with
    it the refit moves no constant by more than 20 %.

    The attention-DP balancing of the InferenceMAX TRT-LLM DeepSeek rows is left to
    `recipe_rules`: applied to every prediction it did what it should to those 13 rows
    (TTFT log bias -0.65..-1.94 -> +0.02..-0.91 under the shipped constants) but the
    held-out refits moved elsewhere (docs/performance-model.md, wave 13)."""
    if (
        rules.name == "trtllm"
        and is_inferencemax(row)
        and "llama" in row.model_path.lower()
        and row.isl == 1024
        and row.osl == 1024
        and row.tp < 8
    ):
        return dataclasses.replace(rules, batch_wait_iters=20, batch_wait_max_tokens_ratio=0.9)
    return rules


# InferenceMAX's `dsr1-fp8-h200-trt-mtp` sweep (benchmarks/dsr1_fp8_h200_trt_mtp*.sh,
# image 1.1.0rc2.post2): `speculative_config: {decoding_type: MTP,
# num_nextn_predict_layers: 3}`, 1 with attention DP ("MTP=3 (or MTP=1 when DP_ATTN=true)").
MTP_DRAFT_TOKENS = 3
MTP_DRAFT_TOKENS_ADP = 1
_DATED_ID = re.compile(r"^\d{4}_\d\d_\d\d_")


def runs_mtp_recipe(row: MeasuredRow) -> bool:
    """Whether the row is one of InferenceMAX's TRT-LLM DeepSeek MTP sweep.

    InferenceMAX's H200 TRT-LLM DeepSeek sweeps both run EP = TP = 8 (attention DP at high
    concurrency), one plain (`dsr1-fp8-h200-trt`), one with MTP (`...-trt-mtp`), and only
    the MTP sweep goes past 64 clients at 1k/1k (attention DP from 128) or past 64 at 8k/1k.
    The shared CSV's dated TRT-LLM DeepSeek campaign labelled EP 8 holds those rows (1k/1k
    at 128 and 256 clients under attention DP 8; 8k/1k at 128 and 256), so it is the MTP
    sweep; its TPOT is what MTP gives (1k/8k at 0.80-0.83 of 1k/1k at 4-32 clients, where
    the plain population reads 0.97-0.99: acceptance grows over long generations). The
    `dsr1_...cfg181/183` rows (EP 8 labels, plain sweep's grid: 8k/1k stops at 64 clients)
    and the campaign's EP 1-labelled copies are the plain sweep."""
    return (
        row.backend == "trtllm"
        and "deepseek" in row.model_path.lower()
        and bool(_DATED_ID.match(row.id))
        and row.moe_ep > 1
    )


# Whether `speculative_rules` models the MTP sweep's drafts. Off: with them (and the
# expert parallelism as launched) the fit's objective rises from both starts, 1.1713 ->
# 1.1811 from the shipped constants and 1.3149 -> 1.3745 from the prior, and the fitted
# acceptance (0.29) stands in for TRT-LLM's DeepSeek decode, 1.45x slower in both sweeps
# than Qwen3's rows set (docs/performance-model.md, "Wave 17: DeepSeek"). Switching it on
# means adding `mtp_acceptance_rate` to `validation.fit.FITTED_SCALARS`.
MTP_SWEEP_MODELLED = False


def speculative_rules(row: MeasuredRow, rules: EngineRules) -> EngineRules:
    """The rules with the multi-token prediction the row's launch recipe turned on
    (`runs_mtp_recipe`) when `MTP_SWEEP_MODELLED`; unchanged for every other row. Applied
    to every prediction of a measured row, as `batch_wait_rules` is: it is what those
    servers ran."""
    if not (MTP_SWEEP_MODELLED and runs_mtp_recipe(row)):
        return rules
    drafts = MTP_DRAFT_TOKENS_ADP if row.attention_dp > 1 else MTP_DRAFT_TOKENS
    return dataclasses.replace(rules, mtp_draft_tokens=drafts)


def recipe_expert_parallel(row: MeasuredRow) -> bool:
    """Whether the row's launch recipe ran its experts expert-parallel over all of its
    GPUs whatever its labels say: InferenceMAX's H200 TRT-LLM DeepSeek scripts set
    `EP_SIZE=$TP` in every version (benchmarks/dsr1_fp8_h200_trt*_slurm.sh, 2025-09 on),
    yet the shared CSV labels one copy of their plain sweep MoE TP 8 x EP 1 (`cfg83`, and
    its dated `tp8_ep1` copies), equal to the EP 8-labelled `cfg181` rows within 0-3 %."""
    return (
        row.backend == "trtllm"
        and "deepseek" in row.model_path.lower()
        and is_inferencemax(row)
        and row.moe_ep == 1
    )


# InferenceMAX's TRT-LLM DeepSeek recipe with attention DP: attention_dp_config.timeout_iters
# (enable_balance: true, batching_wait_iters: 0).
ADP_BALANCE_TIMEOUT_ITERS = 60


def _conc(row: MeasuredRow) -> int:
    """The recipe's CONC: all clients of the row (its id's `_c<N>_`)."""
    found = _CONCURRENCY.search(row.id)
    return int(found.group(1)) if found else row.batch_size * max(1, row.attention_dp)
