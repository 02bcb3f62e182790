"""Atoms, compounds and their divergence between sets of queries: DBCA (Keysers et al., ICLR 2020).

DBCA ("Measuring Compositional Generalization", §2, App. K/L) compares the distributions of atoms
and compounds of two sets of examples; an MCD split (MCWQ, Cui et al. TACL 2022 §4) has low atom
and maximal compound divergence between train and test. MCWQ publishes no generator DAGs, so
`atoms` and `compounds` are read off the SPARQL query alone (docs/splits.md defines both and how
they approximate Keysers'). `divergence` is D_α(P‖Q) = 1 − Σ_k p_k^α q_k^(1−α) (§2.1), α = 0.5
for atoms and 0.1 for compounds, P the training side. Results are cached per distinct query;
`analyse_many` uses one process per core from `PARALLEL_MIN` distinct queries on.
No TensorFlow or seqio import.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import multiprocessing
import os
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from mcwq_t5x.data import readers
from mcwq_t5x.data import sparql as sparql_lib

#: Keysers et al.'s Chernoff α for the atom and the compound distribution (§2.1).
ALPHA_ATOMS = 0.5
ALPHA_COMPOUNDS = 0.1
#: The largest compound, in edges (triples and filters) of the query graph.
MAX_COMPOUND_SIZE = 3
#: Distinct queries from which `analyse_many` uses worker processes.
PARALLEL_MIN = 20000

_FORMS = {sparql_lib.ASK: "ASK", sparql_lib.SELECT: "SELECT", sparql_lib.COUNT: "COUNT"}


@dataclasses.dataclass(frozen=True)
class QueryStructure:
  """The DBCA view of one query: `atoms` {atom: occurrences}, `compounds` (canonical strings,
  once)."""
  atoms: Mapping[str, int]
  compounds: frozenset[str]


def _answer_variable(prefix: str) -> Optional[str]:
  """`?x0` for `SELECT DISTINCT ?x0 WHERE`; None for ASK and COUNT queries."""
  if prefix.startswith("SELECT DISTINCT "):
    return prefix.split()[2]
  return None


def _role(term: str, answer: Optional[str]) -> str:
  """The anonymised role of a term: `M`, `?ans`, `?v`, or the constant itself."""
  if sparql_lib.is_placeholder(term):
    return "M"
  if sparql_lib.is_variable(term):
    return "?ans" if term == answer else "?v"
  return term


def _form(prefix: str) -> str:
  return _FORMS.get(prefix, "SELECT" if prefix.startswith("SELECT DISTINCT") else prefix)


def _edges(query: sparql_lib.Query) -> list[tuple[str, str, str]]:
  """The distinct edges (s, p, o) of the query graph: triples, then filters as (a, "!=", b) with
  the two terms sorted (a filter is undirected)."""
  triples = sorted(set((t.subject, t.predicate, t.object) for t in query.triples))
  filters = sorted(
      set((min(f.left, f.right), f.op, max(f.left, f.right)) if f.op == "!=" else (f.left, f.op,
                                                                                   f.right)
          for f in query.filters))
  return triples + filters


def _anonymous(term: str) -> bool:
  return sparql_lib.is_variable(term) or sparql_lib.is_placeholder(term)


@functools.lru_cache(maxsize=1 << 20)
def canonical_compound(edges: tuple[tuple[str, str, str], ...], answer: Optional[str]) -> str:
  """The canonical string of a sub-graph, e.g. "M1 wdt:P57 ?v1 . M2 wdt:P57 ?v1".

  Placeholders -> `M1..`, variables -> `?v1..` (`answer` -> `?ans`), constants kept; the least
  sorted edge list over all renumberings of each role's anonymous nodes; `!=` edges undirected.
  """
  groups: dict[str, list[str]] = {"M": [], "?v": []}
  for s, _, o in edges:
    for term in (s, o):
      role = _role(term, answer)
      if role in groups and term not in groups[role]:
        groups[role].append(term)
  best = None
  for perm_m in itertools.permutations(range(1, len(groups["M"]) + 1)):
    for perm_v in itertools.permutations(range(1, len(groups["?v"]) + 1)):
      names = {t: f"M{i}" for t, i in zip(groups["M"], perm_m)}
      names.update({t: f"?v{i}" for t, i in zip(groups["?v"], perm_v)})
      rewritten = []
      for s, p, o in edges:
        s2, o2 = names.get(s, _role(s, answer)), names.get(o, _role(o, answer))
        if p == "!=" and o2 < s2:
          s2, o2 = o2, s2
        rewritten.append(f"{s2} {p} {o2}")
      candidate = tuple(sorted(rewritten))
      if best is None or candidate < best:
        best = candidate
  return " . ".join(best)


def _neighbour_masks(edges: Sequence[tuple[str, str, str]]) -> list[int]:
  """Bit i of entry j is set iff edges i != j share a placeholder or a variable."""
  by_node: dict[str, int] = collections.defaultdict(int)
  for i, (s, _, o) in enumerate(edges):
    for term in (s, o):
      if _anonymous(term):
        by_node[term] |= 1 << i
  masks = [0] * len(edges)
  for i, (s, _, o) in enumerate(edges):
    for term in (s, o):
      masks[i] |= by_node.get(term, 0)
    masks[i] &= ~(1 << i)
  return masks


def _connected_masks(neighbours: Sequence[int], max_size: int) -> list[int]:
  """The connected edge sets of 1..max_size edges as bit masks (each once)."""
  level = [1 << i for i in range(len(neighbours))]
  found = list(level)
  for _ in range(max_size - 1):
    grown = set()
    for mask in level:
      frontier, m = 0, mask
      while m:
        low = m & -m
        frontier |= neighbours[low.bit_length() - 1]
        m ^= low
      frontier &= ~mask
      while frontier:
        low = frontier & -frontier
        grown.add(mask | low)
        frontier ^= low
    level = sorted(grown)
    found.extend(level)
  return found


@functools.lru_cache(maxsize=1 << 18)
def analyse(query: str, max_size: int = MAX_COMPOUND_SIZE) -> QueryStructure:
  """The `QueryStructure` of one CFQ/MCWQ SPARQL query, cached per text; sparql.SparqlParseError."""
  parsed = sparql_lib.parse_sparql(query)
  answer = _answer_variable(parsed.prefix)
  edges = _edges(parsed)
  roles = {term: _role(term, answer) for s, _, o in edges for term in (s, o)}
  atom_counts = collections.Counter({f"form:{_form(parsed.prefix)}": 1})
  for s, p, o in edges:
    if p == "!=":
      atom_counts["filter:" + "!=".join(sorted((roles[s], roles[o])))] += 1
    else:
      atom_counts[f"property:{p}"] += 1
    for term in (s, o):
      if roles[term] == term:
        atom_counts[f"entity:{term}"] += 1
  for term, role in roles.items():
    if role != term:
      atom_counts[f"term:{role}"] += 1
  # Each sub-graph is renamed cheaply first (placeholders and variables other than the answer
  # numbered in order of appearance in its edges sorted by roles), so that the exact canonical
  # form is computed once per shape rather than once per sub-graph.
  edges.sort(key=lambda e: (roles[e[0]], e[1], roles[e[2]]))
  found = set()
  for mask in _connected_masks(_neighbour_masks(edges), max_size):
    names: dict[str, str] = {}
    key = []
    while mask:
      low = mask & -mask
      mask ^= low
      s, p, o = edges[low.bit_length() - 1]
      for term in (s, o):
        if term not in names:
          role = roles[term]
          names[term] = term if role == term or role == "?ans" else f"{role}{len(names)}"
      key.append((names[s], p, names[o]))
    found.add(canonical_compound(tuple(key), answer))
  return QueryStructure(dict(atom_counts), frozenset(found))


def analyse_many(queries: Iterable[str],
                 processes: Optional[int] = None) -> dict[str, QueryStructure]:
  """{query: `analyse(query)`} of every distinct query; sparql.SparqlParseError.

  `processes` default: one per core (at most 4) from `PARALLEL_MIN` distinct queries on.
  """
  distinct = list(dict.fromkeys(queries))
  if processes is None:
    processes = min(4, os.cpu_count() or 1) if len(distinct) >= PARALLEL_MIN else 1
  if processes <= 1:
    return {q: analyse(q) for q in distinct}
  with multiprocessing.get_context("spawn").Pool(processes) as pool:
    chunk = max(1, min(2000, len(distinct) // (4 * processes)))
    return dict(zip(distinct, pool.map(analyse, distinct, chunksize=chunk)))


def atoms(query: str) -> dict[str, int]:
  """The atoms of a query with their numbers of occurrences (module docstring)."""
  return dict(analyse(query).atoms)


def compounds(query: str, max_size: int = MAX_COMPOUND_SIZE) -> frozenset[str]:
  """The compounds of a query: canonical connected sub-graphs of 1..max_size edges."""
  return analyse(query, max_size).compounds


@dataclasses.dataclass
class Distributions:
  """Unnormalised frequencies of a query set: `atoms` summed, `compounds` per containing query,
  `n`."""
  atoms: collections.Counter
  compounds: collections.Counter
  n: int


def distributions(queries: Iterable[str], max_size: int = MAX_COMPOUND_SIZE) -> Distributions:
  """`Distributions` of `queries` (duplicates count each time); sparql.SparqlParseError."""
  atom_counts, compound_counts = collections.Counter(), collections.Counter()
  per_text = collections.Counter(queries)
  analysed = analyse_many(per_text) if max_size == MAX_COMPOUND_SIZE else {}
  for text, k in per_text.items():
    structure = analysed.get(text) or analyse(text, max_size)
    for a, c in structure.atoms.items():
      atom_counts[a] += c * k
    for c in structure.compounds:
      compound_counts[c] += k
  return Distributions(atom_counts, compound_counts, sum(per_text.values()))


def chernoff_coefficient(p: Union[Mapping[str, float], np.ndarray],
                         q: Union[Mapping[str, float], np.ndarray], alpha: float) -> float:
  """Chernoff coefficient C_α(P‖Q) = Σ_k p_k^α q_k^(1−α) in [0, 1] (Keysers et al. 2020, §2.1).

  `p`, `q`: counts (normalised here), both mappings or both arrays over the same keys. 1 iff equal,
  0 iff disjoint (0 < α < 1). ValueError: α outside [0, 1], a negative count, an all-zero side.
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
  if isinstance(p, Mapping) or isinstance(q, Mapping):
    keys = sorted(set(p) | set(q))
    p = np.array([p.get(k, 0.0) for k in keys], dtype=np.float64)
    q = np.array([q.get(k, 0.0) for k in keys], dtype=np.float64)
  p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have one shape, got {p.shape} and {q.shape}")
  if (p < 0).any() or (q < 0).any():
    raise ValueError("frequencies must be non-negative")
  if p.sum() <= 0 or q.sum() <= 0:
    raise ValueError("an empty distribution has no divergence")
  p, q = p / p.sum(), q / q.sum()
  return float(np.sum(np.power(p, alpha) * np.power(q, 1.0 - alpha)))


