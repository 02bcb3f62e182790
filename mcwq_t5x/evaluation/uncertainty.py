"""Uncertainty of exact match: bootstrap confidence intervals, a paired test between two systems,
and the spread of several runs (seeds) of one configuration.

Exact match is the mean of per-example outcomes in {0, 1} (an example is right or wrong), so its
sampling distribution depends on the test set only through n (examples) and k (exact matches):

  * **Bootstrap interval** (`exact_match_interval`; Efron & Tibshirani 1993, the percentile
    method): resampling the n examples with replacement gives a number of exact matches that is
    Binomial(n, k/n); it is drawn from that distribution directly, which is the same
    bootstrap as drawing example indices, at the cost of one number per resample. The interval is
    the 2.5th and 97.5th percentiles of `N_RESAMPLES` (10,000) resampled exact matches, from the
    fixed seed `SEED` (0): the same input always gives the same interval. For a mean over several
    test sets (the "MCD mean" of the MCD splits), each test set is resampled independently and the
    interval is that of the mean of the resampled exact matches. Where no example or every
    example is right (0 or 100%), every resample is the same and the interval is that one point:
    the bootstrap cannot say more about such a set.
  * **Paired comparison** (`paired_comparison`) of two systems on the same examples (line-parallel
    predictions with the same gold queries): only the examples on which they disagree (one right,
    the other wrong) carry information. The paired bootstrap resamples the examples (a
    Multinomial(n, cell proportions) draw of the 2x2 table's four cells, the same as drawing
    indices) and gives the 95% percentile interval of the difference in exact match (A - B); the
    permutation test swaps the two systems' outcomes on each example with probability 1/2 (the
    paired, "samples" permutation test): under it the number of A-only examples among the m
    disagreements is Binomial(m, 1/2), so the two-sided p-value is computed exactly (it equals
    the exact McNemar test; `scipy.stats.binomtest`) instead of by random permutations.
  * **Several runs** (`runs_interval`): the mean exact match of r runs of one configuration
    (different seeds) with the 95% Student-t interval mean ± t(0.975, r - 1) · s / sqrt(r) (s:
    the sample standard deviation of the r exact matches), the form of the CFQ leaderboard's
    "mean ± 95% confidence interval over 5 runs" (Keysers et al., ICLR 2020). It measures the
    spread between runs (initialisation, data order), which the bootstrap over test examples does
    not; with one run there is no interval.

All values are percentages (0-100). This module imports numpy, and scipy inside the functions that
need it.
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
  """Percentile bootstrap interval of the exact match of one test set, or of the mean exact match
  of several (each resampled independently; module docstring).

  Args:
    correct: one sequence of per-example outcomes (bool or 0/1, length n_i) per test set.
    n_resamples: bootstrap resamples (>= 1,000 for a 95% interval).
    confidence: the interval's level, in (0, 1).
    seed: seed of the random generator (`numpy.random.default_rng`).

  Returns:
    (low, high) in percent (0-100), or None when a test set is empty or none is given.

  Raises:
    ValueError: outcomes that are not a 1-D 0/1 sequence, `n_resamples` < 1 or `confidence`
      outside (0, 1).
  """
  if n_resamples < 1:
    raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  sets = [_outcomes(c, f"test set #{i + 1}") for i, c in enumerate(correct)]
  if not sets or any(s.size == 0 for s in sets):
    return None
  rng = np.random.default_rng(seed)
  total = np.zeros(n_resamples)
  for s in sets:
    n, k = s.size, int(s.sum())
    total += 100.0 * rng.binomial(n, k / n, size=n_resamples) / n
  return _percentiles(total / len(sets), confidence)


@dataclasses.dataclass(frozen=True)
class PairedComparison:
  """Two systems' exact match on the same n examples (`paired_comparison`).

  Attributes:
    n: examples.
    exact_match_a, exact_match_b: exact match of A and of B (percent).
    difference: exact_match_a - exact_match_b (percentage points).
    interval: the paired bootstrap's percentile interval of the difference (points).
    only_a, only_b: examples that only A, only B gets right (the disagreements).
    both, neither: examples both, neither get right.
    p_value: two-sided p-value of the paired permutation test (exact; module docstring).
    n_resamples, seed, confidence: the bootstrap's settings.
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
  """Paired bootstrap interval and permutation test of the difference in exact match between two
  systems on the same examples (module docstring).

  Args:
    correct_a, correct_b: per-example outcomes of systems A and B on the same n examples, in the
      same order (bool or 0/1).
    n_resamples, confidence, seed: as `exact_match_interval`.

  Returns:
    A `PairedComparison`.

  Raises:
    ValueError: the two have different lengths, are empty, or are not 0/1 sequences.
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
  draws = rng.multinomial(n, cells / n, size=n_resamples)
  differences = 100.0 * (draws[:, 1] - draws[:, 2]) / n
  only_a, only_b = int(cells[1]), int(cells[2])
  m = only_a + only_b
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
  """Mean and Student-t half-width of several runs' exact matches (module docstring).

  Args:
    values: one exact match (percent) per run.
    confidence: the interval's level, in (0, 1).

  Returns:
    (mean, half width): the interval is mean ± half width; the half width is None for one run.

  Raises:
    ValueError: no values, a value that is not finite, or `confidence` outside (0, 1).
  """
  if not values:
    raise ValueError("no runs")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  array = np.asarray(values, dtype=np.float64)
  if not np.isfinite(array).all():
    raise ValueError(f"exact matches must be finite numbers, got {list(values)}")
  mean = float(array.mean())
  if array.size < 2:
    return mean, None
  from scipy import stats  # pylint: disable=g-import-not-at-top
  t = float(stats.t.ppf(0.5 + confidence / 2.0, array.size - 1))
  return mean, t * float(array.std(ddof=1)) / math.sqrt(array.size)
