"""LoRA adapters in the fleet core: the catalog, admission to replicas that hold or may load
an adapter, registrations, refusals, and vllm:lora_requests_info scrapes (pure)."""

from __future__ import annotations

from gpufleet.fleet_state import (
    AdapterCatalog,
    AdapterSpec,
    QueueTicket,
    Refusal,
    ScrapedMetrics,
    parse_engine_metrics,
)
from gpufleet.fleet_state.lora_metrics import LoraRequestsInfo

from .helpers import fleet, info, ready

SQL = AdapterSpec("sql", "/adapters/sql", "m")


def test_catalog_learns_adapters_from_model_cards_and_keeps_declared_ones() -> None:
    catalog = AdapterCatalog([SQL])
    cards = [
        {"id": "m", "root": "/models/m", "parent": None},
        {"id": "sql", "root": "/elsewhere/sql", "parent": "m"},
        {"id": "chat", "root": "/adapters/chat", "parent": "m"},
    ]
    assert catalog.learn(cards) == [AdapterSpec("chat", "/adapters/chat", "m")]
    assert catalog.get("sql") == SQL  # the config's path wins
    assert catalog.learn(cards) == []
    assert {s.name for s in catalog} == {"sql", "chat"}
    assert catalog.card(SQL)["parent"] == "m" and catalog.card(SQL)["root"] == "/adapters/sql"


def test_a_request_for_an_adapter_is_served_by_its_base_models_replicas() -> None:
    f = fleet(adapters=[SQL])
    assert f.model_known("sql") and not f.model_known("nope")
    assert f.resolve("sql") == ("m", "sql")
    assert f.resolve("m") == ("m", None)
    r1, r2 = ready(f, "r1"), ready(f, "r2")
    q = info(1, "m", adapter="sql")
    assert list(f.candidates(q, None)) == [r1, r2]
    assert f.adapter_missing(q, r1) == SQL
    f.adapter_registered(r1, "sql")
    assert f.adapter_missing(q, r1) is None
    assert "sql" in r1.models and r1.adapter_loads == 1 and r1.lora_loadable
    assert f.table.eligible("sql", None) == [r1]  # its holders
    f.adapter_forgotten(r1, "sql")
    assert f.adapter_missing(q, r1) == SQL


def test_replicas_that_refuse_runtime_loading_get_only_adapters_they_hold() -> None:
    f = fleet(adapters=[SQL, AdapterSpec("chat", "/a/chat", "m")])
    r1, r2 = ready(f, "r1"), ready(f, "r2")
    f.adapter_registered(r2, "chat", loaded=False)  # it was started with it
    f.adapter_refused(r2, "404 on /v1/load_lora_adapter")
    q = info(1, "m", adapter="sql")
    assert list(f.candidates(q, None)) == [r1]
    assert f.admit("m", None, 0.0, 5.0, adapter="sql") == [r1]
    assert list(f.candidates(info(2, "m", adapter="chat"), None)) == [r1, r2]
    f.adapter_refused(r1, "LoRA is not enabled")
    refused = f.admit("m", None, 0.0, 5.0, adapter="sql")
    assert isinstance(refused, Refusal) and refused.status == 503
    assert refused.reason == "adapter_not_loadable"
    assert "r1: LoRA is not enabled" in refused.message and "r2: 404" in refused.message


def test_a_waiting_request_keeps_its_adapter_in_the_queue() -> None:
    f = fleet(adapters=[SQL])
    ticket = f.admit("m", None, 0.0, 5.0, adapter="sql")
    assert isinstance(ticket, QueueTicket) and ticket.adapter == "sql"
    r1 = ready(f, "r1")
    f.adapter_refused(r1, "no LoRA")
    again = f.admit("m", None, 1.0, 5.0, ticket)
    assert isinstance(again, Refusal) and again.reason == "adapter_not_loadable"
    assert len(f.queue) == 0


def test_scrapes_carry_lora_state_and_teach_what_a_replica_runs() -> None:
    f = fleet()
    r1 = ready(f, "r1")
    lora = LoraRequestsInfo(running=("a", "b"), waiting=("c",), max_lora=2)
    f.apply_scrape(r1, ScrapedMetrics(num_running=3, lora=lora), 1.0)
    assert r1.stats is not None
    assert r1.stats.running_adapters == ("a", "b") and r1.stats.waiting_adapters == ("c",)
    assert r1.stats.max_lora == 2
    assert {"a", "b", "c"} <= r1.models
    f.apply_scrape(r1, ScrapedMetrics(num_running=0), 2.0)
    assert r1.stats.max_lora is None and {"a", "b", "c"} <= r1.models


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="b",waiting_lora_adapters="c, d"} 1.8e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.75e+09
"""


def test_the_latest_lora_requests_info_line_wins() -> None:
    scraped = parse_engine_metrics(METRICS)
    assert scraped.num_running == 2
    assert scraped.lora == LoraRequestsInfo(running=("b",), waiting=("c", "d"), max_lora=4)
    assert parse_engine_metrics(METRICS.split("# HELP vllm:lora")[0]).lora is None
    only_lora = "\n".join(line for line in METRICS.splitlines() if "lora" in line)
    assert parse_engine_metrics(only_lora).lora == scraped.lora


def test_a_line_as_vllm_prints_it() -> None:
    # From a public vLLM (CPU) run's /metrics, quoted in a LoRA write-up found with the
    # code search (an adapter both running and waiting; max_lora 2).
    text = (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="alpaca",'
        'waiting_lora_adapters="alpaca"} 1.789828498802105e+09\n'
    )
    lora = parse_engine_metrics(text).lora
    assert lora == LoraRequestsInfo(running=("alpaca",), waiting=("alpaca",), max_lora=2)