def divergence(p: Union[Mapping[str, float], np.ndarray], q: Union[Mapping[str, float], np.ndarray],
               alpha: float) -> float:
  """DBCA divergence D_α(P‖Q) = 1 − C_α(P‖Q), in [0, 1] (`chernoff_coefficient`)."""
  return min(1.0, max(0.0, 1.0 - chernoff_coefficient(p, q, alpha)))


@dataclasses.dataclass(frozen=True)
class Divergences:
  """Atom (α = 0.5) and compound (α = 0.1) divergence of a pair of query sets."""
  atom: float
  compound: float


def compare(first: Union[Iterable[str], Distributions],
            second: Union[Iterable[str], Distributions]) -> Divergences:
  """DBCA atom and compound divergence of two query sets (or `Distributions`); `first` is P, the
  training side (compound divergence is asymmetric). ValueError (empty), SparqlParseError."""
  first = first if isinstance(first, Distributions) else distributions(first)
  second = second if isinstance(second, Distributions) else distributions(second)
  return Divergences(
      divergence(first.atoms, second.atoms, ALPHA_ATOMS),
      divergence(first.compounds, second.compounds, ALPHA_COMPOUNDS))


# ------------------------------------------------------------------------------------------
# Reading queries.


def split_queries(split: str,
                  part: str,
                  data_dir: Optional[readers.PathLike] = None,
                  language: Optional[str] = None) -> list[str]:
  """The SPARQL queries of one split/part, whichever layout holds it (`language` only picks the
  file).

  Raises ValueError (unknown split or part), DataNotFoundError.
  """
  language = language or default_language(split, data_dir)
  layout, files = readers.split_files(split, part, language, data_dir)
  if layout == "official":
    examples = readers.read_official(files[0], language, with_rir=False)
  elif layout == "release":
    examples = readers.read_release(files[0].parent, split, part, language, with_rir=False)
  else:
    examples = readers.read_split(split, part, language, data_dir)
  return [e.sparql for e in examples]


