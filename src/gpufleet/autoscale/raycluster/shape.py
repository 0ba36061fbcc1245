"""A replica's placement group shape and the names it lives under in Ray (no Ray import).

One bundle per pipeline stage, each with the stage's TP GPUs plus CPU / memory / custom
resources per bundle. PP=1 never crosses a node (STRICT_PACK); PP>1 packs when it can and
lets stages spread over nodes when it must (PACK). When a group cannot be placed,
`shortage` says which resource is short, from the free resources per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Resources = dict[str, float]

# Names in Ray: "{fleet}/{replica_id}.{generation}" for a replica's actor and its placement
# group (a replacement gets the next generation: a dead actor's name is freed lazily).
CONTROLLER_SUFFIX = "/controller"


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    tp: int = 1
    pp: int = 1
    cpus_per_bundle: float = 1.0
    memory_bytes_per_bundle: int | None = None
    resources_per_bundle: Mapping[str, float] = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        return "STRICT_PACK" if self.pp == 1 else "PACK"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def bundle(self) -> Resources:
        out: Resources = {"GPU": float(self.tp)}
        if self.cpus_per_bundle > 0:
            out["CPU"] = float(self.cpus_per_bundle)
        if self.memory_bytes_per_bundle:
            out["memory"] = float(self.memory_bytes_per_bundle)
        out.update({k: float(v) for k, v in self.resources_per_bundle.items()})
        return out

    def bundles(self) -> list[Resources]:
        return [self.bundle() for _ in range(self.pp)]

    def describe(self) -> str:
        b = ", ".join(f"{k}: {_num(v)}" for k, v in self.bundle().items())
        where = "on one node" if self.pp == 1 else "stages may span nodes"
        return f"{self.pp} bundle(s) of {{{b}}} ({self.strategy}, {where})"


def _num(v: float) -> str:
    if v >= 1 << 30:
        return f"{v / (1 << 30):.1f} GiB"
    return f"{v:g}"


def replica_name(fleet: str, replica_id: str, generation: int) -> str:
    return f"{fleet}/{replica_id}.{generation}"


def parse_replica_name(fleet: str, name: str) -> tuple[str, int] | None:
    """(replica_id, generation) of a name this fleet gave, or None."""
    prefix = fleet + "/"
    if not name.startswith(prefix):
        return None
    rid, dot, gen = name[len(prefix) :].rpartition(".")
    if not dot or not rid or not gen.isdigit():
        return None
    return rid, int(gen)


def replica_index(replica_id: str) -> int:
    """3 for 'replica-3' (0 when it has no number): new ids continue after adopted ones."""
    tail = replica_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def shortage(shape: ReplicaShape, free_by_node: Mapping[str, Mapping[str, float]]) -> str:
    """Why a group of this shape does not fit now, in words, from free resources per node."""
    need = shape.bundle()
    short: list[str] = []
    for key, amount in need.items():
        best = max((free.get(key, 0.0) for free in free_by_node.values()), default=0.0)
        total = sum(free.get(key, 0.0) for free in free_by_node.values())
        if shape.pp == 1 and best < amount:
            short.append(
                f"{key}: needs {_num(amount)} on one node, at most {_num(best)} free on any "
                f"node ({_num(total)} free in the cluster)"
            )
        elif shape.pp > 1:
            fits = sum(int(free.get(key, 0.0) // amount) for free in free_by_node.values())
            if fits < shape.pp:
                short.append(
                    f"{key}: needs {_num(amount)} in each of {shape.pp} stages, room for "
                    f"{fits} stage(s) ({_num(total)} free in the cluster)"
                )
    if not short:
        return "resources are free but fragmented or held by other pending groups"
    return "short of " + "; ".join(short)
