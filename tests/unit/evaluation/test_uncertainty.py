"""Tests for mcwq_t5x.evaluation.uncertainty: bootstrap intervals of exact match on the published
predictions, the paired comparison, and the interval of several runs."""
import math

import numpy as np
import pytest

from mcwq_t5x.evaluation import uncertainty


def _outcomes(mcwq_dir, mode, lang):
  """Per-example exact match of the paper's published mT5-small predictions on the mcd1 test."""
  gold = (mcwq_dir / f"translations/mcd1/test.{lang}.sparql").read_text().splitlines()
  preds = (
      mcwq_dir /
      f"results/mt5_small/{mode}/mcd1/generated_predictions_{lang}.txt").read_text().splitlines()
  assert len(gold) == len(preds) == 5310
  return np.array([g.strip() == p.strip() for g, p in zip(gold, preds)])


def test_interval_of_the_published_english_exact_match(mcwq_dir):
  """77.6% of 5,310 (4,121 exact matches): the interval holds the paper's figure and matches the
  normal approximation's width, 2 x 1.96 x sqrt(p (1 - p) / n) = 2.24 points."""
  correct = _outcomes(mcwq_dir, "monolingual", "en")
  assert int(correct.sum()) == 4121
  low, high = uncertainty.exact_match_interval([correct])
  assert low < 77.6 < high
  p = correct.mean()
  assert high - low == pytest.approx(2 * 1.96 * 100 * math.sqrt(p * (1 - p) / 5310), abs=0.15)
  assert uncertainty.exact_match_interval([correct]) == (low, high)  # fixed seed


def test_binomial_draws_are_the_bootstrap_of_examples(mcwq_dir):
  """Drawing the resampled count from Binomial(n, k/n) gives the interval that resampling the
  example indices gives (here recomputed the slow way, 2,000 resamples of the 5,310 Hebrew
  outcomes)."""
  correct = _outcomes(mcwq_dir, "monolingual", "he")
  rng = np.random.default_rng(1)
  means = [100 * correct[rng.integers(0, correct.size, correct.size)].mean() for _ in range(2000)]
  slow = np.percentile(means, [2.5, 97.5])
  fast = uncertainty.exact_match_interval([correct])
  np.testing.assert_allclose(fast, slow, atol=0.25)


def test_interval_of_a_mean_over_test_sets(mcwq_dir):
  """The MCD mean's interval: narrower than either set's own, around the mean of the two."""
  en, he = _outcomes(mcwq_dir, "monolingual", "en"), _outcomes(mcwq_dir, "monolingual", "he")
  low, high = uncertainty.exact_match_interval([en, he])
  mean = (en.mean() + he.mean()) * 50
  assert low < mean < high
  for single in ([en], [he]):
    s_low, s_high = uncertainty.exact_match_interval(single)
    assert high - low < s_high - s_low


def test_interval_edge_cases():
  assert uncertainty.exact_match_interval([[]]) is None
  assert uncertainty.exact_match_interval([]) is None
  assert uncertainty.exact_match_interval([[True] * 10]) == (100.0, 100.0)
  with pytest.raises(ValueError, match="0/1"):
    uncertainty.exact_match_interval([[0, 2, 1]])
  with pytest.raises(ValueError, match="1-D"):
    uncertainty.exact_match_interval([[[1, 0]]])


def test_paired_comparison_on_the_published_predictions(mcwq_dir):
  """Hebrew, monolingual (57.8) against zero-shot from English (0.4): 3,071 and 19 exact matches."""
  mono = _outcomes(mcwq_dir, "monolingual", "he")
  zero = _outcomes(mcwq_dir, "zeroshot", "he")
  c = uncertainty.paired_comparison(mono, zero)
  assert (c.n, c.only_a + c.both, c.only_b + c.both) == (5310, 3071, 19)
  assert c.only_a + c.only_b + c.both + c.neither == 5310
  assert c.difference == pytest.approx(100 * (3071 - 19) / 5310)
  assert c.interval[0] < c.difference < c.interval[1]
  assert c.p_value < 1e-100


def test_paired_permutation_test_is_exact():
  """8 examples only A gets right, 1 only B: two-sided p = 2 (C(9,0) + C(9,1)) / 2^9 = 20/512."""
  a = [1] * 8 + [0] + [1] * 5 + [0] * 6
  b = [0] * 8 + [1] + [1] * 5 + [0] * 6
  c = uncertainty.paired_comparison(a, b)
  assert (c.only_a, c.only_b, c.both, c.neither) == (8, 1, 5, 6)
  assert c.p_value == pytest.approx(20 / 512)
  same = uncertainty.paired_comparison(a, a)
  assert (same.difference, same.p_value, same.interval) == (0.0, 1.0, (0.0, 0.0))


def test_paired_comparison_needs_the_same_examples():
  with pytest.raises(ValueError, match="differ in length"):
    uncertainty.paired_comparison([1, 0, 1], [1, 0])
  with pytest.raises(ValueError, match="no examples"):
    uncertainty.paired_comparison([], [])


def test_runs_interval():
  """Three runs at 10, 12 and 14: mean 12, s = 2, half width t(0.975, 2) x 2 / sqrt(3) with
  t(0.975, 2) = 4.302653 (Student's t table)."""
  mean, half = uncertainty.runs_interval([10.0, 12.0, 14.0])
  assert mean == pytest.approx(12.0)
  assert half == pytest.approx(4.302653 * 2 / math.sqrt(3), rel=1e-5)
  assert uncertainty.runs_interval([55.0]) == (55.0, None)
  with pytest.raises(ValueError, match="no runs"):
    uncertainty.runs_interval([])
