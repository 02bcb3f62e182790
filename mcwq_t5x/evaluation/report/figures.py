"""The report's figures (PNG, matplotlib Agg): error categories (the paper's Figures 5-6),
accuracy by complexity (Figure 4) and exact match by unseen compounds."""
from __future__ import annotations

import pathlib
import re
from typing import Sequence

import numpy as np

from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation.report.common import Report
from mcwq_t5x.evaluation.report.common import title


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_png(fig, path: pathlib.Path) -> None:
  """Writes the matplotlib figure `fig` to `path` as a PNG (100 dpi), whole or not at all
  (`writers.open_atomic`; raises its ResultWriteError), and closes it."""
  try:
    with writers.open_atomic(path, binary=True) as f:
      fig.savefig(f, format="png", dpi=100)
  finally:
    _pyplot().close(fig)  # why: a failed write must not leak the figure


def plot_error_categories(runs: Sequence[dict], title: str, path: pathlib.Path) -> None:
  """Grouped bar chart: number of wrong predictions per error category, one bar per language
  (the paper's Figures 5-6). Exact matches ("correct") are left out."""
  plt = _pyplot()
  categories = metrics.ERROR_ONLY_CATEGORIES
  x = np.arange(len(categories))
  width = 0.8 / max(len(runs), 1)
  fig, ax = plt.subplots(figsize=(11, 4.5))
  for k, r in enumerate(runs):
    counts = [r["error_categories"][c] for c in categories]
    ax.bar(x + (k - (len(runs) - 1) / 2) * width, counts, width, label=r["language"])
  ax.set_xticks(x)
  ax.set_xticklabels([c.replace("_", " ") for c in categories], rotation=30, ha="right")
  ax.set_ylabel("predictions")
  ax.set_title(title)
  ax.legend(title="language")
  fig.tight_layout()
  save_png(fig, path)


def plot_complexity(runs: Sequence[dict], title: str, path: pathlib.Path) -> None:
  """Exact-match accuracy by recursionDepth, one line per language (the paper's Figure 4)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in runs:
    depths = sorted(r["by_complexity"])
    ax.plot(
        depths, [r["by_complexity"][d]["exact_match"] for d in depths],
        marker="o",
        label=r["language"])
  ax.set_xlabel("complexity (recursionDepth)")
  ax.set_ylabel("exact match (%)")
  ax.set_ylim(0, 100)
  ax.set_title(title)
  ax.legend(title="language")
  fig.tight_layout()
  save_png(fig, path)


def figures(report: Report, out_dir: pathlib.Path) -> list[pathlib.Path]:
  """Writes the error-category and complexity figures; returns the PNG paths written.

  Complexity figures are skipped (with a message added to `report["messages"]`) for groups
  without recursionDepth.
  """
  written = []
  groups: dict[tuple, list[dict]] = {}
  for r in report["runs"]:
    groups.setdefault((r["model"], r["mode"], r["split"], r["gold"]), []).append(r)
  for (model, mode, split, gold), runs in sorted(groups.items()):
    # why: a model named apart ("tiny step 400", "tiny (runs/x/eval)") must not make a folder
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model}_{mode}_{split}") + ("-gold" if gold else "")
    test_set = "gold test" if gold else f"{title(split)} {report.get('eval_split', 'test')}"
    path = out_dir / f"errors_{name}.png"
    trained = ("English-trained, zero-shot" if mode == "zeroshot" else "monolingual")
    plot_error_categories(
        runs, f"Error categories: {model} ({trained}), trained on {title(split)}, "
        f"{test_set}", path)
    written.append(path)
    with_depth = [r for r in runs if r["by_complexity"]]
    if with_depth:
      path = out_dir / f"complexity_{name}.png"
      plot_complexity(with_depth, f"Accuracy by complexity: {model} ({mode}), {test_set}", path)
      written.append(path)
    elif not gold:
      report["messages"].append(f"figure complexity_{name}.png skipped: recursionDepth unknown")
  # Exact match by unseen compounds: one figure per mode and split, a line per model and language.
  by_split: dict[tuple, list[dict]] = {}
  for r in report["runs"]:
    if r.get("by_unseen"):
      by_split.setdefault((r["mode"], r["split"]), []).append(r)
  for (mode, split), runs in sorted(by_split.items()):
    models = {r["model"] for r in runs}
    path = out_dir / f"unseen_{mode}_{split}.png"
    eval_split = report.get("eval_split", "test")
    compounds.plot_by_unseen(
        [
            dict(
                label=r["language"] if len(models) == 1 else f"{r['model']} ({r['language']})",
                by_unseen=r["by_unseen"]) for r in runs
        ], f"Exact match by unseen compounds ({mode}), {title(split)} {eval_split}"
        f"{' (' + next(iter(models)) + ')' if len(models) == 1 else ''}; 95% bootstrap intervals",
        path)
    written.append(path)
  return written


# ----------------------------------------------------------------------------------------------
