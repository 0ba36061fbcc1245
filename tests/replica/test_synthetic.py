"""Synthetic JSON and tool calls are valid against their schemas (checked by jsonschema)."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from gpufleet.replica.synthetic import (
    UnsupportedSchema,
    json_for_schema,
    json_text,
    logprob_entries,
    plan_tool_call,
    text_pieces,
)
from gpufleet.tokenizer import default_tokenizer


class Color(StrEnum):
    red = "red"
    blue = "blue"


class Address(BaseModel):
    street: str
    zip_code: str = Field(min_length=5, max_length=5)


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    height_m: float = Field(gt=0.5, lt=2.5)
    email: str | None = None
    tags: list[str] = Field(min_length=1, max_length=3)
    favourite: Color
    kind: Literal["human"]
    address: Address
    friends: list[Address] = []


SCHEMAS: dict[str, dict[str, Any]] = {
    "pydantic model ($defs, anyOf, enum, const, bounds)": Person.model_json_schema(),
    "strict object": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "multipleOf": 5}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {f: {"type": "string", "format": f} for f in ("date-time", "date", "uuid")},
        "required": ["date-time", "date", "uuid"],
    },
    "array root": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 4},
    "type list and nulls": {"type": ["null", "string"], "maxLength": 8},
    "allOf": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer", "minimum": 10}}, "required": ["b"]},
        ]
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_valid_against_schema_for_many_seeds(name: str) -> None:
    schema = SCHEMAS[name]
    tok = default_tokenizer()
    for seed in range(40):
        value = json_for_schema(schema, seed, tok)
        jsonschema.validate(value, schema)
        text = json_text(value)
        assert json.loads(text) == value
        pieces = text_pieces(text)
        assert "".join(pieces) == text  # the pieces are the text, one token each
        assert len(pieces) == tok.count(text)
    assert json_for_schema(schema, 3, tok) == json_for_schema(schema, 3, tok)  # deterministic


def test_json_object_without_schema_is_an_object() -> None:
    value = json_for_schema(None, 1, default_tokenizer())
    assert isinstance(value, dict) and len(value) >= 2


def test_unsupported_feature_names_its_place() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}}
    with pytest.raises(UnsupportedSchema) as info:
        json_for_schema(schema, 0, default_tokenizer())
    assert info.value.path == "schema.properties.code"


def test_tool_call_arguments_fit_the_function() -> None:
    tok = default_tokenizer()
    params = Person.model_json_schema()
    tools = [("lookup", params), ("noop", None)]
    for seed in range(20):
        call = plan_tool_call(
            tools, mode="named", named="lookup", last_role="user", seed=seed, tokenizer=tok
        )
        assert call is not None and call.name == "lookup"
        jsonschema.validate(json.loads(call.arguments), params)
    assert (
        plan_tool_call(tools, mode="auto", named=None, last_role="tool", seed=1, tokenizer=tok)
        is None
    )
    picked = {
        plan_tool_call(
            tools, mode="required", named=None, last_role="user", seed=s, tokenizer=tok
        ).name  # type: ignore[union-attr]
        for s in range(20)
    }
    assert picked == {"lookup", "noop"}


def test_logprobs_are_a_distribution_most_likely_first() -> None:
    tok = default_tokenizer()
    for k in (0, 1, 5, 20):
        lp, top = logprob_entries(9, 3, 1234, k, tok)
        assert lp < 0
        assert len(top) == k
        if k:
            assert top[0] == (1234, lp)
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True)
            assert sum(math.exp(v) for v in values) <= 1.0 + 1e-9
