"""Offline validation of emitted manifests against real schemas (no API server runs here).

- Kubernetes kinds: `kubernetes-validate`, strict (unknown fields are errors, as with
  `kubectl apply --validate=strict`), for Kubernetes 1.30 (the oldest we support) and for
  the newest version the package ships.
- KEDA ScaledObject and LeaderWorkerSet: the openAPIV3Schema of their released CRDs
  (crds/README.md), read with `jsonschema`. The API server prunes unknown fields of a CRD
  object silently; here every object schema without x-kubernetes-preserve-unknown-fields
  is made closed, so a misspelt field fails the test instead of vanishing in the cluster.
"""

from __future__ import annotations

import functools
import gzip
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

CRDS = Path(__file__).with_name("crds")
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
CRD_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.v2.20.2.yaml",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        "leaderworkerset.x-k8s.io_leaderworkersets.v0.10.0.yaml.gz"
    ),
}


def _closed(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    path = CRDS / CRD_FILES[(api_version, kind)]
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    crd = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = api_version.split("/")[1]
    [entry] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _closed(entry["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def validate_manifest(obj: dict[str, Any]) -> None:
    """Raises on the first schema violation."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_FILES:
        crd_validator(*key).validate(obj)
        if obj["kind"] == "LeaderWorkerSet":  # and its pod templates as Kubernetes sees them
            lwt = obj["spec"]["leaderWorkerTemplate"]
            for name in ("leaderTemplate", "workerTemplate"):
                if name in lwt:
                    pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                                    "metadata": {"name": name.lower()}, "template": lwt[name]}  # fmt: skip
                    validate_manifest(pod_template)
        return
    for version in K8S_VERSIONS:
        k8s_validator(version, obj["apiVersion"], obj["kind"]).validate(obj)


@functools.cache
def k8s_validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """What `kubernetes_validate.validate(obj, version, strict=True)` checks, with the
    schema files read once per kind (the package re-reads them on every call)."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    schema = schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
    definitions = schema_contents(f"{schema_dir}/_definitions.json", version)
    registry: Registry = Resource.from_contents(definitions) @ (
        Resource.from_contents(schema) @ Registry()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)
