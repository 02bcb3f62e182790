"""The reversible intermediate representation (RIR) of MCWQ queries (`python -m mcwq_t5x.rir`).

Herzig et al. (2021), "Unlocking Compositional Generalization in Pre-trained Models Using
Intermediate Representations": braces become the words `lb` and `rb`, and all triples of one
subject whose predicates share an object list become one group `( S ( r1 , r2 ) ( o1 , o2 ) )`,
standing for every triple `S ri oj`; filters stay `( FILTER ( a != b ) )`. MCWQ (Cui et al., TACL
2022, §5) trains and scores on this form. The grouping reproduces the published
`translations/{split}/{part}.{lang}.sparql` byte for byte (all 188,672 dev/test lines):

  ASK WHERE { M0 wdt:P57 ?x0 . M0 wdt:P58 ?x0 . ?x0 wdt:P27 wd:Q30 . FILTER ( ?x0 != M1 ) }
  ASK WHERE lb ( M0 ( wdt:P57 , wdt:P58 ) ( ?x0 ) ) . ( ?x0 ( wdt:P27 ) ( wd:Q30 ) ) . ( FILTER ( ?x0 != M1 ) ) rb
"""

from __future__ import annotations

import collections
from typing import Sequence

from mcwq_t5x.data import sparql as sparql_lib

LB = "lb"
RB = "rb"

#: The most triples one group may stand for (predicates x objects). The largest group of all
#: 188,672 dev/test queries of the four splits (../shared/mcwq/official/*/*.txt) stands for 15
#: (3 x 5, mcd1/test.en line 1509); a predicted group beyond this bound is malformed and refused
#: before it is expanded (a 3,000 x 3,000 group would be 9 million triples).
MAX_GROUP_TRIPLES = 1000


class RIRError(ValueError):
  """A string that is not a well-formed RIR query (typically a malformed model prediction)."""


def _subject_groups(subject: str,
                    triples: Sequence[tuple[int, sparql_lib.Triple]]) -> list[tuple[int, str]]:
  """RIR groups of one subject's (position, triple) pairs: (position of the group's first triple,
  `( S ( r1 , r2 ) ( o1 , o2 ) )`)."""
  objects_of: dict[str, list[str]] = {}
  first_of: dict[str, int] = {}
  for position, t in triples:
    # why repetitions kept: the release writes `M2 wdt:P108 M1 . M2 wdt:P108 M1` as `( M2 ( wdt:P108
    # ) ( M1 , M1 ) )` (random_split/test line 388).
    objects_of.setdefault(t.predicate, []).append(t.object)
    first_of.setdefault(t.predicate, position)
  # (first position, predicates, objects, objects as a multiset)
  groups: list[tuple[int, list[str], list[str], collections.Counter]] = []
  for predicate, objs in objects_of.items():
    counts = collections.Counter(objs)
    for i, (first, preds, group_objs, group_counts) in enumerate(groups):
      # Object lists compared as multisets, merged in order of first appearance; the release never
      # merges a predicate with a repeated object, so counting repetitions is our choice: the one
      # that keeps `rir_to_clauses` the exact inverse.
      if group_counts == counts:
        preds.append(predicate)
        groups[i] = (min(first, first_of[predicate]), preds, group_objs, group_counts)
        break
    else:
      groups.append((first_of[predicate], [predicate], objs, counts))
  return [(first, f"( {subject} ( {' , '.join(preds)} ) ( {' , '.join(objs)} ) )")
          for first, preds, objs, _ in groups]


def query_to_rir(prefix: str, clauses: Sequence[sparql_lib.Clause]) -> str:
  """RIR of a query given as its prefix and ordered clauses (`sparql.parse_clauses`)."""
  units: list[tuple[int, str]] = []  # (position of the unit's first clause, RIR text)
  triples_of: dict[str, list[tuple[int, sparql_lib.Triple]]] = {}
  seen_filters: set[sparql_lib.Filter] = set()
  for position, clause in enumerate(clauses):
    if isinstance(clause, sparql_lib.Filter):
      if clause not in seen_filters:  # A repeated filter is written once.
        seen_filters.add(clause)
        units.append((position, f"( {clause.to_sparql()} )"))
    else:
      triples_of.setdefault(clause.subject, []).append((position, clause))
  for subject, triples in triples_of.items():
    units.extend(_subject_groups(subject, triples))
  # Units appear in the order of their first clause in the query.
  units.sort(key=lambda unit: unit[0])
  return f"{prefix} {LB} " + " . ".join(text for _, text in units) + f" {RB}"


def sparql_to_rir(sparql: str) -> str:
  """RIR of a one-line CFQ/MCWQ SPARQL query; sparql.SparqlParseError for anything else.

  "ASK WHERE { M0 wdt:P57 ?x0 }" -> "ASK WHERE lb ( M0 ( wdt:P57 ) ( ?x0 ) ) rb".
  """
  prefix, clauses = sparql_lib.parse_clauses(sparql)
  return query_to_rir(prefix, clauses)