def read_query_file(path: readers.PathLike) -> list[str]:
  """The SPARQL queries of `official/` lines, or of one SPARQL or RIR query per line.

  Raises DataNotFoundError, DataFormatError (a line of none of those forms).
  """
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  out = []
  for i, line in enumerate(readers.read_lines(path), start=1):
    if not line.strip():
      continue
    if line.startswith("IN:"):
      sides = readers.split_official_line(line)
      if sides is None:
        raise readers.DataFormatError(path, i, "an `IN:` line without `OUT:`")
      out.append(sides[1])
      continue
    text = " ".join(line.split())
    try:
      sparql_lib.parse_sparql(text)
      out.append(text)
    except sparql_lib.SparqlParseError:
      try:
        out.append(rir.rir_to_sparql(text))
      except ValueError as e:
        raise readers.DataFormatError(path, i, f"neither SPARQL nor RIR: {e}") from e
  return out


def default_language(split: str, data_dir: Optional[readers.PathLike] = None) -> str:
  """The language whose files are read for `split`'s queries: "en" if the split has it, else its
  first language (`readers.discover`); the queries are the same in every language."""
  langs = readers.discover(data_dir).languages_of(split)
  return "en" if "en" in langs else langs[0]


def split_figures(split: str,
                  data_dir: Optional[readers.PathLike] = None,
                  language: Optional[str] = None) -> list[tuple[str, str, int, int, Divergences]]:
  """[(part_a, part_b, size_a, size_b, Divergences)] for every two parts of the split (part_a is P);
  [] for fewer than two. ValueError: unknown split, malformed data."""
  language = language or default_language(split, data_dir)
  parts = readers.available_parts(split, language, data_dir)
  queries = {p: split_queries(split, p, data_dir, language) for p in parts}
  dists = {p: distributions(q) for p, q in queries.items()}
  return [(a, b, len(queries[a]), len(queries[b]), compare(dists[a], dists[b]))
          for a, b in itertools.combinations(parts, 2)]


def split_divergences(split: str,
                      data_dir: Optional[readers.PathLike] = None,
                      language: Optional[str] = None) -> dict[tuple[str, str], Divergences]:
  """{(part_a, part_b): Divergences} of `split_figures`."""
  return {(a, b): d for a, b, _, _, d in split_figures(split, data_dir, language)}
