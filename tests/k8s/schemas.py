"""Offline validation of emitted manifests against real schemas (no API server runs here).

- Kubernetes kinds: `kubernetes-validate`, strict (unknown fields are errors, as with
  `kubectl apply --validate=strict`), for Kubernetes 1.30 (the oldest we support) and for
  the newest version the package ships.
- KEDA ScaledObject: the JSON schema of the `ScaledObject` model of `cloudcoil-models-keda`
  (pydantic models generated from KEDA's CRDs; the dev extra), made strict below.
- LeaderWorkerSet: no package ships its CRD; `leaderworkerset_v1.schema.yaml` is our own
  schema, written from LWS's API reference (its header names the source and version), whose
  pod templates are Kubernetes' PodTemplateSpec from `kubernetes-validate`'s schemas.

The API server prunes unknown fields of a CRD object silently (and nulls of non-nullable
fields); here every object schema that lists properties is closed and nulls are refused,
so a misspelt field fails the test instead of vanishing in the cluster.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

LWS_SCHEMA = Path(__file__).with_name("leaderworkerset_v1.schema.yaml")
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
KEDA_SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
LEADER_WORKER_SET = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
_NULL = {"type": "null"}


def _strict(schema: Any) -> Any:
    """Closed objects (`additionalProperties: false` where properties are listed) and no
    null branches (pydantic writes `anyOf: [X, null]` for every optional field)."""
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_strict(v) if k != "properties" else v) for k, v in schema.items()}
    if "properties" in out:
        out["properties"] = {name: _strict(v) for name, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    branches = out.get("anyOf")
    if isinstance(branches, list) and _NULL in branches:
        rest = [b for b in branches if b != _NULL]
        del out["anyOf"]
        if len(rest) == 1 and not out.keys() & rest[0].keys():
            out.update(rest[0])
        else:
            out["anyOf"] = rest
    return out


@functools.cache
def keda_validator() -> jsonschema.protocols.Validator:
    schema = _strict(ScaledObject.model_json_schema(by_alias=True))
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata"})
    return jsonschema.Draft202012Validator(schema)


@functools.cache
def lws_validator(version: str) -> jsonschema.protocols.Validator:
    schema = yaml.safe_load(LWS_SCHEMA.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_k8s_definitions(version))


def validate_manifest(obj: dict[str, Any]) -> None:
    """Raises on the first schema violation."""
    key = (obj["apiVersion"], obj["kind"])
    if key == KEDA_SCALED_OBJECT:
        keda_validator().validate(obj)
    elif key == LEADER_WORKER_SET:
        for version in K8S_VERSIONS:
            lws_validator(version).validate(obj)
    else:
        for version in K8S_VERSIONS:
            k8s_validator(version, obj["apiVersion"], obj["kind"]).validate(obj)


@functools.cache
def _k8s_definitions(version: str) -> Registry:
    """The Kubernetes OpenAPI definitions of `version` (what `$ref`s into
    https://kubernetes.io/api/_definitions.json resolve to)."""
    definitions = schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )
    return Resource.from_contents(definitions) @ Registry()


@functools.cache
def k8s_validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """What `kubernetes_validate.validate(obj, version, strict=True)` checks, with the
    schema files read once per kind (the package re-reads them on every call)."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/{kind.lower()}-{group_version}.json",
        version,
    )
    registry = Resource.from_contents(schema) @ _k8s_definitions(version)
    return jsonschema.Draft202012Validator(schema, registry=registry)
