"""Deterministic synthetic answers where a real model would follow a constraint: JSON valid
against a schema (vLLM's guided decoding), tool calls whose arguments fit the function's
parameters, and logprobs of the right shape. Pure functions of (schema, seed).

Text is cut into whitespace-led pieces, one per token, so an answer re-tokenizes (one token
per whitespace-separated word, `gpufleet.tokenizer`) to exactly as many tokens as it took.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass
from typing import Any

from gpufleet.tokenizer import Tokenizer

# Below this depth optional properties are dropped and arrays kept minimal (recursive schemas).
_MAX_DEPTH = 6
_PIECE = re.compile(r"\s*\S+")


class UnsupportedSchema(ValueError):
    """A schema feature the synthetic generator cannot satisfy; `path` locates it."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def text_pieces(text: str) -> list[str]:
    """`text` cut into tokens: each piece is its leading whitespace plus one word."""
    return _PIECE.findall(text)


def _h(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


class _Gen:
    def __init__(self, root: dict[str, Any], seed: int, tokenizer: Tokenizer):
        self.root = root
        self.seed = seed
        self.tok = tokenizer
        self.n = 0  # a counter so sibling values differ

    def h(self, path: str) -> int:
        self.n += 1
        return _h(self.seed, path, self.n)

    def words(self, path: str, count: int) -> str:
        ids = self.tok.word_ids_for_seed(self.h(path), count)
        return " ".join(self.tok.vocab[i] for i in ids)

    def resolve(self, ref: str, path: str) -> Any:
        if not ref.startswith("#/"):
            raise UnsupportedSchema(path, f"only local $ref are supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise UnsupportedSchema(path, f"$ref {ref!r} points nowhere")
            node = node[part]
        return node

    def value(self, schema: Any, path: str, depth: int) -> Any:
        if schema is True or schema == {}:
            return self.words(path, 2)
        if not isinstance(schema, dict):
            raise UnsupportedSchema(path, "a schema must be an object or true")
        if "$ref" in schema:
            return self.value(self.resolve(schema["$ref"], path), path, depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = schema["enum"]
            return options[self.h(path) % len(options)]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [
                    o for o in schema[key] if not (isinstance(o, dict) and o == {"type": "null"})
                ]
                if not options:
                    return None
                pick = options[0] if key == "oneOf" else options[self.h(path) % len(options)]
                return self.value(pick, f"{path}.{key}", depth)
        if "allOf" in schema:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self.resolve(part["$ref"], path) if "$ref" in part else part
                for k, v in part.items():
                    if k == "properties":
                        merged.setdefault("properties", {}).update(v)
                    elif k == "required":
                        merged["required"] = [*merged.get("required", []), *v]
                    else:
                        merged.setdefault(k, v)
            return self.value(merged, path, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] or ["null"]
            kind = kinds[0]
        if kind is None:
            if "properties" in schema or "additionalProperties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
            else:
                kind = "string"
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise UnsupportedSchema(path, f"unknown type {kind!r}")
        return method(schema, path, depth)

    def _object(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or depth < _MAX_DEPTH:
                out[name] = self.value(sub, f"{path}.properties.{name}", depth + 1)
        for name in required - set(props):
            out[name] = self.words(path, 1)
        extra = schema.get("additionalProperties", not props)
        want = max(schema.get("minProperties", 0), 1 if not props else 0)
        while len(out) < want and extra is not False:
            key = self.words(path, 1)
            sub = extra if isinstance(extra, dict) else True
            out[key] = self.value(sub, f"{path}.additionalProperties", depth + 1)
        return out

    def _array(self, schema: dict[str, Any], path: str, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        lo = max(schema.get("minItems", 0), len(prefix))
        hi = schema.get("maxItems", lo + 3)
        count = lo if depth >= _MAX_DEPTH else min(hi, max(lo, 1 + self.h(path) % 3))
        out = [self.value(s, f"{path}.prefixItems.{i}", depth + 1) for i, s in enumerate(prefix)]
        while len(out) < count:
            value = self.value(items, f"{path}.items", depth + 1)
            if schema.get("uniqueItems") and value in out:
                value = self.value(items, f"{path}.items", depth + 1)
                if value in out:
                    break
            out.append(value)
        return out

    def _string(self, schema: dict[str, Any], path: str, depth: int) -> str:
        if "pattern" in schema:
            raise UnsupportedSchema(path, "regex patterns are not supported by the simulated model")
        fmt = schema.get("format")
        h = self.h(path)
        word = self.tok.vocab[self.tok.first_word_id + h % 1000]
        special = {
            "date-time": f"2024-{1 + h % 12:02d}-{1 + h % 28:02d}T{h % 24:02d}:{h % 60:02d}:00Z",
            "date": f"2024-{1 + h % 12:02d}-{1 + h % 28:02d}",
            "time": f"{h % 24:02d}:{h % 60:02d}:00",
            "email": f"{word}@example.com",
            "uri": f"https://example.com/{word}",
            "url": f"https://example.com/{word}",
            "hostname": f"{word}.example.com",
            "ipv4": f"10.{h % 256}.{(h >> 8) % 256}.{(h >> 16) % 256}",
            "uuid": f"{h:08x}-{h % 65536:04x}-4{h % 4096:03x}-8{(h >> 4) % 4096:03x}-{h * 2654435761 % 16**12:012x}",
        }
        if fmt in special:
            return special[fmt]
        lo = schema.get("minLength", 0)
        hi = schema.get("maxLength")
        text = self.words(path, 1 + h % 3)
        while len(text) < lo:
            text += " " + self.words(path, 1)
        if hi is not None:
            text = text[:hi].rstrip() if len(text[:hi].rstrip()) >= lo else text[:hi]
        return text

    def _bounds(self, schema: dict[str, Any], step: float) -> tuple[float, float]:
        lo = schema.get("minimum", -math.inf)
        hi = schema.get("maximum", math.inf)
        if "exclusiveMinimum" in schema:
            ex = schema["exclusiveMinimum"]
            lo = max(lo, (ex if not isinstance(ex, bool) else lo) + step)
        if "exclusiveMaximum" in schema:
            ex = schema["exclusiveMaximum"]
            hi = min(hi, (ex if not isinstance(ex, bool) else hi) - step)
        if lo == -math.inf:
            lo = min(0.0, hi - 100) if hi != math.inf else 0.0
        if hi == math.inf:
            hi = lo + 100
        return lo, hi

    def _integer(self, schema: dict[str, Any], path: str, depth: int) -> int:
        lo, hi = self._bounds(schema, 1)
        lo_i, hi_i = math.ceil(lo), math.floor(hi)
        if hi_i < lo_i:
            raise UnsupportedSchema(path, "no integer satisfies minimum and maximum")
        mult = schema.get("multipleOf", 1)
        value = lo_i + self.h(path) % (hi_i - lo_i + 1)
        if mult and mult != 1:
            value = math.ceil(lo_i / mult) * mult
        return int(value)

    def _number(self, schema: dict[str, Any], path: str, depth: int) -> float | int:
        lo, hi = self._bounds(schema, 1e-6)
        if "multipleOf" in schema:
            return self._integer({**schema, "minimum": lo, "maximum": hi}, path, depth)
        frac = (self.h(path) % 1000) / 1000
        return round(lo + (hi - lo) * frac, 3)

    def _boolean(self, schema: dict[str, Any], path: str, depth: int) -> bool:
        return self.h(path) % 2 == 0

    def _null(self, schema: dict[str, Any], path: str, depth: int) -> None:
        return None


def json_for_schema(schema: dict[str, Any] | None, seed: int, tokenizer: Tokenizer) -> Any:
    """A JSON value valid against `schema` (any JSON object when None), the same per seed."""
    if schema is None:
        schema = {"type": "object", "additionalProperties": True, "minProperties": 2}
    return _Gen(schema, seed, tokenizer).value(schema, "schema", 0)


def json_text(value: Any) -> str:
    """Compact JSON with a space after , and : (one token per word)."""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """The tool the simulated model calls and its arguments (JSON text)."""

    call_id: str
    name: str
    arguments: str


def plan_tool_call(
    tools: list[tuple[str, dict[str, Any] | None]],
    *,
    mode: str,
    named: str | None,
    last_role: str,
    seed: int,
    tokenizer: Tokenizer,
) -> ToolCallPlan | None:
    """Which tool to call, or None for a plain answer.

    `required` and a named function always call; `auto` calls a tool unless the last message
    is a tool result (then the model answers in words), as an agent loop expects.
    """
    if mode == "none" or (mode == "auto" and last_role == "tool"):
        return None
    if named is not None:
        index = [name for name, _ in tools].index(named)
    else:
        index = _h(seed, "tool") % len(tools)
    name, params = tools[index]
    args = json_for_schema(params or {"type": "object", "properties": {}}, seed, tokenizer)
    call_id = f"chatcmpl-tool-{_h(seed, name, 'id'):08x}{_h(name, seed):08x}"
    return ToolCallPlan(call_id, name, json_text(args))


def logprob_entries(
    seed: int, position: int, token_id: int, k: int, tokenizer: Tokenizer
) -> tuple[float, list[tuple[int, float]]]:
    """The sampled token's logprob and the top-k (token id, logprob), most likely first.

    The sampled token is the most likely one; the rest share what is left (probabilities
    sum to at most 1), so the numbers are a valid distribution, the same for the same seed.
    """
    h = _h(seed, position, token_id)
    p0 = 0.35 + (h % 6300) / 10000  # 0.35 .. 0.98
    lp0 = math.log(p0)
    top: list[tuple[int, float]] = [(token_id, lp0)] if k > 0 else []
    rest = 1.0 - p0
    alt = tokenizer.word_ids_for_seed(h, k)
    for i in range(1, k):
        alt_id = alt[i] if alt[i] != token_id else alt[0]
        top.append((alt_id, math.log(rest / 2**i)))
    return lp0, top
