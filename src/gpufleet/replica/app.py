"""The simulated vLLM replica: an aiohttp server speaking vLLM's OpenAI API over the engine.

Endpoints (as vLLM serves them):
  POST /v1/completions, /v1/chat/completions   streaming (SSE) and not (`generate`)
  GET  /v1/models                               vLLM's model card, with max_model_len
  GET  /health                                  200 empty body; 503 while starting or dead
  GET  /metrics                                 Prometheus text, vLLM's names and buckets
  GET  /version, GET /load, POST /tokenize, POST /detokenize, GET|POST /ping
  GET  /get_model_info, /get_server_info (and /model_info, /server_info): SGLang's, which
       sglang-router asks every worker for when it registers it; their model_path is a
       local directory with this replica's tokenizer (tokenizer.json), so the router loads
       it from there instead of asking a model hub
  GET|POST /admin/faults                        fault injection (`faults`)
  POST /v1/load_lora_adapter, /v1/unload_lora_adapter   with --enable-lora and
       VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (`lora`, `lora_api`)

With `engine="sglang"` it speaks SGLang instead (`sglang.py`): its native /generate,
/health_generate and /flush_cache, its metric names (only with --enable-metrics), its
model cards and error shape, and neither /version nor /load.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from typing import Any

from aiohttp import web

from gpufleet import __version__
from gpufleet.engine import Engine
from gpufleet.engine.lora import AdapterSlots, LoraAdapter
from gpufleet.errors import UserError
from gpufleet.replica import info
from gpufleet.replica.config import ReplicaConfig
from gpufleet.replica.errors import RequestError
from gpufleet.replica.faults import FaultsApi
from gpufleet.replica.generate import Generator
from gpufleet.replica.http import error_response, json_response, openai_errors, read_json
from gpufleet.replica.lora import adapter_cards, adapter_from_path, runtime_updates_allowed
from gpufleet.replica.lora_api import LoraApi, SglangLoraApi
from gpufleet.replica.metrics import ReplicaMetrics
from gpufleet.replica.runner import EngineRunner
from gpufleet.replica.sglang import SglangApi, flat_errors
from gpufleet.replica.sglang_metrics import SglangMetrics
from gpufleet.tokenizer import Tokenizer, apply_chat_template, default_tokenizer


class ReplicaServer:
    """One replica: engine + real-time runner + HTTP app. `start()` binds; `stop()` closes."""

    def __init__(self, config: ReplicaConfig, tokenizer: Tokenizer | None = None):
        self.config = config
        self.tokenizer = tokenizer or default_tokenizer()
        self.model_name = config.served_model_names[0]
        slots = None
        if config.lora is not None:
            assert config.lora_cost is not None, "a LoRA config needs its cost model"
            slots = AdapterSlots(config.lora, config.lora_cost)
        self.engine = Engine(
            config.engine_config, config.step_time_model, seed=config.seed, lora=slots
        )
        self.adapter_bases: dict[str, str] = {}  # adapter -> base model, where --lora-modules said
        self._register_lora_modules()
        self.runner: EngineRunner | None = None
        self.faults = config.faults
        metrics_class = SglangMetrics if config.engine == "sglang" else ReplicaMetrics
        self.metrics = metrics_class(
            self.model_name,
            lambda: self.engine.stats,
            cache_config={
                "block_size": str(config.engine_config.block_size),
                "num_gpu_blocks": str(config.engine_config.num_gpu_blocks),
                "enable_prefix_caching": str(config.engine_config.enable_prefix_caching),
                "cache_dtype": "auto",
            },
            max_model_len=config.engine_config.max_model_len,
            lora=self._lora_info if slots is not None else None,
        )
        self.created = int(time.time())
        self.port = config.port
        self._ready_at = 0.0
        self.in_flight = 0
        self._site_runner: web.AppRunner | None = None
        self.generator = Generator(self)
        self.app = self._build_app()

    # ------------------------------------------------------------------ lifecycle
    def _build_app(self) -> web.Application:
        sglang = self.config.engine == "sglang"
        middlewares = [openai_errors, flat_errors] if sglang else [openai_errors]
        app = web.Application(client_max_size=64 * 2**20, middlewares=middlewares)
        r = app.router
        r.add_post("/v1/completions", self.generator.completions)
        r.add_post("/v1/chat/completions", self.generator.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        if self.config.enable_metrics:
            r.add_get("/metrics", self.metrics_endpoint)
        if sglang:
            SglangApi(self).add_routes(app)
        else:
            r.add_get("/version", self.version)
            r.add_get("/load", self.load)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        # SGLang's info endpoints: sglang-router asks workers for them when it registers them.
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        FaultsApi(self.faults, self._set_slow).add_routes(app)
        if sglang:  # SGLang routes its dynamic-LoRA API always (no environment switch)
            SglangLoraApi(self).add_routes(app)
        elif runtime_updates_allowed():
            LoraApi(self).add_routes(app)
        return app

    # ------------------------------------------------------------------ LoRA
    def _register_lora_modules(self) -> None:
        """--lora-modules: registered (and loaded) before the server answers."""
        slots = self.engine.lora
        for m in self.config.lora_modules:
            if slots is None:
                raise UserError("needs --enable-lora", field="--lora-modules")
            try:
                adapter = adapter_from_path(m.name, m.path, slots.config.max_lora_rank)
                self.engine.add_lora(adapter, 0.0)
            except (RequestError, ValueError) as e:
                raise UserError(str(e), field="--lora-modules") from None
            if m.base_model_name:
                self.adapter_bases[m.name] = m.base_model_name

    def adapter(self, model: str) -> LoraAdapter | None:
        """The registered adapter a request's `model` names, if it names one (SGLang also
        takes `<base>:<adapter>`)."""
        slots = self.engine.lora
        if slots is None:
            return None
        if self.config.engine == "sglang" and model not in slots.registered:
            base, _, name = model.rpartition(":")
            if base in self.config.served_model_names:
                return slots.registered.get(name)
        return slots.registered.get(model)

    def servable_models(self) -> list[str]:
        """Names a request may ask for: the served model names, then the adapters (on
        SGLang each also as `<base>:<adapter>`)."""
        slots = self.engine.lora
        adapters = list(slots.registered) if slots is not None else []
        if self.config.engine == "sglang":
            adapters += [f"{self.model_name}:{a}" for a in adapters]
        return [*self.config.served_model_names, *adapters]

    def _lora_info(self) -> tuple[dict[str, int], dict[str, int], int]:
        """(running, waiting requests per adapter, max_lora) for vllm:lora_requests_info."""
        slots = self.engine.lora
        assert slots is not None
        waiting = slots.waiting_adapters(self.engine.scheduler.waiting)
        return dict(slots.running), waiting, slots.config.max_loras

    def _set_slow(self, factor: float) -> None:
        if self.runner is not None:
            self.runner.slow_factor = factor

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready_at = loop.time() + self.config.startup_s
        iteration_tokens = self.metrics.iteration_tokens
        self.runner = EngineRunner(
            self.engine,
            time_scale=self.config.time_scale,
            on_step=lambda outcome: iteration_tokens.observe(outcome.num_scheduled_tokens),
        )
        self.runner.slow_factor = self.faults.slow_factor
        self.runner.start()
        # handler_cancellation: a client that disconnects cancels its handler at once,
        # which aborts its request in the engine.
        access_log = None
        if self.config.access_log:
            import logging
            import sys

            access_log = logging.getLogger("gpufleet.replica.access")
            access_log.setLevel(logging.INFO)
            access_log.addHandler(logging.StreamHandler(sys.stderr))
        self._site_runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=access_log, shutdown_timeout=1.0
        )
        await self._site_runner.setup()
        site = web.TCPSite(self._site_runner, self.config.host, self.config.port, backlog=1024)
        try:
            await site.start()
        except OSError:
            await self.stop()
            raise
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = sockets[0].getsockname()[1]
        if self.config.exit_after_s is not None:
            loop.call_later(self.config.exit_after_s, os._exit, 1)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
        if self._site_runner is not None:
            await self._site_runner.cleanup()
            self._site_runner = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def starting(self) -> bool:
        return asyncio.get_running_loop().time() < self._ready_at

    def dead(self) -> bool:
        return self.runner is None or not self.runner.alive

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, request: web.Request) -> web.Response:
        if self.starting() or self.dead() or self.faults.unhealthy:
            return web.Response(status=503)
        return web.Response(status=200)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": info.VLLM_API_VERSION, "gpufleet_version": __version__})

    async def model_info(self, request: web.Request) -> web.Response:
        return json_response(info.sglang_model_info(self.model_name, self.tokenizer))

    async def server_info(self, request: web.Request) -> web.Response:
        return json_response(
            info.sglang_server_info(
                self.model_name,
                self.tokenizer,
                self.config.engine_config,
                tp=self.config.tp,
                engine=self.config.engine,
                enable_metrics=self.config.enable_metrics,
            )
        )

    async def load(self, request: web.Request) -> web.Response:
        return json_response({"server_load": self.in_flight})

    async def models(self, request: web.Request) -> web.Response:
        body = info.model_list(
            self.config.served_model_names,
            root=self.model_name,
            max_model_len=self.config.engine_config.max_model_len,
            created=self.created,
            engine=self.config.engine,
        )
        slots = self.engine.lora
        if slots is not None:
            body["data"] += adapter_cards(
                list(slots.registered.values()), self.adapter_bases, self.model_name, self.created
            )
        return json_response(body)

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model not in self.servable_models():
            raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self.check_model(body)
            if "messages" in body:
                messages = body["messages"]
                if not isinstance(messages, list):
                    raise RequestError("messages must be a list", param="messages")
                text = apply_chat_template(messages, bool(body.get("add_generation_prompt", True)))
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise RequestError("prompt must be a string", param="prompt")
                text = prompt
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        ids = self.tokenizer.encode(text)
        strs = text.split() if body.get("return_token_strs") else None
        return json_response(
            {
                "count": len(ids),
                "max_model_len": self.config.engine_config.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self.check_model(body)
            tokens = body.get("tokens")
            vocab = self.tokenizer.vocab_size
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
            ):
                raise RequestError(f"tokens must be a list of ids in [0, {vocab})", param="tokens")
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        return json_response({"prompt": self.tokenizer.decode(tokens)})


def _raise_open_files_limit() -> None:
    """One socket per stream: allow as many as the hard limit does."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


async def serve(config: ReplicaConfig, *, ready_message: bool = True) -> None:
    """Run a replica until SIGINT/SIGTERM."""
    import signal

    _raise_open_files_limit()
    server = ReplicaServer(config)
    await server.start()
    # Everything alive now (modules, tokenizer, engine, KV block tables) lives as long as
    # the process: keep it out of the garbage collector's full passes, which otherwise
    # stall a request for milliseconds now and then (vLLM freezes its startup heap too).
    gc.collect()
    gc.freeze()
    if ready_message:
        print(
            f"gpufleet replica: serving {server.model_name} on {server.url}"
            f" (startup {config.startup_s:g}s, time scale {config.time_scale:g})",
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()
