"""Recent-window latencies the autoscaler reads: TTFT and TPOT of streamed requests.

The gateway adds each streamed request when its stream ends; the simulator when its
virtual request finishes. Times are passed in; nothing here reads a clock.
"""

from __future__ import annotations

from array import array
from typing import Any

from gpufleet.fleet_state.recent_times import RecentTimes
from gpufleet.stats import percentiles

SIGNAL_QUANTILES = (0.5, 0.9, 0.99)


class RecentWindow(RecentTimes):
    """(time, value) samples of the last `window_s` seconds, bounded in count; its
    percentiles are `gpufleet.stats`' (numpy's linear), keyed 'p50', 'p99', ...
    The values are an array of doubles beside the times (`RecentTimes`)."""

    def __init__(self, window_s: float, max_samples: int = 20000) -> None:
        super().__init__(max_samples)
        self.window_s = window_s
        self._values = array("d")

    @property
    def samples(self) -> list[tuple[float, float]]:
        """(time, value) of each sample kept, oldest first."""
        head = self._head
        return list(zip(self._times[head:], self._values[head:], strict=True))

    def add(self, now_s: float, value: float) -> None:
        self._values.append(value)
        self._add_time(now_s)

    def _drop_first(self, n: int) -> None:
        del self._values[:n]

    def _trim(self, now_s: float) -> None:
        """Drop the samples older than the window."""
        self._trim_before(now_s - self.window_s)

    def percentiles(self, now_s: float, qs: tuple[float, ...]) -> dict[str, float | None]:
        self._trim(now_s)
        keys = [f"p{round(q * 100)}" for q in qs]
        got = percentiles(self._values[self._head :].tolist(), [q * 100.0 for q in qs])
        values: list[float | None] = [*got] if got is not None else [None] * len(qs)
        return dict(zip(keys, values, strict=True))

    def mean(self, now_s: float) -> float | None:
        """The mean over the window (None: empty)."""
        self._trim(now_s)
        n = self.count()
        return sum(self._values[self._head :].tolist()) / n if n else None


class LatencyWindows:
    """TTFT and TPOT over the same recent window: the fleet's, and each model's (a model
    group of `gpufleet up` scales on its own model's latencies)."""

    MAX_MODELS = 64  # a bound on per-model windows (model names come from clients)

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.ttft = RecentWindow(window_s)
        self.tpot = RecentWindow(window_s)
        # Prompt + output tokens of each finished request that reported them: the work a
        # request brings, whose mix a rate in requests per second does not see.
        self.tokens = RecentWindow(window_s)
        # Their prompt tokens alone (where known): a prompt token costs a replica less than
        # an output token, so a capacity in work weighs the two apart.
        self.prompt_tokens = RecentWindow(window_s)
        self.by_model: dict[str, tuple[RecentWindow, RecentWindow]] = {}

    def observe(
        self,
        now_s: float,
        ttft_s: float | None,
        tpot_s: float | None,
        model: str | None = None,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """One finished request: TTFT when it streamed a token, TPOT when it had > 1, its
        prompt + output tokens and its prompt tokens where known (the fleet's window only;
        the prompt's only with the total, so that both means cover the same requests)."""
        if tokens is not None:
            self.tokens.add(now_s, float(tokens))
            if prompt_tokens is not None:
                self.prompt_tokens.add(now_s, float(prompt_tokens))
        windows = [(self.ttft, self.tpot)]
        pair = self._model_pair(model) if model is not None else None
        if pair is not None:
            windows.append(pair)
        for ttft, tpot in windows:
            if ttft_s is not None:
                ttft.add(now_s, ttft_s)
            if tpot_s is not None:
                tpot.add(now_s, tpot_s)

    def _model_pair(self, model: str) -> tuple[RecentWindow, RecentWindow] | None:
        pair = self.by_model.get(model)
        if pair is None and len(self.by_model) < self.MAX_MODELS:
            pair = self.by_model[model] = (RecentWindow(self.window_s), RecentWindow(self.window_s))
        return pair

    def to_json(self) -> dict[str, Any]:
        """Every sample, the fleet's and each model's (another process merges them)."""
        return {
            "ttft": list(self.ttft.samples),
            "tpot": list(self.tpot.samples),
            "tokens": list(self.tokens.samples),
            "prompt_tokens": list(self.prompt_tokens.samples),
            "by_model": {
                m: [list(t.samples), list(p.samples)] for m, (t, p) in self.by_model.items()
            },
        }

    def merge_json(self, raw: dict[str, Any]) -> None:
        """Add another window's samples (`to_json`): the windows of a gateway's workers as
        one, per model too."""
        targets = [(self.ttft, self.tpot, raw.get("ttft") or (), raw.get("tpot") or ())]
        for model, (ttft, tpot) in (raw.get("by_model") or {}).items():
            pair = self._model_pair(str(model))
            if pair is not None:
                targets.append((*pair, ttft, tpot))
        for t, v in raw.get("tokens") or ():
            self.tokens.add(float(t), float(v))
        for t, v in raw.get("prompt_tokens") or ():
            self.prompt_tokens.add(float(t), float(v))
        for ttft_window, tpot_window, ttft_samples, tpot_samples in targets:
            for t, v in ttft_samples:
                ttft_window.add(float(t), float(v))
            for t, v in tpot_samples:
                tpot_window.add(float(t), float(v))
