"""Stop strings: held back while they may still match, cut where they do (vLLM's rules)."""

from __future__ import annotations

from gpufleet.replica.stops import StopScanner


def test_text_that_may_start_a_stop_string_is_held_back() -> None:
    s = StopScanner(["foo bar"])
    assert s.feed(" one", final=False) == ""  # the last 6 characters are held back
    assert s.feed(" two", final=False) == " o"
    assert s.feed(" foo", final=False) == "ne t"
    assert s.feed(" bar", final=False) == "wo "  # the stop string is cut off
    assert s.matched == "foo bar"
    assert s.feed(" more", final=False) == ""


def test_final_flushes_and_include_keeps_the_stop_string() -> None:
    s = StopScanner(["zz"])
    assert s.feed(" a", final=False) == " "
    assert s.feed(" b", final=True) == "a b"
    assert s.matched is None
    inc = StopScanner(["b c"], include_stop=True)
    out = inc.feed(" a b", final=False) + inc.feed(" c d", final=False)
    assert out == " a b c" and inc.matched == "b c"


def test_earliest_stop_string_wins() -> None:
    s = StopScanner(["late", "early"])
    assert s.feed(" early then late", final=False) == " " and s.matched == "early"
