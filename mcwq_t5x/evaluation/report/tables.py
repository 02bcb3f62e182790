"""The report's tables as a registry (`TABLES`): one small function per table, each with its name
(the CSV file's stem) and title (report.md's heading); `tables` runs them in order.

A table function takes a `Context` and returns (header, rows, links) or None when it has no rows;
values are floats or None (missing), links are per row {column name: browser filters}.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation.report import rows as rows_lib
from mcwq_t5x.evaluation.report.common import ci_header
from mcwq_t5x.evaluation.report.common import Filters
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.common import Links
from mcwq_t5x.evaluation.report.common import part_of
from mcwq_t5x.evaluation.report.common import Report
from mcwq_t5x.evaluation.report.common import run_filters
from mcwq_t5x.evaluation.report.common import SCORE_TITLES
from mcwq_t5x.evaluation.report.common import SCORES
from mcwq_t5x.evaluation.report.common import title

#: The columns of Tables 4 and 5 that say what each row's model is (`rows.about`).
TRAINING_PART, MODEL_SIZE = "training part", "model size"
Header = list[str]
Rows = list[list[Any]]
NamedLinks = list[dict[str, Filters]]


@dataclasses.dataclass(frozen=True)
class Context:
  """What every table function reads: the report, the part scored, the runs' per-example exact
  match (run_key -> bool [n]), the table columns (languages, splits) and `with_published`."""
  report: Report
  part: str
  correct_of: dict[tuple, np.ndarray]
  languages: tuple[str, ...]
  splits: tuple[str, ...]
  with_published: bool


@dataclasses.dataclass(frozen=True)
class Table:
  """A registered table: `name` (CSV stem, results key), `title` (heading) and its function."""
  name: str
  title: str
  rows: Callable[[Context], Optional[tuple[Header, Rows, NamedLinks]]]


def _split_table(mode: str, score: str) -> Callable[[Context], Any]:
  """Table 4 (mode "monolingual") or 5 ("zeroshot") for one of the `SCORES`."""

  def make(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
    runs = ctx.report["runs"]
    mono = [r for r in runs if r["mode"] == "monolingual"]
    rows, links = [], []
    for model in sorted({r["model"] for r in runs}):
      if mode == "zeroshot" and not any(r["model"] == model and r["mode"] == mode for r in runs):
        continue
      r, l = rows_lib.split_rows(
          runs,
          model,
          mode,
          score,
          ctx.languages,
          fallback_en=mono if mode == "zeroshot" else None,
          splits=ctx.splits,
          correct_of=ctx.correct_of,
          part=ctx.part)
      rows += r
      links += l
    if not rows:
      return None
    header = ["model", "split"] + list(ctx.languages)
    if score == "exact_match":
      header += ci_header(ctx.languages)
      if ctx.with_published:  # the papers' rows, for the published splits of this mode
        extra = rows_lib.published_rows(mode, ctx.languages,
                                        {r["split"] for r in runs if r["mode"] == mode})
        rows += extra
        links += [{} for _ in extra]
    return header + [TRAINING_PART, MODEL_SIZE], rows, links

  return make


def gold_test(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """Table 6: test-intersection-MT vs -gold, one row per gold prediction file."""
  rows, links = [], []
  for e in ctx.report["intersection"]:
    mt, gold, gold_all = e["mt"] or {}, e["gold"] or {}, e["gold_all"]
    rows.append([
        e["model"], e["mode"],
        title(e["split"]), e["language"], e["n_gold"], e["matched"],
        mt.get("exact_match"),
        gold.get("exact_match"),
        mt.get("bleu"),
        gold.get("bleu"), gold_all["exact_match"], gold_all["bleu"]
    ] + [(d.get("exact_match_ci") or [None, None])[k]
         for d in (mt, gold, gold_all)
         for k in (0, 1)])
    filters = dict(
        model=e["model"], mode=e["mode"], split=e["split"], test=GOLD, language=e["language"])
    links.append({"n gold": filters, "EM gold (all n)": filters})
  if not rows:
    return None
  em = ["EM MT (matched)", "EM gold (matched)", "EM gold (all n)"]
  return ([
      "model", "mode", "trained on", "language", "n gold", "matched in test", em[0], em[1],
      "BLEU MT (matched)", "BLEU gold (matched)", em[2], "BLEU gold (all n)"
  ] + ci_header(em), rows, links)


def error_categories(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """§6.2 error-category counts per run; each count links to its examples."""
  rows, links = [], []
  for r in ctx.report["runs"]:
    rows.append([
        r["model"], r["mode"],
        title(r["split"]) + (" gold" if r["gold"] else ""), r["language"], r["n"]
    ] + [r["error_categories"][c] for c in metrics.ERROR_CATEGORIES])
    links.append({"n": run_filters(r, ctx.part)})
    links[-1].update({c: run_filters(r, ctx.part, category=c) for c in metrics.ERROR_CATEGORIES})
  if not rows:
    return None
  return (["model", "mode", "test set", "language", "n"] + list(metrics.ERROR_CATEGORIES), rows,
          links)


def unseen_exact_match(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """Exact match per number of unseen compounds (`compounds.by_unseen`) with its interval."""
  rows, links = [], []
  for r in ctx.report["runs"]:
    for bucket, b in (r.get("by_unseen") or {}).items():
      rows.append([
          r["model"], r["mode"],
          title(r["split"]), r["language"], bucket, b["n"], b["correct"], b["exact_match"]
      ] + list(b.get("ci") or [None, None]) + [_seen_in(r)])
      links.append({"n": run_filters(r, ctx.part, unseen=bucket)})
  if not rows:
    return None
  return ([
      "model", "mode", "split", "language", "unseen compounds", "n", "exact matches", "exact match"
  ] + ci_header(["exact match"]) + [SEEN_IN], rows, links)


#: The column of the unseen-compound table naming the part the compounds were looked up in.
SEEN_IN = "training part compared"


def _seen_in(run: dict[str, Any]) -> str:
  """"train", or "dev (run.json)" for the part that the run's run.json records."""
  part = run.get("unseen_part") or "train"
  return f"{part} (run.json)" if run.get("run_json") and run.get("train_part") else part


