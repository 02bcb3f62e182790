"""A small model of the SPARQL queries of CFQ and MCWQ.

MCWQ queries (Cui et al., TACL 2022, §3) are conjunctive queries over Wikidata on one line:

  ASK WHERE { M0 wdt:P57 ?x0 . ?x0 wdt:P27 wd:Q30 . FILTER ( ?x0 != M1 ) }
  SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P106 wd:Q2526255 . ?x0 wdt:P750|wdt:P272 M0 }

Terms are separated by single spaces, clauses by ` . `; a clause is `subject predicate object` or
`FILTER ( a != b )`. Terms: variables (`?x0`), placeholders (`M0`..`M9`), entities (`wd:Q30`),
prefixed names or IRIs; predicates: `wdt:P57`, alternatives `wdt:P750|wdt:P272`, or `a`. CFQ
(Keysers et al., ICLR 2020) has Freebase names and `SELECT count(*) WHERE` (MCWQ: `ASK WHERE`).
`Query.canonical` compares queries up to clause order and duplicates (query equivalence).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional, Sequence, Union

ASK = "ASK WHERE"
SELECT = "SELECT DISTINCT ?x0 WHERE"
COUNT = "SELECT count(*) WHERE"
PREFIXES = (ASK, SELECT, COUNT)

_VARIABLE_RE = re.compile(r"^\?[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"^M[0-9]+$")
_WIKIDATA_ENTITY_RE = re.compile(r"^wd:Q[0-9]+$")
_PREFIXED_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*:[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_IRI_RE = re.compile(r"^<[^<>\"{}|^`\\\s]*>$")
_STRUCTURAL = frozenset({"{", "}", ".", "(", ")", "FILTER", "!=", ",", "WHERE"})


class SparqlParseError(ValueError):
  """A query that does not follow the CFQ/MCWQ SPARQL syntax described in the module docstring."""


def is_variable(term: str) -> bool:
  """True for SPARQL variables such as `?x0`."""
  return bool(_VARIABLE_RE.match(term))


def is_placeholder(term: str) -> bool:
  """True for MCWQ/CFQ entity placeholders `M0`, `M1`, ... (questionPatternModEntities)."""
  return bool(_PLACEHOLDER_RE.match(term))


def is_constant_entity(term: str) -> bool:
  """True for constant entities: Wikidata `wd:Q…` items, other prefixed names and IRIs (not variables,
  not placeholders)."""
  return not is_variable(term) and not is_placeholder(term) and _is_named_term(term)


def is_entity(term: str) -> bool:
  """True for the terms the paper's error analysis (§6.2) counts as entities: placeholders and
  constants such as `wd:Q6581097`."""
  return is_placeholder(term) or is_constant_entity(term)


def _is_named_term(term: str) -> bool:
  return bool(_PREFIXED_NAME_RE.match(term) or _IRI_RE.match(term))


def is_term(term: str) -> bool:
  """True for anything allowed as a triple's subject or object."""
  return is_variable(term) or is_placeholder(term) or _is_named_term(term)


def is_predicate(term: str) -> bool:
  """True for a predicate: `a`, a prefixed name / IRI, or an alternative path `p1|p2|…` of those."""
  if term == "a":
    return True
  return all(_is_named_term(part) for part in term.split("|"))


@dataclasses.dataclass(frozen=True, order=True)
class Triple:
  """One triple pattern `subject predicate object` (all strings, as written in the query)."""
  subject: str
  predicate: str
  object: str

  def to_sparql(self) -> str:
    """The triple as written in a query body, e.g. `M0 wdt:P57 ?x0` (terms joined by spaces)."""
    return f"{self.subject} {self.predicate} {self.object}"


@dataclasses.dataclass(frozen=True, order=True)
class Filter:
  """A filter `FILTER ( left op right )` (CFQ/MCWQ use only `!=`; other comparisons parse alike)."""
  left: str
  op: str
  right: str

  def to_sparql(self) -> str:
    """The filter in MCWQ spelling, e.g. `FILTER ( ?x0 != M1 )` (spaces around every token)."""
    comparison = f"{self.left} {self.op} {self.right}"
    return f"FILTER ( {comparison} )"


Clause = Union[Triple, Filter]


