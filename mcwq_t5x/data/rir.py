"""The reversible intermediate representation (RIR) of MCWQ queries.

Herzig et al. (2021), "Unlocking Compositional Generalization in Pre-trained Models Using
Intermediate Representations", make SPARQL easier for seq2seq models by (1) replacing the braces with
the words `lb` and `rb` and (2) merging triples: all triples of one subject whose predicates share
the same object list become one group `( S ( r1 , r2 ) ( o1 , o2 ) )`, which stands for every triple
`S ri oj`. Filters stay as `( FILTER ( a != b ) )`. MCWQ (Cui et al., TACL 2022, §5) trains and scores
its models on this form; the published targets are `translations/mcd1/*.sparql` of the MCWQ release.

Grouping, as reproduced byte for byte on the published files (all 188,672 dev/test lines of the
four splits, `translations/{split}/{part}.{lang}.sparql` of the MCWQ release):
  * units (subject groups and filters) appear in the order of their first clause in the query;
  * a repeated filter is written once, but a repeated triple is not: inside a subject, each
    predicate collects its objects in order of appearance, repetitions included, so
    `M2 wdt:P108 M1 . M2 wdt:P108 M1` gives `( M2 ( wdt:P108 ) ( M1 , M1 ) )` (random_split/test,
    line 388: `( M2 ( wdt:P108 ) ( M1 , M1 ) ) . ( M3 ( wdt:P108 ) ( M1 ) )`);
  * predicates with the same object list, compared as multisets (order ignored, repetitions
    counted), are merged, in order of first appearance, and the group lists the objects in the
    order of its first predicate. Expanding a group therefore gives back exactly the triples of its
    predicates, repetitions included. (The release never merges two predicates of which one has a
    repeated object, so counting repetitions there is our choice: the one that keeps
    `rir_to_clauses` the exact inverse on triples.)

Example:
  ASK WHERE { M0 wdt:P57 ?x0 . M0 wdt:P58 ?x0 . ?x0 wdt:P27 wd:Q30 . FILTER ( ?x0 != M1 ) }
  ASK WHERE lb ( M0 ( wdt:P57 , wdt:P58 ) ( ?x0 ) ) . ( ?x0 ( wdt:P27 ) ( wd:Q30 ) ) . ( FILTER ( ?x0 != M1 ) ) rb

The command line is `python -m mcwq_t5x.rir`.
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
  """RIR groups of one subject's (position, triple) pairs, as (position of the group's first
  triple, `( S ( r1 , r2 ) ( o1 , o2 ) )`); a repeated triple repeats its object (see the module
  docstring)."""
  objects_of: dict[str, list[str]] = {}
  first_of: dict[str, int] = {}
  for position, t in triples:
    objects_of.setdefault(t.predicate, []).append(t.object)
    first_of.setdefault(t.predicate, position)
  # (first position, predicates, objects, objects as a multiset)
  groups: list[tuple[int, list[str], list[str], collections.Counter]] = []
  for predicate, objs in objects_of.items():
    counts = collections.Counter(objs)
    for i, (first, preds, group_objs, group_counts) in enumerate(groups):
      if group_counts == counts:
        preds.append(predicate)
        groups[i] = (min(first, first_of[predicate]), preds, group_objs, group_counts)
        break
    else:
      groups.append((first_of[predicate], [predicate], objs, counts))
  return [(first, f"( {subject} ( {' , '.join(preds)} ) ( {' , '.join(objs)} ) )")
          for first, preds, objs, _ in groups]


def query_to_rir(prefix: str, clauses: Sequence[sparql_lib.Clause]) -> str:
  """RIR of a query given as its prefix and ordered clauses (see `sparql.parse_clauses`).

  Grouping rules in the module docstring: a repeated filter is written once, a repeated triple
  repeats its object inside its group.
  """
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
  units.sort(key=lambda unit: unit[0])
  return f"{prefix} {LB} " + " . ".join(text for _, text in units) + f" {RB}"


def sparql_to_rir(sparql: str) -> str:
  """Converts a CFQ/MCWQ SPARQL query to RIR.

  Args:
    sparql: one query on one line, e.g. "ASK WHERE { M0 wdt:P57 ?x0 }".
  Returns:
    The RIR string, e.g. "ASK WHERE lb ( M0 ( wdt:P57 ) ( ?x0 ) ) rb".
  Raises:
    sparql.SparqlParseError: the input is not a query of that syntax.
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
  """Parses an RIR string into (prefix, clauses) with every group expanded into its triples.

  Raises:
    RIRError: the string is not well-formed RIR (unknown prefix, missing `lb`/`rb`, unbalanced
      parentheses, a malformed group or term, a group of more than `MAX_GROUP_TRIPLES` triples,
      no group at all). Never another exception type.
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
  """Converts RIR back to SPARQL (the inverse of `sparql_to_rir` up to clause order and repeated
  filters: the triples come back with their repetitions, a repeated filter once).

  Groups expand in order: for each predicate, for each object (a repeated object gives a repeated
  triple). Filters keep their position.

  Raises:
    RIRError: malformed RIR (see `rir_to_clauses`).
  """
  prefix, clauses = rir_to_clauses(rir)
  return f"{prefix} {{ " + " . ".join(c.to_sparql() for c in clauses) + " }"
