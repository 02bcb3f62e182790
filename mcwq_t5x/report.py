"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions
(`mcwq_t5x.evaluation.report`).

  python -m mcwq_t5x.report RESULTS_DIR [--targets_dir ../shared/mcwq/translations]
      [--data_dir DIR] [--out DIR] [--split {test,validation}]
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence
from mcwq_t5x.evaluation import report as report_lib
from mcwq_t5x.evaluation import score as score_lib


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line; returns the exit status (0 ok, 2 bad input)."""
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.report", description=__doc__.split("\n")[0])
  parser.add_argument("results_dir", help="directory of prediction files")
  parser.add_argument(
      "--targets_dir",
      default=None,
      help="translations/ directory (default: <data dir>/translations, data "
      "dir = $MCWQ_DATA_DIR or ../shared/mcwq)")
  parser.add_argument(
      "--data_dir",
      default=None,
      help="MCWQ directory for official/ fallbacks and the full release's "
      "recursionDepth (default: parent of --targets_dir)")
  parser.add_argument("--out", default="mcwq_report", help="output directory")
  parser.add_argument(
      "--split",
      default="test",
      choices=tuple(report_lib.EVAL_SPLITS),
      help="which predictions to score: test (default) or validation (`mcwq_t5x.train`/`eval` "
      "output, scored against the dev part; for a release without a test part)")
  args = parser.parse_args(argv)
  targets_dir = args.targets_dir
  if targets_dir is None:
    from mcwq_t5x.data import paths  # pylint: disable=g-import-not-at-top
    targets_dir = paths.data_dir() / "translations"
  try:
    report = report_lib.build(args.results_dir, targets_dir, args.data_dir, args.split)
  except (FileNotFoundError, score_lib.InputError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not report["runs"]:
    print(f"error: no prediction files found under {args.results_dir}", file=sys.stderr)
    return 2
  for warning in report["warnings"]:
    print(f"warning: {warning}", file=sys.stderr)
  written = report_lib.write_report(report, args.out)
  print(written["markdown"].read_text(encoding="utf-8"))
  print(f"wrote {written['markdown']}, {len(written['tables'])} CSV tables and "
        f"{len(written['figures'])} figures to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
