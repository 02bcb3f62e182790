"""The paired comparison of two prediction files on the same examples (`compare`)."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional

from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x.evaluation import uncertainty
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.discovery import place
from mcwq_t5x.evaluation.report.gold import GoldLoader


def compare(file_a: str | pathlib.Path,
            file_b: str | pathlib.Path,
            targets_dir: str | pathlib.Path,
            data_dir: Optional[str | pathlib.Path] = None,
            gold_file: Optional[str | pathlib.Path] = None) -> dict[str, Any]:
  """Paired comparison (`uncertainty.paired_comparison`) of two prediction files on the same
  examples.

  Each file is placed as `discover` places it unless `gold_file` (RIR, one per line) is given.
  Returns {"a", "b", "gold", "n", "exact_match_a", "exact_match_b", "difference", "interval",
  "only_a", "only_b", "both", "neither", "p_value", "n_resamples", "seed", "confidence"}. Raises
  score.InputError: a missing file, lengths that differ, or different test sets.
  """
  paths = [pathlib.Path(file_a), pathlib.Path(file_b)]
  for p in paths:
    if not p.is_file():
      raise score_lib.InputError(f"{p}: no such prediction file")
  if gold_file is not None:
    gold_path = pathlib.Path(gold_file)
    targets = score_lib.load_targets(gold_path)
    source = str(gold_path)
  else:
    targets_dir = pathlib.Path(targets_dir)
    loader = GoldLoader(targets_dir,
                        pathlib.Path(data_dir) if data_dir is not None else targets_dir.parent)
    placed = [place(p) for p in paths]
    sets = [(GOLD if f.gold else f.split, f.language) for f in placed]
    if sets[0] != sets[1]:
      raise score_lib.InputError(
          f"{paths[0]} is a prediction file of {'/'.join(sets[0])} and {paths[1]} of "
          f"{'/'.join(sets[1])}: a paired comparison needs the same examples (name the gold "
          "file with --compare_gold if both are of one test set)")
    gold_set = loader.get(*sets[0])
    if gold_set is None:
      raise score_lib.InputError(f"no gold queries for {'/'.join(sets[0])}: "
                                 f"{'; '.join(loader.messages)}")
    targets, source = gold_set.targets, gold_set.source
  preds = [readers.read_lines(p, strict=False) for p in paths]
  for p, lines in zip(paths, preds):
    score_lib.check_same_length("predictions", p, lines, "targets", source, targets)
  c = uncertainty.paired_comparison(
      metrics.exact_matches(targets, preds[0]), metrics.exact_matches(targets, preds[1]))
  result = dataclasses.asdict(c)
  result["interval"] = list(c.interval)
  return dict(a=str(paths[0]), b=str(paths[1]), gold=source, **result)
