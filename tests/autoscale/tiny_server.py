"""A minimal OpenAI-ish server process for actuator tests: any command must work.

/health is 503 for --startup-s, then 200; /v1/models lists "tiny"; /metrics reports the requests it is serving
under vLLM's names; POST /v1/completions holds a request for `hold_s` seconds (body field)
and answers; POST /exit makes the process exit at once with status 3 (a crash).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from aiohttp import web


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--startup-s", type=float, default=0.0)
    args = ap.parse_args()
    ready_at = time.monotonic() + args.startup_s
    running = 0

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if time.monotonic() >= ready_at else 503)

    async def metrics(_: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="tiny"}} {running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="tiny"} 0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def completions(request: web.Request) -> web.Response:
        nonlocal running
        body = await request.json()
        running += 1
        try:
            await asyncio.sleep(float(body.get("hold_s", 0.0)))
        finally:
            running -= 1
        return web.json_response({"choices": [{"text": "ok"}], "pid": os.getpid()})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def crash(_: web.Request) -> web.Response:
        os._exit(3)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/exit", crash)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
