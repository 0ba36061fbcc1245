"""`mypyc_attr` for the modules tools/compile_sim.py compiles with mypyc, without
mypy_extensions at run time (a dev dependency): where it is absent the decorator does
nothing, as mypy_extensions' own does when the module runs interpreted."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

_T = TypeVar("_T")

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # pragma: no cover - only without the dev extra

        def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[_T], _T]:
            return lambda x: x
