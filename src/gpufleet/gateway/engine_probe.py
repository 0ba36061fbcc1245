"""Reading one replica's load the way its engine serves it, and naming the engine.

The parsing and the naming rules are the fleet core's (`parse_engine_metrics`,
`identify`); this is their I/O. A replica's metrics are fetched from its engine's paths
(trtllm-serve: `/prometheus/metrics`, then its JSON `/metrics`); an engine set in the
config is read by its own names only. A replica that serves none of them (404, or text
without load gauges) reports no load, and the gateway asks once what engine it runs
(`/v1/models` owned_by, `/info`, `/get_server_info`, `/version`) to say why in its log
and in `/admin/replicas`.
"""

from __future__ import annotations

import aiohttp

from gpufleet.fleet_state import (
    ENGINES,
    EngineIdentity,
    ScrapedMetrics,
    identify,
    metric_names,
    parse_engine_metrics,
)
from gpufleet.gateway import probes
from gpufleet.gateway.replicas import Replica

NO_METRICS_ENGINE = "openai"  # a plain OpenAI-compatible server: no load metrics at all


async def scrape(
    session: aiohttp.ClientSession, replica: Replica, timeout_s: float
) -> ScrapedMetrics | None:
    """What the replica's metrics say; None when it did not answer (try again later)."""
    configured = replica.engine if replica.engine_source == "config" else None
    known = replica.engine if replica.engine in ENGINES else None
    paths = metric_names(known).metrics_paths if known else ("/metrics",)
    found: ScrapedMetrics | None = None
    for path in paths:
        status, text = await probes.fetch_text(session, replica.url, path, timeout_s)
        if status is None:
            return None  # unreachable or timed out: its health probe says so
        if text is None:
            continue  # no such path (404) or an error answer
        try:
            scraped = parse_engine_metrics(text, configured)
        except ValueError:
            continue
        if scraped.load_reported:
            return scraped
        found = found or scraped
    return found or ScrapedMetrics.no_load(configured)


async def identify_engine(
    session: aiohttp.ClientSession, replica: Replica, scraped: ScrapedMetrics, timeout_s: float
) -> EngineIdentity:
    """The replica's engine from its other endpoints (asked once, when metrics do not say)."""
    if scraped.engine:
        return identify(scraped)
    cards = replica.model_cards
    found = identify(cards=cards)
    if found.engine:
        return found
    return identify(
        info=await probes.fetch_json(session, replica.url, "/info", timeout_s),
        server_info=await probes.fetch_json(session, replica.url, "/get_server_info", timeout_s),
        version=await probes.fetch_json(session, replica.url, "/version", timeout_s),
    )


def no_load_note(identity: EngineIdentity) -> str:
    """Why a replica is routed by in-flight counts, and how to change that."""
    if identity.engine == NO_METRICS_ENGINE:
        return "engine: openai (set in the config): no load metrics"
    hint = metric_names(identity.engine).enable_hint if identity.engine in ENGINES else ""
    return f"no load metrics ({identity.describe()}" + (f"; {hint})" if hint else ")")
