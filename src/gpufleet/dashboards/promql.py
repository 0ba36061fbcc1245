"""The metric names a PromQL expression reads (enough PromQL to check dashboards)."""

from __future__ import annotations

import re

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on",
             "ignoring", "group_left", "group_right"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names in `expr` (functions, label matchers, ranges and keywords left out)."""
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    out = set()
    for m in _IDENT.finditer(text):
        before = text[m.start() - 1] if m.start() else " "
        after = text[m.end() :].lstrip()[:1]
        if before in "$.0123456789" or after == "(":  # a variable, a number or a function
            continue
        if m.group().lower() not in _KEYWORDS:
            out.add(m.group())
    return out
