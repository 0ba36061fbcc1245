"""The simulated vLLM replica: an aiohttp server speaking vLLM's OpenAI API over the engine.

Endpoints (as vLLM serves them):
  POST /v1/completions, /v1/chat/completions   streaming (SSE) and not
  GET  /v1/models                               vLLM's model card, with max_model_len
  GET  /health                                  200 empty body; 503 while starting or dead
  GET  /metrics                                 Prometheus text, vLLM's names and buckets
  GET  /version, GET /load, POST /tokenize, POST /detokenize, GET|POST /ping
  GET  /get_model_info, /get_server_info (and /model_info, /server_info): SGLang's, which
       sglang-router asks every worker for when it registers it; their model_path is a
       local directory with this replica's tokenizer (tokenizer.json), so the router loads
       it from there instead of asking a model hub

Fault injection, for testing gateways and autoscalers (also settable by CLI flags):
  GET  /admin/faults                            the current faults as JSON
  POST /admin/faults  {"fail_next": N, "fail_status": 503}
                      the next N generation requests fail with that status (OpenAI error body)
                      {"slow_factor": 3.0}      every engine iteration takes 3x longer
                      {"unhealthy": true}       /health answers 503 (the server keeps serving)
                      {"exit": true, "exit_code": 1, "exit_after_s": 0.0}
                      the process exits abruptly (os._exit, no cleanup, streams cut)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
import uuid
from bisect import bisect_left
from typing import Any

from aiohttp import web

from gpufleet import __version__
from gpufleet.engine import Engine, EngineRequest, FinishReason
from gpufleet.openai_errors import error_json_bytes
from gpufleet.replica import info
from gpufleet.replica.config import ReplicaConfig
from gpufleet.replica.generation import ContextSeededRequest, request_seed
from gpufleet.replica.metrics import ReplicaMetrics
from gpufleet.replica.protocol import GenerationParams, RequestError, parse_generation_request
from gpufleet.replica.runner import EngineRunner, RequestStream
from gpufleet.replica.sse import ChunkTemplates, error_event, escape
from gpufleet.replica.stops import StopScanner
from gpufleet.tokenizer import Tokenizer, apply_chat_template, default_tokenizer

# per stream: unsent bytes past this go through aiohttp's flow control instead
_MAX_UNSENT_BYTES = 1 << 20


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, content_type="application/json"
    )


def _error(message: str, status: int, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_json_bytes(message, status, param=param),
        status=status,
        content_type="application/json",
    )


class ReplicaServer:
    """One replica: engine + real-time runner + HTTP app. `start()` binds; `stop()` closes."""

    def __init__(self, config: ReplicaConfig, tokenizer: Tokenizer | None = None):
        self.config = config
        self.tokenizer = tokenizer or default_tokenizer()
        self.model_name = config.served_model_names[0]
        self.engine = Engine(config.engine_config, config.step_time_model, seed=config.seed)
        self.runner: EngineRunner | None = None
        self.faults = config.faults
        self.metrics = ReplicaMetrics(
            self.model_name,
            lambda: self.engine.stats,
            cache_config={
                "block_size": str(config.engine_config.block_size),
                "num_gpu_blocks": str(config.engine_config.num_gpu_blocks),
                "enable_prefix_caching": str(config.engine_config.enable_prefix_caching),
                "cache_dtype": "auto",
            },
            max_model_len=config.engine_config.max_model_len,
        )
        self.created = int(time.time())
        self.port = config.port
        self._ready_at = 0.0
        self._in_flight = 0
        self._site_runner: web.AppRunner | None = None
        # Token id -> its JSON-ready bytes (vocabulary words need no escaping).
        self._token_bytes = [(" " + w).encode() for w in self.tokenizer.vocab]
        self.app = self._build_app()

    # ------------------------------------------------------------------ lifecycle
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics_endpoint)
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
        r.add_get("/admin/faults", self.get_faults)
        r.add_post("/admin/faults", self.set_faults)
        return app

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
        await site.start()
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

    def _starting(self) -> bool:
        return asyncio.get_running_loop().time() < self._ready_at

    def _dead(self) -> bool:
        return self.runner is None or not self.runner.alive

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, request: web.Request) -> web.Response:
        if self._starting() or self._dead() or self.faults.unhealthy:
            return web.Response(status=503)
        return web.Response(status=200)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": info.VLLM_API_VERSION, "gpufleet_version": __version__})

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(info.sglang_model_info(self.model_name, self.tokenizer))

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(
            info.sglang_server_info(
                self.model_name, self.tokenizer, self.config.engine_config, tp=self.config.tp
            )
        )

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self._in_flight})

    async def models(self, request: web.Request) -> web.Response:
        return _json(
            info.model_list(
                self.config.served_model_names,
                root=self.model_name,
                max_model_len=self.config.engine_config.max_model_len,
                created=self.created,
            )
        )

    async def _read_json(self, request: web.Request) -> Any:
        try:
            return await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"invalid JSON body: {e}") from e

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model not in self.config.served_model_names:
            raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self._check_model(body)
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
            return _error(e.message, e.status, e.param)
        ids = self.tokenizer.encode(text)
        strs = text.split() if body.get("return_token_strs") else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.config.engine_config.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self._check_model(body)
            tokens = body.get("tokens")
            vocab = self.tokenizer.vocab_size
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
            ):
                raise RequestError(f"tokens must be a list of ids in [0, {vocab})", param="tokens")
        except RequestError as e:
            return _error(e.message, e.status, e.param)
        return _json({"prompt": self.tokenizer.decode(tokens)})

    async def get_faults(self, request: web.Request) -> web.Response:
        return _json(self.faults.as_json())

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            f = self.faults
            if "fail_next" in body:
                v = body["fail_next"]
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise RequestError("fail_next must be an integer >= 0", param="fail_next")
                f.fail_next = v
            if "fail_status" in body:
                v = body["fail_status"]
                if not isinstance(v, int) or isinstance(v, bool) or not 400 <= v <= 599:
                    raise RequestError(
                        "fail_status must be an HTTP error status", param="fail_status"
                    )
                f.fail_status = v
            if "slow_factor" in body:
                v = body["slow_factor"]
                if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                    raise RequestError("slow_factor must be a number > 0", param="slow_factor")
                f.slow_factor = float(v)
                if self.runner is not None:
                    self.runner.slow_factor = f.slow_factor
            if "unhealthy" in body:
                if not isinstance(body["unhealthy"], bool):
                    raise RequestError("unhealthy must be a boolean", param="unhealthy")
                f.unhealthy = body["unhealthy"]
            if body.get("exit"):
                code = body.get("exit_code", 1)
                after = body.get("exit_after_s", 0.0)
                if not isinstance(code, int) or not isinstance(after, int | float) or after < 0:
                    raise RequestError(
                        "exit_code must be an int and exit_after_s >= 0", param="exit"
                    )
                # Answer first, then die without any cleanup, like a crashed process.
                asyncio.get_running_loop().call_later(max(after, 0.05), os._exit, code)
        except RequestError as e:
            return _error(e.message, e.status, e.param)
        return _json(self.faults.as_json())

    # ------------------------------------------------------------------ generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        # The simulated GPU starts from the request's arrival: the replica's own Python
        # work (reading JSON, tokenizing) is simulation overhead, not modelled time.
        received_wall_s = time.monotonic()
        if self._starting():
            return _error("the model is still loading", 503)
        if self._dead():
            return _error("the engine is dead", 503)
        if self.faults.fail_next > 0:
            self.faults.fail_next -= 1
            return _error("injected failure", self.faults.fail_status)
        try:
            body = await self._read_json(request)
            params = parse_generation_request(
                body,
                kind=kind,
                served_model_names=self.config.served_model_names,
                max_model_len=self.config.engine_config.max_model_len,
                tokenizer=self.tokenizer,
            )
        except RequestError as e:
            return _error(e.message, e.status, e.param)
        assert self.runner is not None
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        request_id = prefix + uuid.uuid4().hex
        # The answer is a function of the seed and the context (replica.generation): the
        # same seed and prompt give the same answer, and so does continuing a part of it.
        req = ContextSeededRequest(
            request_id,
            params.prompt_token_ids,
            params.max_tokens,
            seed=request_seed(params.seed),
            stop_after_tokens=params.stop_after_tokens,
        )
        stream = self.runner.submit(req, received_wall_s=received_wall_s)
        self._in_flight += 1
        done = False
        try:
            if params.stream:
                response = await self._stream(request, params, stream)
            else:
                response = await self._complete(params, stream)
            done = True
            return response
        finally:
            self._in_flight -= 1
            if not req.is_finished:
                # a stop string matched (done), or the client left / an error (not done)
                reason = FinishReason.STOP if done else FinishReason.ABORT
                self.runner.abort(request_id, reason)

    def _observe_tokens(self, stream: RequestStream, count: int) -> None:
        assert self.runner is not None
        now = self.runner.step_wall_s
        m = self.metrics
        if stream.first_token_wall_s is None:
            stream.first_token_wall_s = now
            m.ttft.observe(now - stream.arrival_wall_s)
            req = stream.req
            if req.first_scheduled_s is not None and req.arrival_s is not None:
                m.queue.observe((req.first_scheduled_s - req.arrival_s) * self.config.time_scale)
            count -= 1
        elif count > 0 and stream.last_token_wall_s is not None:
            gap = now - stream.last_token_wall_s
            m.itl.observe(gap)
            count -= 1
        for _ in range(count):
            m.itl.observe(0.0)  # tokens that arrived together (the handler lagged a step)
        stream.last_token_wall_s = now

    def _observe_finished(self, stream: RequestStream, num_tokens: int) -> None:
        assert self.runner is not None
        now = self.runner.step_wall_s
        m = self.metrics
        m.e2e.observe(now - stream.arrival_wall_s)
        if stream.first_token_wall_s is not None and num_tokens > 1:
            m.tpot.observe((now - stream.first_token_wall_s) / (num_tokens - 1))
        req = stream.req
        m.prompt_tokens.observe(req.num_prompt_tokens)
        m.generation_tokens.observe(num_tokens)
        # Phase times come from the engine clock (scaled to wall seconds).
        scale = self.config.time_scale
        if req.first_scheduled_s is not None and req.first_token_s is not None:
            end_s = req.finished_s if req.finished_s is not None else self.engine.now_s
            m.inference.observe((end_s - req.first_scheduled_s) * scale)
            m.prefill.observe((req.first_token_s - req.first_scheduled_s) * scale)
            m.decode.observe((end_s - req.first_token_s) * scale)

    def _take_text(self, stream: RequestStream) -> tuple[str, int]:
        """Text of the tokens whose time has come and were not sent yet, and their count."""
        req = stream.req
        start = req.num_prompt_tokens + stream.sent
        ids = req.all_token_ids[start : req.num_prompt_tokens + stream.available]
        stream.sent += len(ids)
        tb = self._token_bytes
        return b"".join([tb[i] for i in ids]).decode(), len(ids)

    async def _complete(self, params: GenerationParams, stream: RequestStream) -> web.Response:
        req = stream.req
        pieces: list[str] = []
        scanner = StopScanner(params.stop, params.include_stop_str_in_output)
        if not params.stop:
            # Nothing to look at per token: the runner only counts tokens (for the latency
            # histograms) and this handler wakes once, at the end.
            def count(_: RequestStream) -> None:
                n = stream.available - stream.sent
                if n > 0:
                    stream.sent = stream.available
                    self._observe_tokens(stream, n)

            stream.on_tokens = count
            while not stream.ended:
                await stream.wait()
                if self.runner is not None and self.runner.failed is not None:
                    return _error("the engine died", 500)
            count(stream)
            ids = req.all_token_ids[req.num_prompt_tokens : req.num_prompt_tokens + stream.sent]
            pieces.append(self.tokenizer.decode(ids))
        while params.stop and scanner.matched is None:
            await stream.wait()
            if self.runner is not None and self.runner.failed is not None:
                return _error("the engine died", 500)
            final = stream.ended
            if stream.available > stream.sent:
                text, n = self._take_text(stream)
                self._observe_tokens(stream, n)
                pieces.append(scanner.feed(text, final) if params.stop else text)
            if final and stream.sent >= stream.available:
                if params.stop:
                    pieces.append(scanner.feed("", True))
                break
        stop_str = scanner.matched
        completion_tokens = stream.sent
        self._observe_finished(stream, completion_tokens)
        finish_reason = "stop" if stop_str is not None else str(req.finish_reason)
        usage = self._usage(req, completion_tokens, details=True)
        created = int(time.time())
        text = "".join(pieces)
        if params.kind == "chat":
            data: dict[str, Any] = {
                "id": req.request_id,
                "object": "chat.completion",
                "created": created,
                "model": params.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": None,
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": stop_str,
                    }
                ],
                "usage": usage,
                "prompt_logprobs": None,
            }
        else:
            if params.echo_prompt is not None:
                text = params.echo_prompt + text
            data = {
                "id": req.request_id,
                "object": "text_completion",
                "created": created,
                "model": params.model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": stop_str,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": usage,
            }
        return _json(data)

    @staticmethod
    def _usage(req: EngineRequest, completion_tokens: int, details: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": req.num_prompt_tokens,
            "total_tokens": req.num_prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": req.num_prefix_hit_tokens}
        return usage

    async def _stream(
        self, request: web.Request, params: GenerationParams, stream: RequestStream
    ) -> web.StreamResponse:
        req = stream.req
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        chunked = request.version >= (1, 1)  # HTTP/1.0: no chunks, the close ends the body
        if chunked:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        chat = params.kind == "chat"
        continuous = params.continuous_usage_stats and params.include_usage
        t = ChunkTemplates(
            chat=chat,
            request_id=req.request_id,
            created=int(time.time()),
            model=params.model,
            prompt_tokens=req.num_prompt_tokens,
            continuous_usage=continuous,
        )
        first = t.role_chunk() if chat else b""
        if not chat and params.echo_prompt is not None:
            first = t.text_chunk(escape(params.echo_prompt), 0)
        state: dict[str, Any] = {"first": first, "finish": None, "stop": None}
        scanner = StopScanner(params.stop, params.include_stop_str_in_output)

        # The common chunk (one token, no stop strings, no per-chunk usage), pre-split.
        plain = not params.stop and not continuous
        token_open, token_close = t.token_open, t.token_close
        token_bytes = self._token_bytes
        all_ids = req.all_token_ids
        base = req.num_prompt_tokens
        observe = self._observe_tokens

        def produce() -> bytes:
            """The bytes of the next chunk (tokens whose time has come), or b"" (sync)."""
            sent = stream.sent
            if plain and stream.available == sent + 1 and not stream.ended and sent:
                stream.sent = sent + 1
                observe(stream, 1)
                return token_open + token_bytes[all_ids[base + sent]] + token_close
            if state["finish"] is not None:
                return b""
            out: bytes = state["first"]
            state["first"] = b""
            if stream.available > stream.sent or stream.ended:
                first_new = base + stream.sent
                text, n = self._take_text(stream)
                if n:
                    self._observe_tokens(stream, n)
                final = stream.ended and stream.sent >= stream.available
                if params.stop:
                    text = scanner.feed(text, final)
                    if scanner.matched is not None:
                        state["finish"], state["stop"] = "stop", scanner.matched
                if final and state["finish"] is None:
                    state["finish"] = str(req.finish_reason)
                if not text and state["finish"] is None:
                    return out  # everything new is held back (it may start a stop string)
                body = text.encode() if not params.stop else escape(text)
            else:
                return out
            if n > 1 and not params.stop:
                # Tokens that piled up (the handler lagged a step) still go one per event,
                # as the engine made them: a client or gateway counting events counts tokens.
                ids = all_ids[first_new : first_new + n]
                done = stream.sent - n
                out += b"".join([t.text_chunk(token_bytes[i], done + j + 1)
                                 for j, i in enumerate(ids[:-1])])  # fmt: skip
                body = token_bytes[ids[-1]]
            return out + t.text_chunk(body, stream.sent, state["finish"], state["stop"])

        transport = request.transport
        if chunked and not params.stop and transport is not None:
            # Fast path: the runner writes each step's chunk straight to the socket (HTTP
            # chunked framing done here), so a token costs no task switch; this handler
            # only wakes at the end to write the usage chunk and [DONE].
            runner = self.runner
            assert runner is not None
            itl = self.metrics.itl
            itl_bounds, itl_counts = itl.bounds, itl.counts

            def push(_: RequestStream) -> None:
                if transport.is_closing():
                    return
                if transport.get_write_buffer_size() > _MAX_UNSENT_BYTES:
                    # A slow reader: hand back to the handler, whose writes wait for drain.
                    stream.on_tokens = None
                    stream.wake()
                    return
                sent = stream.sent
                last_s = stream.last_token_wall_s
                if (
                    plain
                    and stream.available == sent + 1
                    and last_s is not None
                    and not stream.ended
                ):
                    # the hot path, one token mid-stream, inlined: ITL, chunk, write
                    now = runner.step_wall_s
                    itl_counts[bisect_left(itl_bounds, now - last_s)] += 1
                    itl.sum += now - last_s
                    stream.last_token_wall_s = now
                    stream.sent = sent + 1
                    data = token_open + token_bytes[all_ids[base + sent]] + token_close
                    transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                    return
                data = produce()
                if data:
                    transport.write(b"%x\r\n%b\r\n" % (len(data), data))

            stream.on_tokens = push
        while state["finish"] is None:
            await stream.wait()
            if self.runner is not None and self.runner.failed is not None:
                await resp.write(error_event("the engine died", 500))
                return resp
            data = produce()
            if data:
                await resp.write(data)
        self._observe_finished(stream, stream.sent)
        tail = b""
        if params.include_usage:
            tail += t.usage_chunk(self._usage(req, stream.sent, details=True))
        tail += b"data: [DONE]\n\n"
        await resp.write(tail)
        await resp.write_eof()
        return resp


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
