"""Entity substitution and negative sampling (MCWQ paper, §3.2).

Entity substitution: the placeholders `M0`… of a migrated query become SPARQL variables `?m0`…,
pairwise distinctness FILTERs are added, special entities stay fixed (`wd:Q6581097`), and the
query `SELECT DISTINCT ?m0 ?m1 … WHERE { … } LIMIT n` is executed. One satisfying assignment
(chosen with a per-record seed) is substituted back, giving the query with entities, the
question with Q-ids (`questionWithMids`) and with bracketed labels (`questionWithBrackets`).

Negative sampling (yes/no questions): one entity of a positive ASK query is replaced by an entity
that other queries' assignments put after the same predicate (same predicate, same side of the
triple); the candidate is kept only if the ASK query with it is false.

Every term put into a SPARQL string is validated first (`?x0`/`?m0` variables, `wd:Q…`,
`wdt:P…` paths): labels never enter queries, so nothing can be injected through them.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Iterable, Sequence

from mcwq_t5x.stores.endpoint import QID_RE, Endpoint, order_triples
from preprocessing import cfq
from preprocessing.mapping import Migrated

_VAR_RE = re.compile(r"^\?[a-z][0-9]{1,2}$")
_WD_RE = re.compile(r"^wd:Q[1-9][0-9]{0,11}$")
_PRED_RE = re.compile(r"^wdt:P[1-9][0-9]{0,11}(\|wdt:P[1-9][0-9]{0,11})*$")


def _checked(term: str) -> str:
  if _VAR_RE.match(term) or _WD_RE.match(term):
    return term
  raise ValueError(f"refusing to put {term!r} into a SPARQL query")


def _checked_pred(pred: str) -> str:
  if _PRED_RE.match(pred):
    return pred
  raise ValueError(f"refusing to put predicate {pred!r} into a SPARQL query")


def placeholders(q: Migrated) -> list[str]:
  """Placeholders of the query in order of first occurrence."""
  seen: list[str] = []
  for c in q.clauses:
    for t in (c.subject, c.object):
      if cfq.is_placeholder(t) and t not in seen:
        seen.append(t)
  return seen


def body(q: Migrated,
         binding: dict[str, str],
         distinct: Sequence[str] = (),
         counts: dict[str, int] | None = None) -> str:
  """The query body with placeholders bound (`Mk` -> `wd:Q…` or `?mk`), validated.

  Args:
    q: migrated query.
    binding: placeholder -> term (`wd:Q42` or a variable `?m0`).
    distinct: terms that must be pairwise different (FILTERs added).
    counts: predicate counts; when given, triples are reordered (`order_triples`) and filters
      put last.

  Raises:
    ValueError: an unbound placeholder or a term/predicate that is not a safe SPARQL term.
  """

  def term(t: str) -> str:
    if cfq.is_placeholder(t):
      if t not in binding:
        raise ValueError(f"placeholder {t} is not bound")
      return _checked(binding[t])
    return _checked(t)

  triples = [(term(c.subject), _checked_pred(c.predicate), term(c.object))
             for c in q.clauses
             if not c.is_filter]
  filters = [f"FILTER ( {term(c.subject)} != {term(c.object)} )" for c in q.clauses if c.is_filter]
  if counts is not None:
    parts = [" ".join(t) for t in order_triples(triples, counts)] + filters
  else:
    parts = []
    it_t, it_f = iter(triples), iter(filters)
    for c in q.clauses:
      parts.append(next(it_f) if c.is_filter else " ".join(next(it_t)))
  distinct = [_checked(t) for t in distinct]
  for i, a in enumerate(distinct):
    for b in distinct[i + 1:]:
      parts.append(f"FILTER ( {a} != {b} )")
  return " . ".join(parts)


def assignment_query(q: Migrated, limit: int, counts: dict[str, int] | None = None) -> str:
  """`SELECT DISTINCT ?m0 … WHERE { … } LIMIT n` for the placeholders of `q` (§3.2).

  `counts` (predicate counts) reorders the triples for speed (`order_triples`).
  """
  phs = placeholders(q)
  if not phs:
    raise ValueError("query has no placeholders")
  binding = {m: "?m" + m[1:] for m in phs}
  vars_ = " ".join(binding[m] for m in phs)
  return f"SELECT DISTINCT {vars_} WHERE {{ {body(q, binding, list(binding.values()), counts)} }} LIMIT {int(limit)}"


def substituted_sparql(q: Migrated, assignment: dict[str, str]) -> str:
  """The MCWQ-format query with placeholders replaced by the assigned `wd:Q…` entities."""
  for e in assignment.values():
    _checked(e)
  sub = lambda t: assignment.get(t, t)  # noqa: E731
  return cfq.ParsedQuery(
      q.prefix,
      tuple(cfq.Clause(sub(c.subject), c.predicate, sub(c.object)) for c in q.clauses)).to_sparql()


def ask_query(q: Migrated, assignment: dict[str, str], counts: dict[str, int] | None = None) -> str:
  """`ASK WHERE { … }` of the query with entities (distinctness of entities is by construction)."""
  return f"ASK WHERE {{ {body(q, assignment, (), counts)} }}"


def answers_query(q: Migrated,
                  assignment: dict[str, str],
                  limit: int = 1000,
                  counts: dict[str, int] | None = None) -> str:
  """`SELECT DISTINCT ?x0 WHERE { … }` of a wh- query with entities (its expected response)."""
  return f"SELECT DISTINCT ?x0 WHERE {{ {body(q, assignment, (), counts)} }} LIMIT {int(limit)}"


def find_assignments(q: Migrated, endpoint: Endpoint, limit: int = 100) -> list[dict[str, str]]:
  """All satisfying assignments returned by the endpoint (at most `limit`).

  Returns:
    [{"M0": "wd:Q42", ...}], in the endpoint's order; rows whose values are not Wikidata items
    are dropped. When the endpoint knows its properties (`Endpoint.predicates`) and one of the
    query's is absent, [] is returned without a request.
  """
  phs = placeholders(q)
  counts = endpoint.predicate_counts()
  if counts is not None and not all(
      any(p in counts for p in c.predicate.split("|")) for c in q.clauses if not c.is_filter):
    return []  # a property without any triple: no solution, no need to ask
  out = []
  for row in endpoint.select(assignment_query(q, limit, counts)):
    a = {m: row.get("m" + m[1:], "") for m in phs}
    if all(_WD_RE.match(v) for v in a.values()):
      out.append(a)
  return out


def satisfiable(q: Migrated, endpoint: Endpoint) -> bool:
  """Whether a query without placeholders has a solution (ASK of its body)."""
  counts = endpoint.predicate_counts()
  if counts is not None and not all(
      any(p in counts for p in c.predicate.split("|")) for c in q.clauses if not c.is_filter):
    return False
  return endpoint.ask(ask_query(q, {}, counts))


def choose(assignments: Sequence[dict[str, str]], seed: int) -> dict[str, str] | None:
  """One assignment chosen with `random.Random(seed)` (None when there is none)."""
  if not assignments:
    return None
  return assignments[random.Random(seed).randrange(len(assignments))]


def fill_question(pattern: str, assignment: dict[str, str], labels: dict[str,
                                                                         str]) -> tuple[str, str]:
  """(questionWithMids, questionWithBrackets) of a question pattern.

  `Mk` becomes the Q-id in the first and `[label]` in the second (the Q-id when no label).
  """
  mids, brackets = [], []
  for tok in pattern.split(" "):
    if cfq.is_placeholder(tok) and tok in assignment:
      qid = assignment[tok].removeprefix("wd:")
      mids.append(qid)
      brackets.append(f"[{labels.get(qid, qid)}]")
    else:
      mids.append(tok)
      brackets.append(tok)
  return " ".join(mids), " ".join(brackets)


def predicate_keys(q: Migrated) -> dict[str, list[tuple[str, str]]]:
  """For each placeholder, the (side, predicate) pairs it occurs with: ("o", "wdt:P57") etc."""
  out: dict[str, list[tuple[str, str]]] = {}
  for c in q.clauses:
    if c.is_filter:
      continue
    if cfq.is_placeholder(c.subject):
      out.setdefault(c.subject, []).append(("s", c.predicate))
    if cfq.is_placeholder(c.object):
      out.setdefault(c.object, []).append(("o", c.predicate))
  return out


@dataclasses.dataclass
class EntityPool:
  """Entities seen after each (side, predicate) in the assignments of all queries.

  Attributes:
    by_key: (side, predicate) -> {entity: set of record ids that used it there}.
  """
  by_key: dict[tuple[str, str], dict[str, set[Any]]] = dataclasses.field(default_factory=dict)

  def add(self, rid: Any, q: Migrated, assignment: dict[str, str]) -> None:
    """Records that record `rid` used `assignment` (placeholder -> `wd:Q…`) in query `q`, under
    each (side, predicate) key of its placeholders (`predicate_keys`)."""
    for m, keys in predicate_keys(q).items():
      if m in assignment:
        for k in keys:
          self.by_key.setdefault(k, {}).setdefault(assignment[m], set()).add(rid)

  def candidates(self, rid: Any, key: tuple[str, str]) -> list[str]:
    """Entities used after `key` by records other than `rid` (sorted, deterministic)."""
    return sorted(e for e, rids in self.by_key.get(key, {}).items() if rids - {rid})


def sample_negative(rid: Any,
                    q: Migrated,
                    assignment: dict[str, str],
                    pool: EntityPool,
                    endpoint: Endpoint,
                    seed: int,
                    max_tries: int = 10) -> tuple[dict[str, str], str] | None:
  """A verified negative for a yes/no query (§3.2), or None when none was found.

  Args:
    rid: the record's id (its own entities are not candidates).
    q: the migrated ASK query.
    assignment: its positive assignment.
    pool: entities of other queries by preceding predicate.
    endpoint: where ASK is executed.
    seed: per-record seed.
    max_tries: ASK queries tried at most.

  Returns:
    (negative assignment, placeholder that was replaced).
  """
  rng = random.Random(seed)
  keys = predicate_keys(q)
  phs = [m for m in placeholders(q) if m in keys]
  rng.shuffle(phs)
  tries = 0
  for m in phs:
    key = keys[m][0]
    cands = [
        e for e in pool.candidates(rid, key) if e != assignment[m] and e not in assignment.values()
    ]
    rng.shuffle(cands)
    for e in cands:
      if tries >= max_tries:
        return None
      tries += 1
      neg = dict(assignment)
      neg[m] = e
      if not endpoint.ask(ask_query(q, neg, endpoint.predicate_counts())):
        return neg, m
  return None


def qids(values: Iterable[str]) -> list[str]:
  """Q-ids of `wd:Q…` terms (others dropped)."""
  out = []
  for v in values:
    v = v.removeprefix("wd:")
    if QID_RE.match(v):
      out.append(v)
  return out
