"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions, with
95% bootstrap intervals, the unseen-compound diagnosis, an error browser and paired comparisons
(`mcwq_t5x.evaluation.report`).

  python -m mcwq_t5x.report RESULTS_DIR [RESULTS_DIR ...] [--targets_dir ../shared/mcwq/translations]
      [--data_dir DIR] [--out DIR] [--split {test,validation}] [--html DIR] [--no_published]
      [--compare A B [--compare_gold FILE]]
  python -m mcwq_t5x.report --compare A B [--compare_gold FILE] [--targets_dir ...]

Several RESULTS_DIRs are read as one (links to folders are followed). Two results of one run and
test set (`MODEL_DIR/predictions/` and `eval_<step>/`) are both shown: the run's name is its final
evaluation, the other `<run> step <k>`, with a warning on stderr. --html DIR writes the error browser (DIR/index.html, one self-contained page; report.md's cells
link to it). --compare A B: a paired test of two prediction files on the same examples (paired
bootstrap interval of the difference in exact match, exact permutation test); without
RESULTS_DIR it prints only that, as JSON. Progress lines go to stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from mcwq_t5x.data import readers
from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import report as report_lib
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x import console


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line; returns the exit status (0 ok, 2 bad input)."""
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.report", description=__doc__.split("\n")[0])
  parser.add_argument(
      "results_dir",
      nargs="*",
      default=[],
      metavar="RESULTS_DIR",
      help="directories of prediction files (several are read as one)")
  parser.add_argument(
      "--targets_dir",
      default=None,
      help="translations/ directory (default: <data dir>/translations, data "
      "dir = $MCWQ_DATA_DIR or ../shared/mcwq)")
  parser.add_argument(
      "--data_dir",
      default=None,
      help="MCWQ directory for official/ fallbacks, the full release's recursionDepth and the "
      "training parts of the unseen-compound diagnosis (default: parent of --targets_dir)")
  parser.add_argument("--out", default="mcwq_report", help="output directory")
  parser.add_argument(
      "--split",
      default="test",
      choices=report_lib.EVAL_SPLITS,
      help="which predictions to score: test (default) or validation (`mcwq_t5x.train`/`eval` "
      "output, scored against the dev part; for a release without a test part)")
  parser.add_argument(
      "--html",
      default=None,
      metavar="DIR",
      help="write the error browser to DIR/index.html (a self-contained page)")
  parser.add_argument(
      "--no_published",
      action="store_true",
      help="leave the published reference rows out of Tables 4 and 5")
  parser.add_argument(
      "--compare",
      nargs=2,
      metavar=("A", "B"),
      default=None,
      help="paired test of two prediction files on the same examples")
  parser.add_argument(
      "--compare_gold",
      default=None,
      metavar="FILE",
      help="gold queries (RIR) of the --compare files (default: the test set their layout names)")
  args = parser.parse_args(argv)
  if not args.results_dir and args.compare is None:
    parser.error("give RESULTS_DIR, --compare A B, or both")
  targets_dir = args.targets_dir
  if targets_dir is None:
    from mcwq_t5x.data import paths  # pylint: disable=g-import-not-at-top
    targets_dir = paths.data_dir() / "translations"
  progress = report_lib.ProgressLines()
  comparisons = []
  try:
    if args.compare is not None:
      progress(f"paired comparison of {args.compare[0]} and {args.compare[1]}")
      comparisons.append(
          report_lib.compare(args.compare[0], args.compare[1], targets_dir, args.data_dir,
                             args.compare_gold))
      if not args.results_dir:
        print(json.dumps(comparisons[0], indent=2))
        print(report_lib.comparison_markdown(comparisons[0]), file=sys.stderr)
        return 0
    report = report_lib.build(args.results_dir, targets_dir, args.data_dir, args.split, progress)
  except (FileNotFoundError, score_lib.InputError, readers.DataFormatError) as e:
    console.print_error(e)
    return 2
  if not report["runs"]:
    console.print_error(
        FileNotFoundError(f"no prediction files found under {', '.join(args.results_dir)}"))
    return 2
  for warning in report["warnings"]:
    print(f"warning: {warning}", file=sys.stderr)
  try:
    written = report_lib.write_report(
        report,
        args.out,
        html_dir=args.html,
        with_published=not args.no_published,
        comparisons=comparisons,
        progress=progress)
  except (report_lib.ForeignFileError, writers.ResultWriteError) as e:
    console.print_error(e)  # one line, no traceback
    return 2 if isinstance(e, report_lib.ForeignFileError) else 1
  print(written["markdown"].read_text(encoding="utf-8"))
  print(f"wrote {written['markdown']}, {_count(len(written['tables']), 'CSV table')} and "
        f"{_count(len(written['figures']), 'figure')} to {args.out}" +
        (f"; the error browser {written['html']}" if written["html"] else ""))
  progress("done")
  return 0


def _count(n: int, noun: str) -> str:
  """"1 figure", "3 figures"."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


if __name__ == "__main__":
  sys.exit(main())
