"""Demonstration selection for in-context semantic parsing.

`METHODS`, each giving pool indices, most relevant first: `random` (seeded per test example);
`similar` (BM25 Okapi, `rank_bm25.BM25Okapi`, over the pool's questions of the same language);
`cover` (Levy et al., ACL 2023, "Diverse Demonstrations Improve In-context Compositional
Generalization", utterance variant: greedy cover of the test question's words and bigrams among
the BM25 top `CANDIDATES`, then BM25); `oracle_compounds` (ORACLE, reads the gold query: greedy
cover of its `divergence.compounds`, then BM25; an upper bound, never a result). Tokens are
lower-cased words, characters for Chinese; placeholders M0..M9 are left out of cover sets.
"""
from __future__ import annotations

import random as random_lib
import re
from typing import Optional, Sequence

import numpy as np
import rank_bm25

from mcwq_t5x.data import divergence

METHODS = ("random", "similar", "cover", "oracle_compounds")
ORACLE_METHODS = ("oracle_compounds",)
#: BM25 candidates the cover methods choose from (Levy et al. restrict the search the same way).
CANDIDATES = 100
_PLACEHOLDER = re.compile(r"^m\d$")
_ZH_TOKEN = re.compile(r"[a-z0-9]+|\S")
_PUNCT = re.compile(r"[\s?.,!;:\"'()，。？！、：；]+")


def tokens(question: str, language: str) -> list[str]:
  """The tokens of a question: lower-cased words, or characters for zh."""
  text = question.lower()
  if language == "zh":  # why: Chinese has no spaces; Latin runs (M0, wdt) stay whole
    return [t for t in _ZH_TOKEN.findall(text) if not _PUNCT.fullmatch(t)]
  return [t for t in _PUNCT.split(text) if t]


def cover_units(question: str, language: str) -> frozenset[str]:
  """Words and bigrams of a question, placeholders left out (what `cover` covers)."""
  toks = tokens(question, language)
  # Placeholders are left out: every question has them.
  units = {t for t in toks if not _PLACEHOLDER.match(t)}
  units.update(f"{a} {b}" for a, b in zip(toks, toks[1:])
               if not (_PLACEHOLDER.match(a) and _PLACEHOLDER.match(b)))
  return frozenset(units)


class Selector:
  """Selects demonstrations from a pool for test questions.

  Args:
    pool_questions: the pool's questions, in the test language (selection reads these).
    pool_queries: the pool's SPARQL queries (for `oracle_compounds`), line-parallel.
    language: the pool's language (tokenisation).
    seed: seed of `random` (each test example draws with `seed` and its index).
  """

  def __init__(self,
               pool_questions: Sequence[str],
               pool_queries: Sequence[str],
               language: str,
               seed: int = 0):
    self.language = language
    self.seed = seed
    self.pool_queries = list(pool_queries)
    self._tokens = [tokens(q, language) for q in pool_questions]
    self._bm25 = rank_bm25.BM25Okapi([t or ["<empty>"] for t in self._tokens])
    self._units = [cover_units(q, language) for q in pool_questions]
    self._compounds: Optional[list[frozenset[str]]] = None

  def _ranked(self, question: str, n: int) -> list[int]:
    scores = self._bm25.get_scores(tokens(question, self.language))
    n = min(n, len(scores))
    top = np.argpartition(-scores, n - 1)[:n]
    return [int(i) for i in sorted(top, key=lambda i: (-scores[i], i))]

  def _greedy(self, goal: frozenset[str], have: Sequence[frozenset[str]], candidates: list[int],
              shots: int, fill: list[int]) -> list[int]:
    chosen: list[int] = []
    left = set(goal)
    while len(chosen) < shots and left:
      best, gain = -1, 0
      for i in candidates:  # why: candidates are in BM25 order, so ties go to the better rank
        g = len(left & have[i])
        if g > gain and i not in chosen:
          best, gain = i, g
      if gain == 0:
        break
      chosen.append(best)
      left -= have[best]
    for i in fill:
      if len(chosen) >= shots:
        break
      if i not in chosen:
        chosen.append(i)
    return chosen

  def select(self,
             method: str,
             question: str,
             shots: int,
             index: int = 0,
             gold_sparql: Optional[str] = None) -> list[int]:
    """Indices of `shots` pool examples for one test question (most relevant first).

    Raises:
      ValueError: unknown method; `oracle_compounds` without `gold_sparql`.
    """
    if method == "random":
      rng = random_lib.Random(f"{self.seed}:{index}")
      return rng.sample(range(len(self._tokens)), min(shots, len(self._tokens)))
    if method == "similar":
      return self._ranked(question, shots)
    if method == "cover":
      ranked = self._ranked(question, CANDIDATES)
      return self._greedy(cover_units(question, self.language), self._units, ranked, shots, ranked)
    if method == "oracle_compounds":
      if gold_sparql is None:
        raise ValueError("oracle_compounds needs the gold query")
      if self._compounds is None:
        self._compounds = [divergence.compounds(q) for q in self.pool_queries]
      goal = divergence.compounds(gold_sparql)
      candidates = [i for i, c in enumerate(self._compounds) if c & goal]
      return self._greedy(goal, self._compounds, candidates, shots, self._ranked(question, shots))
    raise ValueError(f"unknown selection {method!r}; known: {', '.join(METHODS)}")


def compound_coverage(gold_sparql: str, demo_sparql: Sequence[str]) -> float:
  """Share of the gold query's compounds that occur in some demonstration's query, in [0, 1]."""
  goal = divergence.compounds(gold_sparql)
  if not goal:
    return 1.0
  seen: set[str] = set()
  for q in demo_sparql:
    seen |= divergence.compounds(q)
  return len(goal & seen) / len(goal)
