"""POST /v1/completions and /v1/chat/completions: request → engine requests → answer.

A request becomes `n` engine requests (one per choice, as vLLM's parallel sampling does).
Each choice's words come from the engine; where a real model would follow a constraint
(response_format, tools, structured_outputs.choice) the answer is scripted up front
(`synthetic`) and its pieces are handed out one per emitted token, so timing stays the
engine's. Non-streamed answers are assembled here; streams in `streaming`.
"""

from __future__ import annotations

import time
import uuid
import zlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpufleet.engine import FinishReason
from gpufleet.replica.errors import RequestError
from gpufleet.replica.generation import ContextSeededRequest, request_seed
from gpufleet.replica.http import error_response, json_response, read_json
from gpufleet.replica.output import ChoiceOutput
from gpufleet.replica.protocol import GenerationParams, parse_generation_request
from gpufleet.replica.runner import RequestStream
from gpufleet.replica.synthetic import (
    UnsupportedSchema,
    json_for_schema,
    json_text,
    logprob_entries,
    plan_tool_call,
    text_pieces,
)
from gpufleet.tokenizer import block_hashes

if TYPE_CHECKING:
    from gpufleet.replica.app import ReplicaServer


class Generator:
    def __init__(self, server: ReplicaServer):
        self.server = server
        self.tokenizer = server.tokenizer
        # Token id -> its JSON-ready bytes (vocabulary words need no escaping).
        self.token_bytes = [(" " + w).encode() for w in self.tokenizer.vocab]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "chat")

    # ------------------------------------------------------------------ metrics
    def observe_tokens(self, stream: RequestStream, count: int) -> None:
        """Latency histograms for `count` tokens handed out at this step's end."""
        runner = self.server.runner
        assert runner is not None
        now = runner.step_wall_s
        m = self.server.metrics
        if stream.first_token_wall_s is None:
            stream.first_token_wall_s = now
            m.ttft.observe(now - stream.arrival_wall_s)
            req = stream.req
            if req.first_scheduled_s is not None and req.arrival_s is not None:
                scale = self.server.config.time_scale
                m.queue.observe((req.first_scheduled_s - req.arrival_s) * scale)
            count -= 1
        elif count > 0 and stream.last_token_wall_s is not None:
            m.itl.observe(now - stream.last_token_wall_s)
            count -= 1
        for _ in range(count):
            m.itl.observe(0.0)  # tokens that arrived together (the handler lagged a step)
        stream.last_token_wall_s = now

    def observe_finished(self, stream: RequestStream, num_tokens: int) -> None:
        runner = self.server.runner
        assert runner is not None
        now = runner.step_wall_s
        m = self.server.metrics
        m.e2e.observe(now - stream.arrival_wall_s)
        if stream.first_token_wall_s is not None and num_tokens > 1:
            m.tpot.observe((now - stream.first_token_wall_s) / (num_tokens - 1))
        req = stream.req
        m.prompt_tokens.observe(req.num_prompt_tokens)
        m.generation_tokens.observe(num_tokens)
        # Phase times come from the engine clock (scaled to wall seconds).
        scale = self.server.config.time_scale
        if req.first_scheduled_s is not None and req.first_token_s is not None:
            end_s = req.finished_s if req.finished_s is not None else self.server.engine.now_s
            m.inference.observe((end_s - req.first_scheduled_s) * scale)
            m.prefill.observe((req.first_token_s - req.first_scheduled_s) * scale)
            m.decode.observe((end_s - req.first_token_s) * scale)

    def advance(self, choice: ChoiceOutput) -> str:
        """Observe the new tokens' latencies and take their text."""
        s = choice.stream
        n = s.available - s.sent
        if n > 0:
            self.observe_tokens(s, n)
        return choice.take()

    # ------------------------------------------------------------------ requests
    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        # The simulated GPU starts from the request's arrival: the replica's own Python
        # work (reading JSON, tokenizing) is simulation overhead, not modelled time.
        received_wall_s = time.monotonic()
        server = self.server
        refused = self.refusal()
        if refused is not None:
            return refused
        try:
            body = await read_json(request)
            params = parse_generation_request(
                body,
                kind=kind,
                served_model_names=server.servable_models(),
                max_model_len=server.config.engine_config.max_model_len,
                tokenizer=self.tokenizer,
                max_logprobs=server.config.max_logprobs,
            )
            prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
            request_id = prefix + (params.request_id or uuid.uuid4().hex)
            choices = self.submit(params, request_id, received_wall_s)
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        done = False
        try:
            from gpufleet.replica import streaming

            if params.stream:
                response = await streaming.stream(self, request, params, choices, request_id)
            elif params.plain:
                response = await self._complete_plain(params, choices[0], request_id)
            else:
                response = await self._complete(params, choices, request_id)
            done = True
            return response
        finally:
            self.release(choices, done)

    def refusal(self) -> web.Response | None:
        """The 503 (or injected failure) a request gets before reaching the engine."""
        server = self.server
        if server.starting():
            return error_response("the model is still loading", 503)
        if server.dead():
            return error_response("the engine is dead", 503)
        if server.faults.fail_next > 0:
            server.faults.fail_next -= 1
            return error_response("injected failure", server.faults.fail_status)
        return None

    def submit(
        self, params: GenerationParams, request_id: str, received_wall_s: float
    ) -> list[ChoiceOutput]:
        """One engine request per choice, handed to the runner. Raises RequestError."""
        server = self.server
        plans = self._plan_choices(params)
        runner = server.runner
        assert runner is not None
        hashes = None
        lora = server.adapter(params.model)
        if params.cache_salt is not None or lora is not None:
            # A salted prefix cache (other salts never hit); an adapter's KV is its own
            # (vLLM adds the LoRA to every block's hash).
            salt = params.cache_salt or ""
            if lora is not None:
                salt += f"\x00lora:{lora.name}"
            parent = zlib.crc32(salt.encode())
            bs = server.config.engine_config.block_size
            hashes = block_hashes(params.prompt_token_ids, bs, parent=parent)
        choices: list[ChoiceOutput] = []
        for i, (seed, script, tool, stop_after) in enumerate(plans):
            req = ContextSeededRequest(
                request_id if params.n == 1 else f"{request_id}-{i}",
                params.prompt_token_ids,
                params.max_tokens,
                seed=seed,
                stop_after_tokens=stop_after,
                prompt_block_hashes=hashes,
                lora=lora,
            )
            stream = runner.submit(req, received_wall_s=received_wall_s)
            choices.append(
                ChoiceOutput(
                    i, stream, params, self.tokenizer, seed=seed or 0, script=script, tool=tool
                )
            )
        server.metrics.observe_request(params.n, params.max_tokens_param)
        server.in_flight += 1
        return choices

    def release(self, choices: list[ChoiceOutput], done: bool) -> None:
        """The request left: choices still in the engine are aborted (a stop string
        matched when `done`; else the client left or an error ended it)."""
        server = self.server
        server.in_flight -= 1
        runner = server.runner
        assert runner is not None
        for c in choices:
            if not c.req.is_finished:
                runner.abort(c.req.request_id, FinishReason.STOP if done else FinishReason.ABORT)
        if done:
            server.metrics.observe_max_generation(max(c.stream.sent for c in choices))

    def _plan_choices(
        self, p: GenerationParams
    ) -> list[tuple[int | None, list[str] | None, Any, int | None]]:
        """Per choice: engine seed, scripted pieces, tool call, natural length."""
        out: list[tuple[int | None, list[str] | None, Any, int | None]] = []
        for i in range(p.n):
            seed: int | None = None
            if p.seed is not None:
                # The answer is a function of the seed and the context (replica.generation):
                # the same seed and prompt give the same answer, and so does continuing a
                # part of it (choice i > 0: its own seed).
                seed = request_seed(p.seed if i == 0 else hash((p.seed, i)))
            elif p.output != "text" or p.tools or p.logprobs is not None:
                seed = uuid.uuid4().int & 0xFFFFFFFF  # the script and logprobs need it now
            script: list[str] | None = None
            tool = None
            try:
                if p.tools:
                    tool = plan_tool_call(
                        p.tools,
                        mode=p.tool_choice,
                        named=p.tool_name,
                        last_role=p.last_role,
                        seed=seed or 0,
                        tokenizer=self.tokenizer,
                    )
                if tool is not None:
                    script = text_pieces(tool.arguments)
                elif p.output == "json":
                    value = json_for_schema(p.json_schema, seed or 0, self.tokenizer)
                    script = text_pieces(json_text(value))
                elif p.output == "choice":
                    script = text_pieces(p.choices[(seed or 0) % len(p.choices)])
            except UnsupportedSchema as e:
                raise RequestError(
                    f"the simulated model cannot follow this schema: {e}", param="response_format"
                ) from None
            stop_after = p.stop_after_tokens
            if script is not None:
                stop_after = max(len(script), 1)  # the model ends (EOS) after its answer
            out.append((seed, script, tool, stop_after))
        return out

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    async def _complete_plain(
        self, params: GenerationParams, choice: ChoiceOutput, request_id: str
    ) -> web.Response:
        """One choice of plain words: the runner counts tokens, the handler wakes at the end."""
        stream = choice.stream
        if not params.stop:

            def count(_: RequestStream) -> None:
                n = stream.available - stream.sent
                if n > 0:
                    stream.sent = stream.available
                    self.observe_tokens(stream, n)

            stream.on_tokens = count
            while not stream.ended:
                await stream.wait()
                if self._engine_failed():
                    return error_response("the engine died", 500)
            count(stream)
            req = choice.req
            ids = req.all_token_ids[req.num_prompt_tokens : req.num_prompt_tokens + stream.sent]
            choice.text = self.tokenizer.decode(ids)
            choice.finish_reason = str(req.finish_reason)
            self.observe_finished(stream, stream.sent)
            return json_response(self._body(params, [choice], request_id))
        return await self._complete(params, [choice], request_id)

    def _engine_failed(self) -> bool:
        runner = self.server.runner
        return runner is not None and runner.failed is not None

    async def _complete(
        self, params: GenerationParams, choices: list[ChoiceOutput], request_id: str
    ) -> web.Response:
        failed = await self.collect(choices)
        if failed is not None:
            return failed
        return json_response(self._body(params, choices, request_id))

    async def collect(self, choices: list[ChoiceOutput]) -> web.Response | None:
        """Wait for every choice to end; an error response if the engine died."""
        for c in choices:
            # Each step's tokens are taken as they come (exact latencies, even for choices
            # this handler is not waiting on); the handler wakes when a choice is over.
            def on_tokens(_: RequestStream, c: ChoiceOutput = c) -> None:
                self.advance(c)
                if c.done:
                    c.stream.on_tokens = None
                    c.stream.wake()

            c.stream.on_tokens = on_tokens
        for c in choices:
            while not c.done:
                await c.stream.wait()
                if self._engine_failed():
                    return error_response("the engine died", 500)
                self.advance(c)
            self.observe_finished(c.stream, c.stream.sent)
        return None

    def _prompt_logprobs(self, params: GenerationParams, seed: int) -> list[Any] | None:
        k = params.prompt_logprobs
        if k is None:
            return None
        out: list[Any] = [None]
        ids = params.prompt_token_ids
        for pos in range(1, len(ids)):
            lp, top = logprob_entries(seed, -pos, ids[pos], max(k, 1), self.tokenizer)
            entry = {str(ids[pos]): {"logprob": lp, "rank": 1,
                                     "decoded_token": self.tokenizer.vocab[ids[pos]]}}  # fmt: skip
            for rank, (tid, v) in enumerate(top[1:k], start=2):
                entry.setdefault(
                    str(tid),
                    {"logprob": v, "rank": rank, "decoded_token": self.tokenizer.vocab[tid]},
                )
            out.append(entry)
        return out

    def _body(
        self, params: GenerationParams, choices: list[ChoiceOutput], request_id: str
    ) -> dict[str, Any]:
        """The non-streamed response, as vLLM's ChatCompletionResponse / CompletionResponse."""
        req0 = choices[0].req
        completion_tokens = sum(c.stream.sent for c in choices)
        usage = self.usage(req0.num_prompt_tokens, completion_tokens, req0.num_prefix_hit_tokens)
        prompt_lps = self._prompt_logprobs(params, choices[0].seed)
        token_ids = params.return_token_ids
        out_choices = []
        for c in choices:
            positions = c.take_reported(final=True)
            item: dict[str, Any]
            if params.kind == "chat":
                item = {
                    "index": c.index,
                    "message": c.chat_message(),
                    "logprobs": c.chat_logprobs(positions),
                    "finish_reason": c.api_finish_reason,
                    "stop_reason": c.stop_reason,
                }
                if params.echo_prompt is not None and c.tool is None:
                    item["message"]["content"] = params.echo_prompt + c.text
            else:
                echo = params.echo_prompt or ""
                item = {
                    "index": c.index,
                    "text": echo + c.text,
                    "logprobs": c.completion_logprobs(positions, len(echo)),
                    "finish_reason": c.api_finish_reason,
                    "stop_reason": c.stop_reason,
                    "prompt_logprobs": prompt_lps,
                }
                if token_ids:
                    item["prompt_token_ids"] = params.prompt_token_ids
            if token_ids:
                item["token_ids"] = c.token_ids_of(positions)
            out_choices.append(item)
        created = int(time.time())
        if params.kind == "chat":
            data: dict[str, Any] = {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": params.model,
                "choices": out_choices,
                "usage": usage,
                "prompt_logprobs": prompt_lps,
            }
            if token_ids:
                data["prompt_token_ids"] = params.prompt_token_ids
            return data
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": params.model,
            "choices": out_choices,
            "usage": usage,
        }
