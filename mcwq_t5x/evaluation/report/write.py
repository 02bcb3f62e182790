"""Writing the report under --out: report.md (every table, warnings, files read, skipped
analyses), one CSV per table (`table4_monolingual_*.csv`, `table5_zeroshot_*.csv`,
`table6_gold_test.csv`, `error_categories.csv`, `unseen_compounds_*.csv`, `seeds_exact_match.csv`,
`split_divergences.csv`; exact matches with `<column> 95% CI low/high` columns), the figures,
results.json and the error browser (`browser.write_page`); `ProgressLines` prints the progress
lines on stderr."""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import published
from mcwq_t5x.evaluation import uncertainty
from mcwq_t5x.evaluation.report.common import Links
from mcwq_t5x.evaluation.report.common import Progress
from mcwq_t5x.evaluation.report.common import Report
from mcwq_t5x.evaluation.report.figures import figures
from mcwq_t5x.evaluation.report.render import fmt
from mcwq_t5x.evaluation.report.render import merge_intervals
from mcwq_t5x.evaluation.report.render import to_markdown
from mcwq_t5x.evaluation.report.render import write_csv
from mcwq_t5x.evaluation.report.tables import heading
from mcwq_t5x.evaluation.report.tables import tables

INTERVAL_NOTE = (
    f"Exact match in parentheses: its 95% bootstrap confidence interval (percentile method, "
    f"{uncertainty.N_RESAMPLES:,} resamples of the test examples, fixed seed {uncertainty.SEED}; "
    "an MCD mean resamples each split's test set; mcwq_t5x.evaluation.uncertainty).")

TRAINING_NOTE = (
    "`training part`: the MCWQ part each model was trained on, as its run's run.json records it "
    "(`dev` on an MCD split shares the test part's held-out compounds, so such a row is not "
    "comparable with one trained on `train`; `multilingual`: one model of every language; `<k>-shot "
    "prompt`: a language model shown k demonstrations of that part, its size the model's name); "
    "`model size`: the size run.json records; the upstream results/ folder and the published rows "
    "are the papers' models, trained on `train`; `-`: not recorded.")


def results_note(report: Report) -> Optional[str]:
  """The rule naming several results of one run apart, when the report has such rows."""
  renamed = sorted({
      (r["model"], r["run"]) for r in report["runs"] if r.get("run", r["model"]) != r["model"]
  })
  if not renamed:
    return None
  return ("Several results of one run on one test set: the row named after the run alone is its "
          "final evaluation (`MODEL_DIR/predictions/`, written by mcwq_t5x.train), else its latest "
          "checkpoint; the others are named by the checkpoint step they decoded (" +
          ", ".join(f"`{m}`" for m, _ in renamed) + "); each file is under Files read.")


def published_note() -> str:
  """The sources of the published rows of Tables 4 and 5."""
  sources = dict.fromkeys(f"{p.citation}, \"{p.title}\"" for p in published.ROWS)
  return ("Rows `published: …` are exact match as printed in the papers (not recomputed; "
          "mcwq_t5x.evaluation.published): " + "; ".join(sources) + ".")


def comparison_markdown(c: dict[str, Any]) -> str:
  """One paragraph on a paired comparison (`compare`)."""
  return (f"A = `{c['a']}`, B = `{c['b']}` ({c['n']} examples of `{c['gold']}`): exact match "
          f"A {c['exact_match_a']:.1f}, B {c['exact_match_b']:.1f}, difference A - B "
          f"{c['difference']:+.1f} points, 95% paired bootstrap interval "
          f"[{c['interval'][0]:+.1f}, {c['interval'][1]:+.1f}] ({c['n_resamples']:,} resamples, "
          f"seed {c['seed']}); only A right on {c['only_a']}, only B on {c['only_b']}, both on "
          f"{c['both']}, neither on {c['neither']}; paired permutation test (exact, two-sided) "
          f"{format_p_value(c['p_value'])}.")


def format_p_value(p: float) -> str:
  """"p = 0.0415"; a p-value below the smallest normal float64 (the exact test's tail underflows
  to 0.0, e.g. 3,054 discordant pairs against 2) as "p < 1e-300", never "p = 0"."""
  return "p < 1e-300" if p < 1e-300 else f"p = {p:.3g}"


#: The list of the files a report wrote in its folder (only those are ever replaced).
MANIFEST = ".mcwq_report_files.json"
_FIGURE_PREFIXES = ("errors_", "complexity_", "unseen_")


class ForeignFileError(FileExistsError):
  """The report's folder holds files of its names that no report wrote (a user's report.md)."""


def check_own_files(folder: pathlib.Path, names: Sequence[str]) -> None:
  """Raises ForeignFileError naming the files of `names` in `folder` that `folder/MANIFEST` does
  not list (files this command did not write), so that they are never overwritten."""
  foreign = sorted(n for n in set(names) - _listed(folder) if (folder / n).exists())
  if foreign:
    raise ForeignFileError(
        f"{folder} holds {', '.join(foreign)}, which no report wrote ({MANIFEST} does not list "
        "them): move them away or give another --out/--html; nothing was written")


def record_own_files(folder: pathlib.Path, names: Sequence[str]) -> None:
  """Adds `names` to `folder/MANIFEST` (the files `check_own_files` lets a report replace)."""
  writers.write_atomic(folder / MANIFEST, json.dumps(sorted(_listed(folder) | set(names))) + "\n")


