"""Atom and compound divergences (DBCA, `mcwq_t5x.data.divergence`) of splits or files.

  python -m mcwq_t5x.divergence [--split mcd1 ...] [--data_dir DIR] [--language en]
  python -m mcwq_t5x.divergence --files A B
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence
from mcwq_t5x.data import divergence
from mcwq_t5x.data import readers


def format_table(rows: Sequence[tuple[str, str, str, int, int, divergence.Divergences]]) -> str:
  """A Markdown table of (split, part A, part B, size A, size B, divergence.Divergences) rows."""
  lines = [
      "| split | P (train side) | Q (test side) | atom divergence | compound divergence |",
      "| --- | --- | --- | ---: | ---: |"
  ]
  for split, a, b, na, nb, d in rows:
    lines.append(f"| {split} | {a} ({na:,}) | {b} ({nb:,}) | {d.atom:.4f} | {d.compound:.4f} |")
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.divergence",
      description="DBCA atom (alpha 0.5) and compound (alpha 0.1) divergence between the parts "
      "of MCWQ splits, or between two files of queries (Keysers et al. 2020).")
  parser.add_argument(
      "--split",
      action="append",
      help="a split of the data folder (repeatable); default: every split it has")
  parser.add_argument(
      "--data_dir", default=None, help="MCWQ folder (default $MCWQ_DATA_DIR, else ../shared/mcwq)")
  parser.add_argument("--language", default=None, help="whose files to read (default en)")
  parser.add_argument(
      "--files",
      nargs=2,
      metavar=("P", "Q"),
      help="compare two files of queries instead (official lines, SPARQL or RIR, one per line); "
      "P is the training side")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  rows = []
  if args.files:
    a, b = (divergence.read_query_file(f) for f in args.files)
    rows.append(("files", args.files[0], args.files[1], len(a), len(b), divergence.compare(a, b)))
  else:
    splits = args.split or readers.discover(args.data_dir).splits
    for split in splits:
      figures = divergence.split_figures(split, args.data_dir, args.language)
      if not figures:
        print(f"{split}: fewer than two parts, skipped", file=sys.stderr)
      rows += [(split,) + f for f in figures]
  print(format_table(rows))
  print(f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
  return 0 if rows else 1


if __name__ == "__main__":
  sys.exit(main())
