"""Stop strings, matched in generated text the way vLLM matches them.

While stop strings are set, the last (longest stop string - 1) characters are held back
until they can no longer become a stop string, so a client never sees part of one; the
stop string itself is cut off unless include_stop_str_in_output.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = stops
        self.include_stop = include_stop
        self.max_len = max((len(s) for s in stops), default=0)
        self.text = ""  # everything generated so far
        self.emitted = 0  # characters of `text` handed out
        self.matched: str | None = None

    def feed(self, new_text: str, final: bool) -> str:
        """Add generated text; return what may be sent now (all of it once `final`)."""
        if self.matched is not None:
            return ""
        self.text += new_text
        text = self.text
        start = max(0, self.emitted - self.max_len + 1)
        first: tuple[int, str] | None = None
        for s in self.stops:
            pos = text.find(s, start)
            if pos >= 0 and (first is None or pos < first[0]):
                first = (pos, s)
        if first is not None:
            pos, s = first
            self.matched = s
            cut = pos + (len(s) if self.include_stop else 0)
            out = text[self.emitted : cut] if cut > self.emitted else ""
            self.emitted = max(self.emitted, cut)
            return out
        safe = len(text) if final else max(self.emitted, len(text) - self.max_len + 1)
        out = text[self.emitted : safe]
        self.emitted = safe
        return out