def _listed(folder: pathlib.Path) -> set[str]:
  try:
    return set(json.loads((folder / MANIFEST).read_text(encoding="utf-8")))
  except (OSError, ValueError, TypeError):  # no manifest (a new folder), or an unreadable one
    return set()


def write_report(report: Report,
                 out_dir: str | pathlib.Path,
                 html_dir: Optional[str | pathlib.Path] = None,
                 with_published: bool = True,
                 comparisons: Sequence[dict[str, Any]] = (),
                 progress: Progress = None) -> dict[str, Any]:
  """{"tables", "figures", "markdown", "html"}: the report written under `out_dir`, and with
  `html_dir` the error browser each cell of report.md links to.

  `comparisons`: `compare` results to add; `progress` as `build`'s.
  """
  from mcwq_t5x.evaluation import browser  # pylint: disable=g-import-not-at-top
  say = progress or (lambda _: None)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  links: Links = {}
  all_tables = tables(report, links, with_published)
  own = ["report.md", "results.json"] + [f"{name}.csv" for name in all_tables]
  own += [p.name for p in out_dir.glob("*.png") if p.name.startswith(_FIGURE_PREFIXES)]
  check_own_files(out_dir, own)  # before anything is written
  if html_dir is not None:
    check_own_files(pathlib.Path(html_dir), [browser.PAGE])
  say("figures")
  pngs = figures(report, out_dir)
  page_url = None
  if html_dir is not None:
    page_url = pathlib.Path(
        os.path.relpath(pathlib.Path(html_dir).absolute() / browser.PAGE,
                        out_dir.absolute())).as_posix()
  md = ["# MCWQ reproduction report", ""]
  if report.get("warnings"):
    md += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
  if report.get("eval_split", "test") != "test":
    md += [
        f"Scores of the `{report['eval_split']}` predictions (the `dev` part), not the test "
        "part.", ""
    ]
  md += [INTERVAL_NOTE, ""]
  if page_url:
    md += [
        f"Each linked cell opens its examples in the error browser ([{page_url}]({page_url})).", ""
    ]
  sections = []
  for name, (header, rows) in all_tables.items():
    write_csv(out_dir / f"{name}.csv", header, rows)
    digits = 4 if name == "split_divergences" else 1
    shown_header, shown_rows, kept = merge_intervals(header, rows, digits)
    cell_links = [{
        j: browser.fragment(row_links[i]) for j, i in enumerate(kept) if i in row_links
    } for row_links in links.get(name, [{} for _ in rows])]
    md_links = [{
        j: f"{page_url}{f}" for j, f in row.items()
    } for row in cell_links] if page_url else None
    md += [f"## {heading(name)}", "", to_markdown(shown_header, shown_rows, digits, md_links), ""]
    if name in ("table4_monolingual_exact_match", "table5_zeroshot_exact_match"):
      md += [TRAINING_NOTE, ""]
      if with_published and any(str(r[0]).startswith("published:") for r in rows):
        md += [published_note(), ""]
      steps = results_note(report)
      if steps:
        md += [steps, ""]
    sections.append(
        dict(
            name=name,
            heading=heading(name),
            header=shown_header,
            rows=[[fmt(v, digits) for v in row] for row in shown_rows],
            links=cell_links))
  if comparisons:
    md += ["## Paired comparisons", ""] + [f"- {comparison_markdown(c)}" for c in comparisons
                                          ] + [""]
  md += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in pngs] + [""]
  md += ["## Files read", ""] + [
      f"- `{r['path']}`" + (f" lines {r['lines'][0]}-{r['lines'][1]}" if r.get("lines") else "") +
      f": {r['model']} {r['mode']} {r['split']} {r['language']}"
      f"{' gold' if r['gold'] else ''}, n={r['n']}" +
      (f", checkpoint {r['step']}" if r.get("step") is not None else "") for r in report["runs"]
  ] + [""]
  if report["messages"]:
    md += ["## Notes", ""] + [f"- {m}" for m in report["messages"]] + [""]
  md_path = out_dir / "report.md"
  writers.write_atomic(md_path, "\n".join(md))
  public = {k: v for k, v in report.items() if not k.startswith("_")}
  if comparisons:
    public["comparisons"] = list(comparisons)
  writers.write_atomic(out_dir / "results.json",
                       json.dumps(public, indent=2, ensure_ascii=False, default=str) + "\n")
  record_own_files(out_dir, own + [p.name for p in pngs])
  html_path = None
  if html_dir is not None:
    say(f"error browser: {pathlib.Path(html_dir) / browser.PAGE}")
    html_path = browser.write_page(report, html_dir, sections)
    record_own_files(pathlib.Path(html_dir), [browser.PAGE])
  return {"tables": all_tables, "figures": pngs, "markdown": md_path, "html": html_path}


# ----------------------------------------------------------------------------------------------
# Paired comparison of two prediction files.


class ProgressLines:
  """Progress lines on stderr with the seconds since the start: `ProgressLines()(text)`."""

  def __init__(self, stream: Any = None):
    self.start = time.monotonic()
    self.stream = stream

  def __call__(self, text: str) -> None:
    print(
        f"report [{time.monotonic() - self.start:5.1f} s] {text}",
        file=self.stream or sys.stderr,
        flush=True)
