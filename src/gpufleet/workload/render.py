"""One workload, two renderings: prompt text for live traffic, segments for the simulator.

`text_conversations` gives `gpufleet bench` and `gpufleet up --demo` their `Conversation`s
(each turn's words; a session's earlier answers are the server's own, added by the
client). `sim_requests` gives the simulator one `SimRequest` per turn, whose segments
carry the session's earlier turns and an answer segment of each earlier turn's length, so
the simulator's prefix hashes see what a live replica would.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter

from gpufleet.workload.prompts import PromptFactory
from gpufleet.workload.segments import KIND_ANSWER, Segments, segment_key
from gpufleet.workload.shapes import ConversationShape
from gpufleet.workload.types import Conversation, Turn


def text_conversations(
    shapes: Iterable[ConversationShape], factory: PromptFactory | None = None
) -> Iterator[Conversation]:
    """The shapes as prompt text, lazily (a long trace never holds every prompt at once)."""
    factory = factory or PromptFactory()
    for shape in shapes:
        turns = tuple(
            Turn(factory.segments_text(t.segments), t.input_tokens, t.output_tokens)
            for t in shape.turns
        )
        yield Conversation(shape.id, turns, shape.arrival_s, shape.prefix_group, shape.adapter)


_tokens_of = itemgetter(1)  # a segment's tokens


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request the simulator replays (a session's turn is one request)."""

    index: int
    arrival_s: float  # ignored in closed-loop runs (a client sends when its last one ends)
    segments: Segments
    output_tokens: int  # max_tokens, with EOS ignored (as `bench --ignore-eos`)
    session_key: str | None = None
    prefix_group: int | None = None
    # Multi-turn sessions: sent when request `after` (the previous turn) has finished.
    after: int | None = None
    adapter: str | None = None  # the LoRA adapter it asks for (None: the base model)

    @property
    def input_tokens(self) -> int:
        return sum(map(_tokens_of, self.segments))


def sim_requests(shapes: Iterable[ConversationShape]) -> list[SimRequest]:
    """One request per turn, in conversation order; turn k+1 follows turn k (`after`)."""
    out: list[SimRequest] = []
    for shape in shapes:
        history: Segments = ()
        prev: int | None = None
        for turn in shape.turns:
            index = len(out)
            segments = (*history, *turn.segments)
            out.append(
                SimRequest(
                    index=index,
                    arrival_s=shape.arrival_s,
                    segments=segments,
                    output_tokens=turn.output_tokens,
                    session_key=shape.session_key,
                    prefix_group=shape.prefix_group,
                    after=prev,
                    adapter=shape.adapter,
                )
            )
            if len(shape.turns) > 1:  # the next turn resends this one and its answer
                answer = segment_key(KIND_ANSWER, turn.segments[-1][0] if turn.segments else index)
                history = (*segments, (answer, turn.output_tokens))
            prev = index
    return out