@dataclasses.dataclass(frozen=True)
class Query:
  """A parsed query: `prefix` (of `PREFIXES`), `triples` (duplicates kept) and `filters`, in
  order."""
  prefix: str
  triples: tuple[Triple, ...]
  filters: tuple[Filter, ...] = ()

  def canonical(self) -> tuple:
    """A hashable key equal iff same prefix and same SETS of triples and of filters (`a != b` is
    `b != a`); repeats do not change a conjunctive query's answers, though the published RIR
    writes a repeated triple twice."""
    filters = frozenset(
        (f.op,) + tuple(sorted((f.left, f.right))) if f.op == "!=" else (f.op, f.left, f.right)
        for f in self.filters)
    return (self.prefix, frozenset(self.triples), filters)

  def equivalent(self, other: Optional["Query"]) -> bool:
    """Query equivalence: True iff `other` is a query (not None) with the same `canonical` form."""
    return other is not None and self.canonical() == other.canonical()

  def to_sparql(self) -> str:
    """The query on one line in MCWQ formatting: triples first, then filters."""
    clauses = [t.to_sparql() for t in self.triples] + [f.to_sparql() for f in self.filters]
    return f"{self.prefix} {{ " + " . ".join(clauses) + " }"

  def properties(self) -> list[str]:
    """Predicates in triple order (duplicates kept), e.g. ["wdt:P57", "wdt:P27"]."""
    return [t.predicate for t in self.triples]

  def entities(self, include_filters: bool = False) -> list[str]:
    """Placeholders and constants (`wd:Q30`) as triple subject/object, in order (duplicates
    kept); with `include_filters` then the filters' (the entity set of the paper's error
    analysis, §6.2)."""
    terms = [term for t in self.triples for term in (t.subject, t.object)]
    if include_filters:
      terms += [term for f in self.filters for term in (f.left, f.right)]
    return [term for term in terms if is_entity(term)]

  def variables(self) -> list[str]:
    """Distinct variables in order of first occurrence."""
    seen: dict[str, None] = {}
    for t in self.triples:
      for term in (t.subject, t.object):
        if is_variable(term):
          seen.setdefault(term)
    for f in self.filters:
      for term in (f.left, f.right):
        if is_variable(term):
          seen.setdefault(term)
    return list(seen)

  @classmethod
  def from_clauses(cls, prefix: str, clauses: Iterable[Clause]) -> "Query":
    """Builds a query from an ordered list of triples and filters."""
    clauses = list(clauses)
    return cls(prefix, tuple(c for c in clauses if isinstance(c, Triple)),
               tuple(c for c in clauses if isinstance(c, Filter)))


def split_prefix(tokens: Sequence[str], open_token: str) -> tuple[str, int]:
  """(prefix, index of the body's opening token: `{` in SPARQL, `lb` in RIR) of `tokens`.

  SparqlParseError: no opening token, or an unknown query form.
  """
  try:
    open_at = list(tokens).index(open_token)
  except ValueError:
    raise SparqlParseError(f"no '{open_token}' opening the query body") from None
  prefix = " ".join(tokens[:open_at])
  if prefix == "SELECT count ( * ) WHERE":
    prefix = COUNT
  if prefix not in PREFIXES and not re.fullmatch(r"SELECT DISTINCT \?[A-Za-z0-9_]+ WHERE", prefix):
    raise SparqlParseError(f"unknown query form {prefix!r}; expected one of {PREFIXES}")
  return prefix, open_at


def parse_clause(tokens: Sequence[str]) -> Clause:
  """A `Triple` or `Filter` of one clause's tokens; SparqlParseError for anything else."""
  tokens = list(tokens)
  if tokens and tokens[0] == "FILTER":
    if (len(tokens) != 6 or tokens[1] != "(" or tokens[5] != ")" or tokens[3] != "!=" or
        not is_term(tokens[2]) or not is_term(tokens[4])):
      raise SparqlParseError(f"malformed filter {' '.join(tokens)!r}; expected 'FILTER ( a != b )'")
    return Filter(tokens[2], tokens[3], tokens[4])
  if len(tokens) != 3:
    raise SparqlParseError(f"a triple needs 3 terms, got {len(tokens)}: {' '.join(tokens)!r}")
  subject, predicate, obj = tokens
  if not is_term(subject):
    raise SparqlParseError(f"bad subject {subject!r}")
  if not is_predicate(predicate):
    raise SparqlParseError(f"bad predicate {predicate!r}")
  if not is_term(obj):
    raise SparqlParseError(f"bad object {obj!r}")
  return Triple(subject, predicate, obj)


def parse_clauses(text: str) -> tuple[str, list[Clause]]:
  """(prefix, clauses in order) of a one-line query (`count(*)` may be `count ( * )`).

  SparqlParseError with a message saying what is wrong.
  """
  if not isinstance(text, str):
    raise SparqlParseError(f"expected a string, got {type(text).__name__}")
  tokens = text.split()
  if not tokens:
    raise SparqlParseError("empty query")
  prefix, open_at = split_prefix(tokens, "{")
  if tokens[-1] != "}":
    raise SparqlParseError("query does not end with '}'")
  body = tokens[open_at + 1:-1]
  if "{" in body or "}" in body:
    raise SparqlParseError("nested or unbalanced braces")
  clauses: list[Clause] = []
  current: list[str] = []
  for token in body + ["."]:
    if token == ".":
      if not current:
        raise SparqlParseError("empty clause (two '.' in a row, or a '.' at the start or end)")
      clauses.append(parse_clause(current))
      current = []
    else:
      current.append(token)
  return prefix, clauses


def parse_sparql(text: str) -> Query:
  """The `Query` of a CFQ/MCWQ SPARQL string; SparqlParseError for anything else."""
  prefix, clauses = parse_clauses(text)
  return Query.from_clauses(prefix, clauses)
