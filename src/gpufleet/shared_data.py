"""Where the optional full data sets live: one setting, `GPUFLEET_SHARED`.

The package ships what it needs (model configs, the GPU catalog, sample traces); the full
traces and the measured-serving tables that some benchmarks read are big and optional.
They are looked up in `$GPUFLEET_SHARED` when it is set, else in `../shared` beside the
repository checkout when that folder exists. Tests never read them.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.errors import UserError

SHARED_ENV = "GPUFLEET_SHARED"
# src/gpufleet/shared_data.py -> the checkout's root is three levels up.
_BESIDE_CHECKOUT = Path(__file__).resolve().parents[2].parent / "shared"


def shared_dir() -> Path | None:
    """$GPUFLEET_SHARED if set, else ../shared beside the checkout if present, else None."""
    env = os.environ.get(SHARED_ENV)
    if env:
        return Path(env)
    return _BESIDE_CHECKOUT if _BESIDE_CHECKOUT.is_dir() else None


def shared_file(*parts: str) -> Path:
    """A file of the shared data (e.g. 'traces', 'mooncake_conversation.jsonl').

    A `UserError` naming the setting when it is not there.
    """
    root = shared_dir()
    path = (root or _BESIDE_CHECKOUT).joinpath(*parts)
    if not path.is_file():
        where = f"${SHARED_ENV}={root}" if os.environ.get(SHARED_ENV) else f"{path.parent}"
        raise UserError(
            f"{'/'.join(parts)} not found ({where})",
            field=SHARED_ENV,
            fix=f"set {SHARED_ENV} to the folder holding traces/ and validation/ "
            "(see docs/data.md), or use the package's sample data",
        )
    return path
