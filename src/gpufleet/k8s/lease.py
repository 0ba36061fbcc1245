"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics
(k8s.io/client-go/tools/leaderelection):

- A candidate may take the lease when it does not exist, when its holder is empty
  (released), or when the record has not changed for leaseDurationSeconds *as this
  candidate observed it*: expiry is measured on the candidate's own clock from the moment
  it last saw the record change, never from the renewTime written by another machine
  (clocks differ between nodes).
- Taking it from another holder sets acquireTime and increments leaseTransitions; the
  holder renewing keeps both and moves renewTime.
- Every write carries the resourceVersion it read: two candidates racing get one 200 and
  one 409, and the loser stays a follower.
- The leader renews every retry period; when no renewal has succeeded for renewDeadline it
  stops leading (before the lease can expire for the others: renewDeadline <
  leaseDuration). On a clean stop it releases the lease (holder "", duration 1 s), so a
  standby takes over at once (client-go's ReleaseOnCancel).

Why not `kubernetes.leaderelection` (the Python client's port): it blocks a thread,
uses the global client configuration, and neither counts transitions nor releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.k8s.api import ApiError, Conflict, KubeApi, NotFound
from gpufleet.k8s.settings import LeaseTiming

log = logging.getLogger("gpufleet.k8s")

JITTER = 1.2  # client-go's JitterFactor for the retry period


def micro_time(epoch_s: float) -> str:
    """metav1.MicroTime: RFC 3339 with exactly six fraction digits, UTC.

    A whole second moves by 1 µs: newer clients turn the string back into a datetime and
    write it with isoformat(), which drops a zero fraction, and the API server's MicroTime
    parser then refuses the body (it requires the six digits).
    """
    dt = datetime.fromtimestamp(epoch_s, UTC)
    if dt.microsecond == 0:
        dt += timedelta(microseconds=1)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self.clock = clock  # expiry and deadlines: this process's own monotonic clock
        self.wall = wall  # timestamps written into the Lease
        self.observed: dict[str, Any] | None = None  # the last spec seen
        self.observed_at: float = 0.0  # when it was seen to change (self.clock)
        self.last_renew: float | None = None  # last successful write as the holder
        self.leading = False

    @property
    def duration_s(self) -> int:
        return max(1, round(self.timing.lease_duration_s))

    def _spec(self, now_wall: float, held: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": micro_time(now_wall),
        }
        if held is not None and held.get("holderIdentity") == self.identity:
            spec["acquireTime"] = held.get("acquireTime") or micro_time(now_wall)
            spec["leaseTransitions"] = int(held.get("leaseTransitions") or 0)
        else:
            spec["acquireTime"] = micro_time(now_wall)
            transitions = int((held or {}).get("leaseTransitions") or 0)
            spec["leaseTransitions"] = transitions + 1 if held is not None else 0
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go's tryAcquireOrRenew); True when this candidate holds it."""
        now_wall = self.wall()
        try:
            lease = await self.api.read_lease(self.namespace, self.name)
        except NotFound:
            spec = self._spec(now_wall, None)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            try:
                await self.api.create_lease(self.namespace, body)
            except Conflict:
                return False  # another candidate created it first
            return self._won(spec)
        spec = dict(lease.get("spec") or {})
        if spec != self.observed:
            self.observed, self.observed_at = spec, self.clock()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        if holder and holder != self.identity and self.observed_at + duration > self.clock():
            return False  # held by another, and not expired as far as we have seen
        new = self._spec(now_wall, spec)
        body = {**lease, "spec": new}  # metadata keeps the resourceVersion we read
        try:
            await self.api.replace_lease(self.namespace, self.name, body)
        except Conflict:
            return False
        if holder != self.identity:
            log.info("%s acquired lease %s (from %r)", self.identity, self.name, holder or None)
        return self._won(new)

    def _won(self, spec: dict[str, Any]) -> bool:
        self.observed, self.observed_at = dict(spec), self.clock()
        self.last_renew = self.observed_at
        return True

    async def step(self) -> bool:
        """Try once, and say whether this candidate leads now (the renew deadline applies)."""
        try:
            ok = await self.try_acquire_or_renew()
        except ApiError as e:
            log.warning("lease %s: %s", self.name, e)
            ok = False
        if ok:
            self.leading = True
        elif self.leading and (
            self.last_renew is None
            or self.clock() - self.last_renew >= self.timing.renew_deadline_s
            or (self.observed or {}).get("holderIdentity") != self.identity
        ):
            log.warning("%s lost lease %s", self.identity, self.name)
            self.leading = False
        return self.leading

    async def release(self) -> None:
        """Give the lease up now (a standby need not wait for it to expire)."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self.api.read_lease(self.namespace, self.name)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = micro_time(self.wall())
            released = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            await self.api.replace_lease(self.namespace, self.name, {**lease, "spec": released})
        except ApiError as e:
            log.warning("lease %s: release failed: %s", self.name, e)

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire, then renew every retry period until `stop`; `leading` says where it
        stands at any moment. Releases the lease on the way out."""
        try:
            while not stop.is_set():
                await self.step()
                period = self.timing.retry_period_s
                wait = period if self.leading else period * (1 + random.random() * JITTER)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            await self.release()
