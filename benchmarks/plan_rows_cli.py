"""The command line the measured-row benchmarks share (plan_accuracy, plan_residuals,
plan_high_load): the CSV of measured rows, the model configs, where to write; and the end
that runs the report, prints its table and writes it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.validation.measured import default_csv
from record import RESULTS, write_result


def rows_parser(description: str, out_name: str, *out_aliases: str) -> argparse.ArgumentParser:
    """A parser with the CSV (default: the shared one), --model-configs and --out."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument(
        "csv", nargs="?", type=Path, default=None, help="default: $GPUFLEET_SHARED/validation/"
    )
    parser.add_argument("--model-configs", type=Path, default=None)
    parser.add_argument(
        "--out", *out_aliases, type=Path, default=RESULTS / out_name, help="path without suffix"
    )
    return parser


def write_report(
    args: argparse.Namespace,
    run: Callable[[Path], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
) -> int:
    """Run the report on the CSV (a UserError: its message and exit status 2), print its
    table, write JSON and markdown to --out."""
    try:
        args.csv = args.csv or default_csv()
        report = run(args.csv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = markdown(report)
    print(table)
    json_path, md_path = write_result(args.out, report, table, note=f"CSV: {args.csv.name}")
    print(f"\nwrote {json_path} and {md_path}", file=sys.stderr)
    return 0
