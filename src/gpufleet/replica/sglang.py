"""The SGLang personality of the replica (`gpufleet replica --engine sglang`).

What an SGLang server (python/sglang/srt/entrypoints/http_server.py) answers besides the
OpenAI API they share: `POST|PUT /generate` (SGLang's native request: `text` or
`input_ids`, `sampling_params`, `stream`; the answer's `text`, `output_ids` and
`meta_info`, streamed as SSE chunks whose `text` is the whole text so far), `GET /health`
and `/health_generate` (one token through the engine), `GET|POST /flush_cache` (400 while
requests run), `/get_model_info` and `/get_server_info`, `/v1/models` with
`owned_by: sglang`, and OpenAI-route errors in SGLang's flat shape
(`{"object": "error", "message", "type", "param", "code"}`). No `/version` and no
`/load`: SGLang has neither. Metrics (sglang_metrics.py) only with `--enable-metrics`,
as SGLang.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpufleet.engine import EngineRequest
from gpufleet.replica.errors import RequestError
from gpufleet.replica.http import Handler, json_response, read_json
from gpufleet.replica.output import ChoiceOutput, dumps
from gpufleet.replica.protocol import GenerationParams, natural_length, parse_generation_request

if TYPE_CHECKING:
    from gpufleet.replica.app import ReplicaServer

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
# SGLang sampling_params the simulated model takes (name here -> vLLM's name) ...
_MAPPED = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "temperature": "temperature",
    "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos", "sampling_seed": "seed",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
}  # fmt: skip
# ... and those it accepts without effect on its words (as the OpenAI routes do).
_ACCEPTED = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n"}
_CONSTRAINED = ("json_schema", "regex", "ebnf", "structural_tag")
_OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models")


def generate_error(message: str, status: int = 400) -> web.Response:
    """SGLang's /generate error body (`_create_error_response`)."""
    return json_response({"error": {"message": message}}, status)


@web.middleware
async def flat_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """SGLang answers OpenAI-route errors as its flat ErrorResponse, not nested."""
    resp = await handler(request)
    if (
        resp.status >= 400
        and request.path.startswith(_OPENAI_ROUTES)
        and isinstance(resp, web.Response)
        and resp.body is not None
        and resp.content_type == "application/json"
    ):
        try:
            err = json.loads(bytes(resp.body))["error"]  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError):
            return resp
        flat = {"object": "error", "message": err.get("message"), "type": err.get("type"),
                "param": err.get("param"), "code": resp.status}  # fmt: skip
        out = json_response(flat, resp.status)
        for name in ("Allow", "Retry-After"):
            if name in resp.headers:
                out.headers[name] = resp.headers[name]
        return out
    return resp