def unseen_costliest(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """The unseen compounds that cost most per run (`compounds.costliest`)."""
  rows, links = [], []
  for r in ctx.report["runs"]:
    for rank, c in enumerate(r.get("costliest") or (), start=1):
      rows.append([
          r["model"], r["mode"],
          title(r["split"]), r["language"], rank, c["compound"], c["n_with"], c["exact_match_with"],
          c["exact_match_without"], c["cost"], c["lost"]
      ])
      links.append({"examples with it": run_filters(r, ctx.part, compound=c["compound"])})
  if not rows:
    return None
  return ([
      "model", "mode", "split", "language", "rank", "unseen compound", "examples with it",
      "exact match with it", "exact match without it", "cost (points)", "exact matches lost"
  ], rows, links)


def seeds(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """Runs of one configuration with several seeds (`rows.seed_groups`)."""
  rows, links = [], []
  for g in rows_lib.seed_groups(ctx.report["runs"]):
    rows.append([
        g["model"], g["mode"],
        title(g["split"]) + (" gold" if g["gold"] else ""), g["language"], g["runs"], g["mean"],
        g["half_width"], g["min"], g["max"], ", ".join(g["models"])
    ])
    links.append({
        "mean exact match":
            dict(
                model=g["models"],
                mode=g["mode"],
                split=g["split"],
                test=GOLD if g["gold"] else ctx.part,
                language=g["language"])
    })
  if not rows:
    return None
  return ([
      "model", "mode", "test set", "language", "runs", "mean exact match", "± (95%, Student t)",
      "min", "max", "runs (models)"
  ], rows, links)


def split_divergences(ctx: Context) -> Optional[tuple[Header, Rows, NamedLinks]]:
  """DBCA atom and compound divergence between the parts of each split (`divergence`)."""
  rows = [[title(d["split"]), d["parts"], d["sizes"][0], d["sizes"][1], d["atom"], d["compound"]]
          for d in ctx.report.get("divergences", ())]
  if not rows:
    return None
  return (["split", "parts (P/Q)", "n P", "n Q", "atom divergence",
           "compound divergence"], rows, [{} for _ in rows])


_TABLE4 = "Table 4: monolingual results"
_TABLE5 = ("Table 5: zero-shot cross-lingual results (trained on English; "
           "the en column is the English model's own test result)")

#: Every table of the report, in report.md's order.
TABLES: tuple[Table, ...] = tuple(
    Table(f"{prefix}_{score}", f"{heading}, {SCORE_TITLES[score]}", _split_table(mode, score))
    for mode, prefix, heading in (("monolingual", "table4_monolingual", _TABLE4),
                                  ("zeroshot", "table5_zeroshot", _TABLE5))
    for score in SCORES) + (
        Table(
            "table6_gold_test",
            "Table 6: test-intersection-MT vs test-intersection-gold (exact match %, BLEU; the MT "
            "and gold columns score the same `matched in test` examples, the `all n` columns every "
            "gold example. The gold set was drawn from the MCD splits' test sets, so a model of "
            "another split matches only some of it)", gold_test),
        Table("error_categories",
              "Error categories (§6.2; definitions in mcwq_t5x.evaluation.metrics.ErrorAnalysis)",
              error_categories),
        Table(
            "unseen_compounds_exact_match",
            "Exact match by number of unseen compounds (compounds of the test query that no "
            "training query contains; mcwq_t5x.evaluation.compounds)", unseen_exact_match),
        Table(
            "unseen_compounds_costliest",
            f"The costliest unseen compounds (found in at least {compounds.MIN_EXAMPLES} test "
            "examples; exact matches lost = examples with it x (exact match without it - with it) "
            f"/ 100; the top {compounds.TOP} per run; examples with one unseen compound usually "
            "have related ones too, so the cost is that of the examples, not of the compound "
            "alone)", unseen_costliest),
        Table(
            "seeds_exact_match",
            "Several runs of one configuration (models named `<configuration>_seed<k>`): "
            "mean exact match ± the 95% Student-t interval over the runs "
            "(mcwq_t5x.evaluation.uncertainty.runs_interval)", seeds),
        Table(
            "split_divergences", "Split divergences (DBCA, Keysers et al. 2020: atoms alpha 0.5, "
            "compounds alpha 0.1; mcwq_t5x.data.divergence)", split_divergences),
    )
_BY_NAME = {t.name: t for t in TABLES}


def heading(name: str) -> str:
  """The Markdown heading of table `name`. Raises KeyError for a name not in `TABLES`."""
  return _BY_NAME[name].title


def tables(report: Report,
           links: Optional[Links] = None,
           with_published: bool = True) -> dict[str, tuple[list[str], list[list[Any]]]]:
  """{name: (header, rows)} of the tables with rows, in `TABLES` order.

  Exact-match columns get `<column> 95% CI low/high` at the row's end. `links`, if given, is
  filled per table with each row's {column index: browser filters}; `with_published` adds the
  published rows to Tables 4 and 5.
  """
  ctx = Context(report, part_of(report), rows_lib.correct_of_runs(report),
                *rows_lib.columns(report["runs"]), with_published)
  out = {}
  for table in TABLES:
    made = table.rows(ctx)
    if made is None:
      continue
    header, rows, named = made
    out[table.name] = (header, rows)
    if links is not None:  # why: the writers index cells by position after merging intervals
      links[table.name] = [{header.index(c): f for c, f in row.items()} for row in named]
  return out
