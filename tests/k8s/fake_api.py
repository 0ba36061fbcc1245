"""A FAKE Kubernetes API server, for the actuator and leader-election tests only.

No API server (nor kind, nor etcd) can run on these machines, so the tests talk to this
instead: real HTTP on 127.0.0.1, spoken to by the real `kubernetes` client. It serves only
the calls gpufleet's controller makes, with the behaviour the API documents for them:

- the scale subresource (autoscaling/v1 Scale) of Deployments and LeaderWorkerSets: GET;
  PUT with metadata.resourceVersion, where a stale one answers 409 Conflict;
- a small ReplicaSet / StatefulSet controller behind it: raising spec.replicas creates
  pods (Pending, no IP); lowering it marks pods for deletion in the ReplicaSet's order
  (not ready first, then the lowest controller.kubernetes.io/pod-deletion-cost, then the
  newest), or the highest ordinal first for an ordered (StatefulSet) workload;
- pods: list by label selector, GET, merge PATCH (RFC 7386; other patch types → 415);
- EndpointSlices (discovery.k8s.io/v1) derived from Services and pods, with the
  documented shape: addressType, endpoints[].addresses / conditions (ready, serving,
  terminating) / targetRef, ports, the kubernetes.io/service-name label;
- Leases (coordination.k8s.io/v1): create (409 AlreadyExists), GET, PUT with
  resourceVersion (409 Conflict), MicroTime fields checked.

Anything else answers 404 with a Status object. Time is what the test says it is.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .fake_cluster import ApiStatus, FakeCluster, Obj, matches, merge_patch


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Obj:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        c = self.cluster
        try:
            with c.lock:
                code, body = 200, self._route(method, url.path, query)
        except ApiStatus as e:
            code, body = e.code, e.body()
        c.log.append((method, url.path, code))
        self._send(code, body)

    def _route(self, method: str, path: str, query: dict[str, str]) -> Obj:
        c = self.cluster
        selector = query.get("labelSelector", "")
        if m := re.fullmatch(r"/apis/[^/]+/[^/]+/namespaces/([^/]+)/([^/]+)/([^/]+)/scale", path):
            ns, plural, name = m.groups()
            w = c.workloads.get((plural, ns, name))
            if w is None:
                raise ApiStatus(404, "NotFound", f'{plural} "{name}" not found')
            if method == "GET":
                return c.scale_of(w)
            if method == "PUT":
                return c.put_scale(w, self._body())
        elif m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
            items = [p for (ns, _), p in c.pods.items()
                     if ns == m.group(1) and matches(p["metadata"]["labels"], selector)]  # fmt: skip
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": c.rv()},
                    "items": json.loads(json.dumps(items))}  # fmt: skip
        elif m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path):
            pod = c.pods.get((m.group(1), m.group(2)))
            if pod is None:
                raise ApiStatus(404, "NotFound", f'pods "{m.group(2)}" not found')
            if method == "PATCH":
                kind = self.headers.get("Content-Type", "")
                if kind not in (
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                ):
                    raise ApiStatus(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format: {kind}",
                    )
                pod["metadata"] = merge_patch(pod["metadata"], self._body().get("metadata", {}))
                pod["metadata"]["resourceVersion"] = c.rv()
            return pod
        elif m := re.fullmatch(
            r"/apis/discovery.k8s.io/v1/namespaces/([^/]+)/endpointslices", path
        ):
            return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": c.rv()},
                    "items": c.endpoint_slices(m.group(1), selector)}  # fmt: skip
        elif m := re.fullmatch(
            r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?", path
        ):
            ns, name = m.groups()
            if method == "POST" and name is None:
                body = self._body()
                c.check_lease(body)
                key = (ns, body["metadata"]["name"])
                if key in c.leases:
                    raise ApiStatus(409, "AlreadyExists", f'leases "{key[1]}" already exists')
                body["metadata"].update(namespace=ns, resourceVersion=c.rv(), uid=f"uid-{key[1]}")
                c.leases[key] = body
                return body
            lease = c.leases.get((ns, name or ""))
            if lease is None:
                raise ApiStatus(404, "NotFound", f'leases "{name}" not found')
            if method == "GET":
                return lease
            if method == "PUT":
                body = self._body()
                c.check_lease(body)
                given = body.get("metadata", {}).get("resourceVersion")
                if given and given != lease["metadata"]["resourceVersion"]:
                    raise ApiStatus(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on leases "{name}": the object has been modified',
                    )
                body["metadata"] = {**lease["metadata"], "resourceVersion": c.rv()}
                c.leases[(ns, name or "")] = body
                return body
        raise ApiStatus(
            404, "NotFound", f"the server could not find the requested resource ({method} {path})"
        )

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


class FakeApiServer:
    """`with FakeApiServer() as api:` serves `api.cluster` on http://127.0.0.1:<port>."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        handler = type("Handler", (_Handler,), {"cluster": self.cluster})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()