def _split_top_level(tokens: list[str], sep: str, what: str) -> list[list[str]]:
  """Splits a token list at `sep` tokens outside parentheses."""
  parts: list[list[str]] = [[]]
  depth = 0
  for token in tokens:
    if token == "(":
      depth += 1
    elif token == ")":
      depth -= 1
      if depth < 0:
        raise RIRError(f"unbalanced ')' in {what}")
    if token == sep and depth == 0:
      parts.append([])
    else:
      parts[-1].append(token)
  if depth != 0:
    raise RIRError(f"unbalanced '(' in {what}")
  return parts


def _parse_list(tokens: list[str], what: str) -> list[str]:
  """`( a , b , c )` -> [a, b, c]."""
  if len(tokens) < 3 or tokens[0] != "(" or tokens[-1] != ")":
    raise RIRError(f"expected '( … )' for the {what}, got {' '.join(tokens)!r}")
  items = tokens[1:-1]
  if len(items) % 2 == 0 or any(tok != "," for tok in items[1::2]):
    raise RIRError(f"malformed {what} list {' '.join(tokens)!r}")
  return items[0::2]


def _parse_unit(tokens: list[str]) -> list[sparql_lib.Clause]:
  """One RIR unit -> its clauses (the triples it stands for, or a filter)."""
  text = " ".join(tokens)
  if len(tokens) < 2 or tokens[0] != "(" or tokens[-1] != ")":
    raise RIRError(f"a group must be enclosed in '( … )': {text!r}")
  inner = tokens[1:-1]
  if inner and inner[0] == "FILTER":
    try:
      return [sparql_lib.parse_clause(inner)]
    except sparql_lib.SparqlParseError as e:
      raise RIRError(str(e)) from None
  if not inner:
    raise RIRError("empty group '( )'")
  subject = inner[0]
  rest = inner[1:]
  if rest.count("(") != 2 or rest[0] != "(":
    raise RIRError(f"a group needs a subject, a predicate list and an object list: {text!r}")
  close = rest.index(")")
  predicates = _parse_list(rest[:close + 1], "predicate")
  objects = _parse_list(rest[close + 1:], "object")
  if len(predicates) * len(objects) > MAX_GROUP_TRIPLES:  # before the quadratic expansion
    raise RIRError(f"a group of {len(predicates)} predicates x {len(objects)} objects stands for "
                   f"{len(predicates) * len(objects)} triples, more than {MAX_GROUP_TRIPLES} "
                   f"(rir.MAX_GROUP_TRIPLES), in the group of {subject}")
  if not sparql_lib.is_term(subject):
    raise RIRError(f"bad subject {subject!r} in {text!r}")
  clauses: list[sparql_lib.Clause] = []
  for predicate in predicates:
    if not sparql_lib.is_predicate(predicate):
      raise RIRError(f"bad predicate {predicate!r} in {text!r}")
    for obj in objects:
      if not sparql_lib.is_term(obj):
        raise RIRError(f"bad object {obj!r} in {text!r}")
      clauses.append(sparql_lib.Triple(subject, predicate, obj))
  return clauses


def rir_to_clauses(rir: str) -> tuple[str, list[sparql_lib.Clause]]:
  """(prefix, clauses) of an RIR string, every group expanded into its triples.

  RIRError, never another exception, for malformed RIR (unknown prefix, no `lb`/`rb`, unbalanced
  parentheses, a bad group or term, over `MAX_GROUP_TRIPLES` triples, no group).
  """
  if not isinstance(rir, str):
    raise RIRError(f"expected a string, got {type(rir).__name__}")
  tokens = rir.split()
  if not tokens:
    raise RIRError("empty RIR string")
  try:
    prefix, open_at = sparql_lib.split_prefix(tokens, LB)
  except sparql_lib.SparqlParseError as e:
    raise RIRError(str(e)) from None
  if tokens[-1] != RB:
    raise RIRError(f"RIR does not end with '{RB}'")
  body = tokens[open_at + 1:-1]
  if LB in body or RB in body:
    raise RIRError(f"nested or repeated '{LB}'/'{RB}'")
  clauses: list[sparql_lib.Clause] = []
  for unit in _split_top_level(body, ".", "the query body"):
    if not unit:
      raise RIRError("empty group (two '.' in a row, or a '.' at the start or end)")
    clauses.extend(_parse_unit(unit))
  return prefix, clauses


def rir_to_query(rir: str) -> sparql_lib.Query:
  """Parses RIR into a `sparql.Query`. Raises RIRError on malformed input."""
  prefix, clauses = rir_to_clauses(rir)
  return sparql_lib.Query.from_clauses(prefix, clauses)


def rir_to_sparql(rir: str) -> str:
  """SPARQL of an RIR string, the inverse of `sparql_to_rir` up to clause order and repeated
  filters.

  Groups expand per predicate, per object (a repeated object repeats the triple); filters keep
  their place. RIRError for malformed RIR.
  """
  prefix, clauses = rir_to_clauses(rir)
  return f"{prefix} {{ " + " . ".join(c.to_sparql() for c in clauses) + " }"
