"""The FAKE cluster's state and its two controllers (ReplicaSet, StatefulSet): see fake_api.py."""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
# metav1.MicroTime as the API server parses it (Go layout 2006-01-02T15:04:05.000000Z07:00).
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


class ApiStatus(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        else:
            k, v = re.split(r"==?", term, maxsplit=1)
            if labels.get(k) != v:
                return False
    return True


@dataclass
class Workload:
    namespace: str
    name: str
    pod_labels: dict[str, str]
    ordered: bool  # a StatefulSet underneath: pods name-0, name-1, …; highest goes first
    replicas: int = 0
    rv: str = "1"
    next_ordinal: int = 0


@dataclass
class FakeCluster:
    now_s: float = 1_700_000_000.0  # what the API server's clock says (tests move it)
    workloads: dict[tuple[str, str, str], Workload] = field(default_factory=dict)
    pods: dict[tuple[str, str], Obj] = field(default_factory=dict)
    services: dict[tuple[str, str], tuple[dict[str, str], int]] = field(default_factory=dict)
    leases: dict[tuple[str, str], Obj] = field(default_factory=dict)
    log: list[tuple[str, str, int]] = field(default_factory=list)  # method, path, status
    conflicts_to_inject: int = 0  # the next scale PUTs find someone else wrote first
    lock: threading.RLock = field(default_factory=threading.RLock)
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    _ip: itertools.count[int] = field(default_factory=lambda: itertools.count(10))
    _created: dict[str, int] = field(default_factory=dict)  # creation order, by pod name

    def rv(self) -> str:
        return str(next(self._rv))

    def stamp(self) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(self.now_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- test set-up -------------------------------------------------------------------
    def add_workload(self, plural: str, ns: str, name: str, pod_labels: dict[str, str],
                     ordered: bool = False) -> Workload:  # fmt: skip
        w = Workload(ns, name, pod_labels, ordered)
        self.workloads[(plural, ns, name)] = w
        return w

    def add_service(self, ns: str, name: str, selector: dict[str, str], port: int) -> None:
        self.services[(ns, name)] = (selector, port)

    def add_pod(self, ns: str, name: str, labels: dict[str, str], ip: str | None = None,
                ready: bool = False, annotations: dict[str, str] | None = None) -> Obj:  # fmt: skip
        with self.lock:
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                             "labels": dict(labels), "annotations": dict(annotations or {}),
                             "creationTimestamp": self.stamp(), "resourceVersion": self.rv()},
                "spec": {"containers": [{"name": "engine", "image": "x"}]},
                "status": {"phase": "Pending"},
            }  # fmt: skip
            self.pods[(ns, name)] = pod
            self._created[name] = len(self._created)
            if ip is not None:
                self.schedule(ns, name, ip)
            if ready:
                self.set_ready(ns, name, True)
            return pod

    def schedule(self, ns: str, name: str, ip: str | None = None) -> str:
        """The pod lands on a node and gets an address (default: 127.0.1.N)."""
        with self.lock:
            pod = self.pods[(ns, name)]
            pod["spec"]["nodeName"] = "node-1"
            pod["status"]["phase"] = "Running"
            pod["status"]["podIP"] = ip or f"127.0.1.{next(self._ip)}"
            pod["metadata"]["resourceVersion"] = self.rv()
            return str(pod["status"]["podIP"])

    def set_ready(self, ns: str, name: str, ready: bool) -> None:
        with self.lock:
            pod = self.pods[(ns, name)]
            pod["status"]["conditions"] = [{"type": "Ready", "status": str(ready)}]
            pod["metadata"]["resourceVersion"] = self.rv()

    def finish_terminations(self) -> list[str]:
        """The kubelet is done with every pod marked for deletion: they go."""
        with self.lock:
            gone = [k for k, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]
            for k in gone:
                del self.pods[k]
            return [name for _, name in gone]

    def live_pods(self, ns: str, selector: str = "") -> list[str]:
        with self.lock:
            return sorted(p["metadata"]["name"] for (n, _), p in self.pods.items()
                          if n == ns and not p["metadata"].get("deletionTimestamp")
                          and matches(p["metadata"]["labels"], selector))  # fmt: skip

    def terminating(self) -> list[str]:
        with self.lock:
            return sorted(p["metadata"]["name"] for p in self.pods.values()
                          if p["metadata"].get("deletionTimestamp"))  # fmt: skip

    # -- the workload controllers ---------------------------------------------------------
    def _owned(self, w: Workload) -> list[Obj]:
        sel = ",".join(f"{k}={v}" for k, v in w.pod_labels.items())
        return [p for (ns, _), p in self.pods.items() if ns == w.namespace
                and not p["metadata"].get("deletionTimestamp")
                and matches(p["metadata"]["labels"], sel)]  # fmt: skip

    def reconcile(self, w: Workload) -> None:
        owned = self._owned(w)
        for _ in range(w.replicas - len(owned)):
            if w.ordered:
                name, w.next_ordinal = f"{w.name}-{w.next_ordinal}", w.next_ordinal + 1
            else:
                name = f"{w.name}-{next(self._rv):x}"
            self.add_pod(w.namespace, name, w.pod_labels)
        surplus = len(owned) - w.replicas
        if surplus > 0:
            for pod in sorted(owned, key=lambda p: self._rank(p, w.ordered, self._created))[
                :surplus
            ]:
                pod["metadata"]["deletionTimestamp"] = self.stamp()
                pod["metadata"]["resourceVersion"] = self.rv()

    @staticmethod
    def _rank(pod: Obj, ordered: bool, created: dict[str, int]) -> tuple[Any, ...]:
        if ordered:
            return (-int(pod["metadata"]["name"].rsplit("-", 1)[1]),)
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in pod["status"].get("conditions", []))  # fmt: skip
        cost = int(pod["metadata"].get("annotations", {}).get(DELETION_COST, "0"))
        return ("nodeName" in pod["spec"], pod["status"]["phase"] == "Running", ready, cost,
                -created[pod["metadata"]["name"]])  # fmt: skip

    # -- API handlers -------------------------------------------------------------------
    def scale_of(self, w: Workload) -> Obj:
        sel = ",".join(f"{k}={v}" for k, v in w.pod_labels.items())
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": w.name, "namespace": w.namespace, "resourceVersion": w.rv},
                "spec": {"replicas": w.replicas},
                "status": {"replicas": len(self._owned(w)), "selector": sel}}  # fmt: skip

    def put_scale(self, w: Workload, body: Obj) -> Obj:
        if self.conflicts_to_inject > 0:
            self.conflicts_to_inject -= 1
            w.rv = self.rv()  # another writer got there first
        given = body.get("metadata", {}).get("resourceVersion")
        if given and given != w.rv:
            raise ApiStatus(409, "Conflict", f'Operation cannot be fulfilled on {w.name}: '
                            "the object has been modified; please apply your changes to the "
                            "latest version and try again")  # fmt: skip
        replicas = body.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiStatus(422, "Invalid", "spec.replicas: must be a non-negative integer")
        w.replicas, w.rv = replicas, self.rv()
        self.reconcile(w)
        return self.scale_of(w)

    def endpoint_slices(self, ns: str, selector: str) -> list[Obj]:
        out = []
        for (sns, name), (sel, port) in self.services.items():
            labels = {"kubernetes.io/service-name": name,
                      "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}  # fmt: skip
            if sns != ns or not matches(labels, selector):
                continue
            endpoints = []
            for pod in self.pods.values():
                meta = pod["metadata"]
                if meta["namespace"] != ns or not pod["status"].get("podIP"):
                    continue
                if not all(meta["labels"].get(k) == v for k, v in sel.items()):
                    continue
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in pod["status"].get("conditions", []))  # fmt: skip
                terminating = bool(meta.get("deletionTimestamp"))
                endpoints.append({
                    "addresses": [pod["status"]["podIP"]],
                    "conditions": {"ready": ready and not terminating, "serving": ready,
                                   "terminating": terminating},
                    "nodeName": pod["spec"].get("nodeName"),
                    "targetRef": {"kind": "Pod", "name": meta["name"], "namespace": ns,
                                  "uid": meta["uid"]},
                })  # fmt: skip
            out.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{name}-abcde", "namespace": ns, "labels": labels,
                             "resourceVersion": self.rv()},
                "addressType": "IPv4", "endpoints": endpoints,
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            })  # fmt: skip
        return out

    def check_lease(self, body: Obj) -> Obj:
        spec = body.get("spec") or {}
        allowed = {"holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime",
                   "leaseTransitions", "preferredHolder", "strategy"}  # fmt: skip
        for key, value in spec.items():
            if key not in allowed:
                raise ApiStatus(
                    400, "BadRequest", f'strict decoding error: unknown field "spec.{key}"'
                )
            if key.endswith("Time") and not MICRO_TIME.match(str(value)):
                raise ApiStatus(400, "BadRequest", f"spec.{key}: not a MicroTime: {value!r}")
        return spec
