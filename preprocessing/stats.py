r"""Dataset statistics as in MCWQ Table 3 (paper §3.4) and a complexity histogram.

  python -m preprocessing.stats --dataset OUT/dataset.json --png complexity.png
  python -m preprocessing.stats --official ../shared/mcwq/official/mcd1/test.en.txt

For a release (`dataset.json`) or `official/*/*.txt` files: unique questions
(`questionWithBrackets`), question patterns (`questionPatternModEntities`), unique queries
(`sparql`, else `sparqlPatternModEntities`), query patterns (`sparqlPattern`), yes/no vs wh-
questions, queries compared up to clause order; and a PNG histogram of complexity: CFQ's
`recursionDepth` where records have it, else the number of triples and filters
(`complexity_measure` says which: `recursionDepth`, `clauses` or `mixed`).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
from typing import Any, Iterable, Sequence

from mcwq_t5x.data import readers

from mcwq_t5x.data import sparql as sparql_lib


def query_pattern(query: str) -> tuple:
  """Canonical query pattern: entities -> M*, properties -> P* (by sorted first occurrence)."""
  q = sparql_lib.parse_sparql(query)
  ents: dict[str, str] = {}
  props: dict[str, str] = {}

  def t(x: str) -> str:
    return x if sparql_lib.is_variable(x) else ents.setdefault(x, f"M{len(ents)}")

  triples = sorted((t(tr.subject), props.setdefault(tr.predicate, f"P{len(props)}"), t(tr.object))
                   for tr in sorted(q.triples))
  filters = sorted(tuple(sorted((t(f.left), t(f.right)))) for f in sorted(q.filters))
  return q.prefix, tuple(triples), tuple(filters)


def compute(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
  """Statistics of records with keys questionPatternModEntities, sparqlPatternModEntities and
  optionally questionWithBrackets, sparql, recursionDepth.

  Returns:
    {"examples", "unique_questions", "question_patterns", "unique_queries", "query_patterns",
     "yes_no", "wh", "complexity": {level: {"yes_no": n, "wh": n}}, "complexity_measure":
     "recursionDepth" | "clauses" | "mixed" (records with and without a depth) | None (none)}.
  """
  recs = list(records)
  uq, qp, uqu, qpat = set(), set(), set(), set()
  yn = 0
  measures = set()
  hist: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
  for r in recs:
    pattern_q = r["sparqlPatternModEntities"]
    full_q = r.get("sparql") or pattern_q
    qp.add(r["questionPatternModEntities"])
    uq.add(r.get("questionWithBrackets") or r["questionPatternModEntities"])
    uqu.add(sparql_lib.parse_sparql(full_q).canonical())
    qpat.add(query_pattern(pattern_q))
    is_yn = pattern_q.lstrip().startswith("ASK")
    yn += is_yn
    level = r.get("recursionDepth")
    measures.add("clauses" if level is None else "recursionDepth")
    if level is None:
      q = sparql_lib.parse_sparql(pattern_q)
      level = len(q.triples) + len(q.filters)
    hist[int(level)]["yes_no" if is_yn else "wh"] += 1
  return {
      "examples": len(recs),
      "unique_questions": len(uq),
      "question_patterns": len(qp),
      "unique_queries": len(uqu),
      "query_patterns": len(qpat),
      "yes_no": yn,
      "wh": len(recs) - yn,
      "complexity": {
          k: dict(hist[k]) for k in sorted(hist)
      },
      "complexity_measure": measures.pop() if len(measures) == 1 else "mixed" if measures else None
  }


def from_examples(examples: Iterable[readers.Example]) -> list[dict[str, Any]]:
  """Records for `compute` from `readers.Example`s (official files: patterns only)."""
  return [{
      "questionPatternModEntities": e.question,
      "sparqlPatternModEntities": e.sparql,
      "recursionDepth": e.recursionDepth
  } for e in examples]


COMPLEXITY_AXIS = {
    "recursionDepth": "complexity level (CFQ's recursionDepth)",
    "clauses": "complexity level (triples and filters of the query)",
    "mixed": "complexity level (recursionDepth, else triples and filters)",
    None: "complexity level",
}


def plot_complexity(stats: dict[str, Any], path: str | pathlib.Path, title: str = "") -> None:
  """Stacked bar chart of the complexity histogram (yes/no and wh-) written as a PNG; the x axis
  names the measure (`COMPLEXITY_AXIS[stats["complexity_measure"]]`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  levels = sorted(stats["complexity"])
  yn = [stats["complexity"][k].get("yes_no", 0) for k in levels]
  wh = [stats["complexity"][k].get("wh", 0) for k in levels]
  fig, ax = plt.subplots(figsize=(7, 3.5))
  ax.bar(levels, yn, label="yes/no")
  ax.bar(levels, wh, bottom=yn, label="wh-")
  ax.set_xlabel(COMPLEXITY_AXIS[stats.get("complexity_measure")])
  ax.set_ylabel("questions")
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  """Command line `python -m preprocessing.stats` (module docstring); prints the statistics as
  JSON and returns the exit status."""
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--dataset", help="a dataset.json produced by preprocessing.migrate")
  ap.add_argument("--official", nargs="*", help="official `IN: …  OUT: …` files")
  ap.add_argument("--png", help="write the complexity histogram here")
  ap.add_argument("--title", help="the figure's title (default: `figure_title`)")
  args = ap.parse_args(argv)
  if args.dataset:
    recs = json.loads(pathlib.Path(args.dataset).read_text(encoding="utf-8"))
  elif args.official:
    recs = from_examples(e for f in args.official for e in readers.read_official(f))
  else:
    ap.error("give --dataset or --official")
  stats = compute(recs)
  print(json.dumps(stats, indent=1))
  if args.png:
    plot_complexity(stats, args.png, args.title or
                    figure_title(args.dataset or args.official[0], stats["examples"]))
  return 0


def figure_title(source: str | pathlib.Path, examples: int) -> str:
  """The histogram's default title: the release a `dataset.json` belongs to (its folder's name,
  e.g. "mcwq_sample"), or an official file as `split/file` ("mcd1/test.en.txt"), and the number of
  questions: "mcwq_sample: 1,818 questions"."""
  path = pathlib.Path(source).resolve()
  name = path.parent.name if path.name == "dataset.json" else f"{path.parent.name}/{path.name}"
  return f"{name}: {examples:,} questions"


if __name__ == "__main__":
  sys.exit(main())
