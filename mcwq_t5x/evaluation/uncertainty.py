"""Uncertainty of exact match: bootstrap confidence intervals, a paired test between two systems,
and the spread of several runs (seeds) of one configuration.

Percentile bootstrap (Efron & Tibshirani 1993) with `N_RESAMPLES` resamples from the fixed `SEED`
(the same input always gives the same interval); the paired permutation test is exact (the exact
McNemar test); several runs get the Student-t interval of the CFQ leaderboard ("mean ± 95%
confidence interval over 5 runs", Keysers et al., ICLR 2020), which measures the spread between
seeds that the bootstrap over test examples does not. All values are percentages (0-100).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

#: Resamples of every bootstrap, and the seed of its random generator.
N_RESAMPLES = 10_000
SEED = 0
#: Confidence level of every interval.
CONFIDENCE = 0.95


def _outcomes(correct: Sequence[bool] | np.ndarray, name: str = "outcomes") -> np.ndarray:
  """A 1-D boolean array of per-example outcomes; raises ValueError on anything else."""
  array = np.asarray(correct)
  if array.ndim != 1:
    raise ValueError(f"{name}: expected a 1-D sequence of per-example outcomes, got shape "
                     f"{array.shape}")
  if array.size and not (array.dtype == bool or np.isin(array, (0, 1)).all()):
    raise ValueError(f"{name}: per-example outcomes must be 0/1 or booleans")
  return array.astype(bool)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
  tail = 100.0 * (1.0 - confidence) / 2.0
  low, high = np.percentile(values, [tail, 100.0 - tail])
  return float(low), float(high)


def exact_match_interval(correct: Sequence[Sequence[bool] | np.ndarray],
                         n_resamples: int = N_RESAMPLES,
                         confidence: float = CONFIDENCE,
                         seed: int = SEED) -> Optional[tuple[float, float]]:
  """(low, high) percent: the percentile bootstrap interval of the exact match of one test set, or
  of the mean over several (the "MCD mean"), each resampled independently; None if any set is empty.

  `correct`: per test set, 1-D outcomes (bool or 0/1). Raises ValueError on non-0/1 outcomes,
  `n_resamples` < 1, or `confidence` outside (0, 1).
  """
  if n_resamples < 1:
    raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  sets = [_outcomes(c, f"test set #{i + 1}") for i, c in enumerate(correct)]
  # At 0 or 100% every resample is the same: the interval is that one point.
  if not sets or any(s.size == 0 for s in sets):
    return None
  rng = np.random.default_rng(seed)
  total = np.zeros(n_resamples)
  for s in sets:
    n, k = s.size, int(s.sum())
    # why: resampling n examples gives Binomial(n, k/n) matches: the same bootstrap, one draw per
    # resample.
    total += 100.0 * rng.binomial(n, k / n, size=n_resamples) / n
  return _percentiles(total / len(sets), confidence)


@dataclasses.dataclass(frozen=True)
class PairedComparison:
  """Two systems' exact match on the same n examples (`paired_comparison`), in percent.

  `difference` = A - B and its bootstrap `interval` are in points; `only_a`, `only_b`, `both`,
  `neither` count examples; `p_value` is the exact two-sided paired permutation test.
  """
  n: int
  exact_match_a: float
  exact_match_b: float
  difference: float
  interval: tuple[float, float]
  only_a: int
  only_b: int
  both: int
  neither: int
  p_value: float
  n_resamples: int
  seed: int
  confidence: float


def paired_comparison(correct_a: Sequence[bool] | np.ndarray,
                      correct_b: Sequence[bool] | np.ndarray,
                      n_resamples: int = N_RESAMPLES,
                      confidence: float = CONFIDENCE,
                      seed: int = SEED) -> PairedComparison:
  """Paired bootstrap interval and exact permutation test of exact match A - B on the same examples.

  `correct_a`, `correct_b`: line-parallel outcomes (bool or 0/1), length n. Raises ValueError on
  different lengths, no examples, or non-0/1 outcomes.
  """
  a, b = _outcomes(correct_a, "system A"), _outcomes(correct_b, "system B")
  if a.size != b.size:
    raise ValueError(f"the two systems' outcomes differ in length ({a.size} and {b.size}): a "
                     "paired comparison needs the same examples")
  if a.size == 0:
    raise ValueError("no examples to compare")
  from scipy import stats  # pylint: disable=g-import-not-at-top
  n = a.size
  cells = np.array([np.sum(a & b), np.sum(a & ~b), np.sum(~a & b), np.sum(~a & ~b)])
  rng = np.random.default_rng(seed)
  # why: resampling examples is a Multinomial draw of the 2x2 table's four cells.
  draws = rng.multinomial(n, cells / n, size=n_resamples)
  differences = 100.0 * (draws[:, 1] - draws[:, 2]) / n
  only_a, only_b = int(cells[1]), int(cells[2])
  m = only_a + only_b
  # Swapping A and B per example with p 1/2 makes the A-only count of the m disagreements
  # Binomial(m, 1/2): exact p (McNemar), no random permutations.
  p_value = 1.0 if m == 0 else float(stats.binomtest(only_a, m, 0.5).pvalue)
  return PairedComparison(
      n=n,
      exact_match_a=100.0 * float(a.mean()),
      exact_match_b=100.0 * float(b.mean()),
      difference=100.0 * (only_a - only_b) / n,
      interval=_percentiles(differences, confidence),
      only_a=only_a,
      only_b=only_b,
      both=int(cells[0]),
      neither=int(cells[3]),
      p_value=p_value,
      n_resamples=n_resamples,
      seed=seed,
      confidence=confidence)


def runs_interval(values: Sequence[float],
                  confidence: float = CONFIDENCE) -> tuple[float, Optional[float]]:
  """(mean, half width) of r runs' exact matches (percent): Student-t, t(0.975, r-1) · s / sqrt(r).

  The half width is None for one run. Raises ValueError: no values, a non-finite value, or
  `confidence` outside (0, 1).
  """
  if not values:
    raise ValueError("no runs")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  array = np.asarray(values, dtype=np.float64)
  if not np.isfinite(array).all():
    raise ValueError(f"exact matches must be finite numbers, got {list(values)}")
  # The spread between seeds (initialisation, data order), which the bootstrap does not see.
  mean = float(array.mean())
  if array.size < 2:
    return mean, None
  from scipy import stats  # pylint: disable=g-import-not-at-top
  t = float(stats.t.ppf(0.5 + confidence / 2.0, array.size - 1))
  return mean, t * float(array.std(ddof=1)) / math.sqrt(array.size)