class SglangApi:
    def __init__(self, server: ReplicaServer) -> None:
        self.server = server
        self.gen = server.generator

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)

    # ------------------------------------------------------------------ /generate
    async def generate(self, request: web.Request) -> web.StreamResponse:
        received_wall_s = time.monotonic()
        refused = self.gen.refusal()
        if refused is not None:
            return refused
        try:
            body = await read_json(request)
            params, rid = self._params(body)
            choices = self.gen.submit(params, rid, received_wall_s)
        except RequestError as e:
            return generate_error(e.message, e.status)
        done = False
        try:
            if params.stream:
                response = await self._stream(request, choices[0], rid)
            else:
                failed = await self.gen.collect(choices)
                if failed is not None:
                    return failed
                response = json_response(self._answer(choices[0], rid, received_wall_s))
            done = True
            return response
        finally:
            self.gen.release(choices, done)

    def _params(self, body: Any) -> tuple[GenerationParams, str]:
        """SGLang's GenerateReqInput as the completion request the engine runs."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise RequestError("Either text or input_ids should be provided.")
        prompt = text if text is not None else ids
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            raise RequestError("the simulated replica takes one prompt per /generate request")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise RequestError("sampling_params must be an object")
        unknown = sorted(set(sampling) - set(_MAPPED) - _ACCEPTED - set(_CONSTRAINED))
        if unknown:
            raise RequestError(f"unknown sampling_params: {', '.join(unknown)}")
        constrained = [k for k in _CONSTRAINED if sampling.get(k) is not None]
        if constrained:
            raise RequestError(
                f"the simulated model does not follow {constrained[0]} on /generate "
                "(response_format on /v1/chat/completions does)"
            )
        if int(sampling.get("n", 1)) != 1:
            raise RequestError("the simulated replica generates n=1 per /generate request")
        completion = {_MAPPED[k]: v for k, v in sampling.items() if k in _MAPPED}
        s = self.server
        lora = body.get("lora_path")  # SGLang names the adapter of a /generate request here
        if lora is not None and (not isinstance(lora, str) or s.adapter(lora) is None):
            raise RequestError(f"lora_path {lora!r} is not a loaded LoRA adapter")
        completion.update(prompt=prompt, model=lora or s.model_name)
        params = parse_generation_request(
            completion,
            kind="completion",
            served_model_names=s.servable_models(),
            max_model_len=s.config.engine_config.max_model_len,
            tokenizer=self.gen.tokenizer,
        )
        params.stream = bool(body.get("stream", False))
        if "max_new_tokens" not in sampling:  # SGLang's default, or the model's EOS first
            room = s.config.engine_config.max_model_len - len(params.prompt_token_ids)
            params.max_tokens = max(1, min(DEFAULT_MAX_NEW_TOKENS, room))
            params.max_tokens_param = None
            if not sampling.get("ignore_eos"):
                natural = natural_length(params.prompt_token_ids, params.seed)
                params.stop_after_tokens = min(params.max_tokens, max(natural, params.min_tokens))
        rid = body.get("rid")
        return params, rid if isinstance(rid, str) and rid else uuid.uuid4().hex

    def _meta(self, choice: ChoiceOutput, rid: str, received_wall_s: float) -> dict[str, Any]:
        req = choice.req
        finish: dict[str, Any] | None = None
        if choice.done:
            if choice.finish_reason == "stop":
                finish = {"type": "stop", "matched": choice.stop_reason}
            elif choice.finish_reason == "length":
                finish = {"type": "length", "length": choice.stream.sent}
            else:
                finish = {"type": "abort", "message": str(choice.finish_reason)}
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": req.num_prompt_tokens,
            "weight_version": "default",
            "completion_tokens": choice.stream.sent,
            "cached_tokens": req.num_prefix_hit_tokens,
        }
        if choice.done:
            meta["e2e_latency"] = time.monotonic() - received_wall_s
        return meta

    def _answer(self, choice: ChoiceOutput, rid: str, received_wall_s: float) -> dict[str, Any]:
        return {
            "text": choice.text,
            "output_ids": list(choice.token_ids),
            "meta_info": self._meta(choice, rid, received_wall_s),
        }

    async def _stream(
        self, request: web.Request, choice: ChoiceOutput, rid: str
    ) -> web.StreamResponse:
        """SSE chunks, each with the whole text so far (SGLang's default), then [DONE]."""
        received_wall_s = choice.stream.arrival_wall_s
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        while not choice.done:
            try:  # woken per step with tokens, and at the end
                await asyncio.wait_for(choice.stream.wait(), 1.0)
            except TimeoutError:
                if self.gen._engine_failed():
                    await resp.write(b'data: {"error": {"message": "the engine died"}}\n\n')
                    break
                continue
            before = len(choice.token_ids)
            self.gen.advance(choice)
            if len(choice.token_ids) > before or choice.done:
                chunk = self._answer(choice, rid, received_wall_s)
                await resp.write(b"data: " + dumps(chunk) + b"\n\n")
        if choice.done:
            self.gen.observe_finished(choice.stream, choice.stream.sent)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ side endpoints
    async def health_generate(self, request: web.Request) -> web.Response:
        """One token through the engine (SGLang's check that the scheduler answers)."""
        s = self.server
        if s.starting() or s.dead() or s.faults.unhealthy or s.runner is None:
            return web.Response(status=503)
        stream = s.runner.submit(EngineRequest(f"HEALTH_CHECK_{uuid.uuid4().hex}", [0], 1))
        try:
            async with asyncio.timeout(20.0):
                while not stream.ended and stream.available == 0:
                    await stream.wait()
        except TimeoutError:
            return web.Response(status=503)
        finally:
            if not stream.req.is_finished:
                s.runner.abort(stream.req.request_id)
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = self.server.engine.reset_prefix_cache()
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n",
            status=200 if ok else 400,
        )
