"""Converts queries between SPARQL and RIR (`mcwq_t5x.data.rir`), one query a line.

  python -m mcwq_t5x.rir to-rir < queries.sparql > queries.rir
  python -m mcwq_t5x.rir to-sparql < queries.rir > queries.sparql

A line that cannot be converted gives an empty output line, a message naming its line number on
stderr and exit status 1.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence
from mcwq_t5x.data import rir
from mcwq_t5x.data import sparql as sparql_lib


def _convert_stream(convert, lines, out, err) -> int:
  failures = 0
  for number, line in enumerate(lines, start=1):
    line = line.rstrip("\n")
    try:
      out.write(convert(line) + "\n")
    except (rir.RIRError, sparql_lib.SparqlParseError) as e:
      failures += 1
      out.write("\n")
      err.write(f"line {number}: {e}\n")
  return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
  """Command line: `python -m mcwq_t5x.rir {to-rir,to-sparql}`, stdin -> stdout, one query a line.

  A line that cannot be converted becomes an empty output line (so outputs stay line-parallel), an
  error naming its line number goes to stderr and the exit status is 1.
  """
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.rir", description=__doc__.split("\n")[0])
  parser.add_argument(
      "direction",
      choices=["to-rir", "to-sparql"],
      help="to-rir: SPARQL -> RIR; to-sparql: RIR -> SPARQL")
  args = parser.parse_args(argv)
  convert = rir.sparql_to_rir if args.direction == "to-rir" else rir.rir_to_sparql
  return _convert_stream(convert, sys.stdin, sys.stdout, sys.stderr)


if __name__ == "__main__":
  sys.exit(main())
