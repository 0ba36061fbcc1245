"""Routing keys come from clients: any JSON string, lone surrogates included, must hash
(the gateway answered 500 with prefix_aware and session before; found by the fuzz corpus)."""

from __future__ import annotations

from gpufleet.routing.prefix import request_prefix_hashes
from gpufleet.routing.session import stable_hash64


def test_session_keys_with_lone_surrogates_hash() -> None:
    assert stable_hash64("\udfff") == stable_hash64("\udfff") != stable_hash64("\ud800")


def test_prompts_with_lone_surrogates_hash() -> None:
    body = {"messages": [{"role": "user", "content": "a\ud800b" * 200}]}
    hashes = request_prefix_hashes(body, "chat")
    assert hashes and hashes == request_prefix_hashes(body, "chat")
