"""The SPARQL store interface: `Endpoint` (`select`, `ask`, `labels`), its errors, the Wikidata
vocabulary and id checks, and the join order of generated queries.

Execution accuracy (`mcwq_t5x.evaluation.execution`) runs queries on a store; the dataset-creation
pipeline (`preprocessing.substitute`, `preprocessing.migrate`: entity substitution and negative
sampling, MCWQ paper §3.2) uses them too. The stores (each module's docstring says more):

* `mcwq_t5x.stores.oxigraph.OxigraphEndpoint`: an embedded `pyoxigraph` store, loaded from
  N-Triples or CoDEx, the offline default;
* `mcwq_t5x.stores.remote.RemoteEndpoint`: any SPARQL 1.1 HTTP endpoint, by default the Wikidata
  Query Service (through `mcwq_t5x.stores.transport`);
* `mcwq_t5x.stores.cache.CachedEndpoint`: any store, its answers kept in a JSONL file;
* `mcwq_t5x.stores.flags`: the command-line flags that name one.

Every store raises `QueryTimeout` (an `EndpointError`) when a query takes longer than its
`timeout_s`; it is not retried.

Results are plain JSON-able values: `select` returns a list of {variable: term} rows where a
Wikidata entity is written `wd:Q42`, a property `wdt:P57`, any other IRI `<…>` and a literal its
lexical form (`compact`). `order_triples` orders a query's triple patterns for the embedded store's
joins.
"""

from __future__ import annotations

import abc
import re
from typing import Sequence

WD = "http://www.wikidata.org/entity/"
WDT = "http://www.wikidata.org/prop/direct/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
PREFIXES = (f"PREFIX wd: <{WD}>\nPREFIX wdt: <{WDT}>\n"
            "PREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#>\n")

QID_RE = re.compile(r"^Q[1-9][0-9]{0,11}$")
PID_RE = re.compile(r"^P[1-9][0-9]{0,11}$")
LANG_RE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{1,8})*$")


class EndpointError(RuntimeError):
  """A query failed for good (after retries, or a non-retryable error)."""


class QueryTimeout(EndpointError):
  """A query did not finish within the endpoint's `timeout_s` (not retried).

  Attributes:
    timeout_s: the time limit it ran into, in seconds.
  """

  def __init__(self, message: str, timeout_s: float):
    super().__init__(message)
    self.timeout_s = timeout_s


def check_qid(qid: str) -> str:
  """Returns `qid` if it is a Wikidata item id `Q123`, else raises ValueError (no injection)."""
  if not isinstance(qid, str) or not QID_RE.match(qid):
    raise ValueError(f"not a Wikidata item id: {qid!r}")
  return qid


def compact(iri: str) -> str:
  """`http://www.wikidata.org/entity/Q42` -> `wd:Q42` (other IRIs -> `<iri>`)."""
  if iri.startswith(WD):
    return "wd:" + iri[len(WD):]
  if iri.startswith(WDT):
    return "wdt:" + iri[len(WDT):]
  return f"<{iri}>"


def order_triples(triples: list[tuple[str, str, str]],
                  counts: dict[str, int] | None) -> list[tuple[str, str, str]]:
  """Greedy join order: next the triple with the smallest estimated cardinality.

  Estimate = triples of the predicate (sum over `|` alternatives; 10^6 when unknown), times 0.01
  when one end is a constant or already bound, times 10^-4 when both are. The answer set does
  not depend on the order (a conjunctive query); only the embedded store's speed does.
  """
  if counts is None:
    return triples
  left = list(triples)
  bound: set[str] = set()
  out = []

  def est(t: tuple[str, str, str]) -> float:
    n = sum(counts.get(p, 0) for p in t[1].split("|")) if counts else 10**6
    b = sum(1 for x in (t[0], t[2]) if not x.startswith("?") or x in bound)
    return n * (1.0, 0.01, 1e-4)[b]

  while left:
    best = min(left, key=est)
    left.remove(best)
    out.append(best)
    bound.update(x for x in (best[0], best[2]) if x.startswith("?"))
  return out


class Endpoint(abc.ABC):
  """A SPARQL endpoint answering the queries of the migration (Wikidata vocabulary)."""

  @abc.abstractmethod
  def select(self, query: str) -> list[dict[str, str]]:
    """Runs a SELECT query (without PREFIX lines; `wd:`, `wdt:`, `rdfs:` are declared).

    Returns:
      Rows {variable name (no '?'): term}; unbound variables are absent from a row.

    Raises:
      EndpointError: the query failed.
    """

  @abc.abstractmethod
  def ask(self, query: str) -> bool:
    """Runs an ASK query (prefixes as for `select`). Raises EndpointError on failure."""

  def predicates(self) -> set[str] | None:
    """The `wdt:P…` properties that have triples, when cheaply known (None = unknown).

    A query using a property without triples has no solutions; the embedded store knows its
    properties, which saves running such queries (CoDEx lacks many MCWQ properties).
    """
    counts = self.predicate_counts()
    return None if counts is None else set(counts)

  def predicate_counts(self) -> dict[str, int] | None:
    """Number of triples of each `wdt:P…` property, when cheaply known (None = unknown).

    Used to order the triple patterns of generated queries (most selective first): pyoxigraph
    joins in the written order, and a bad order turns a 1 ms query into minutes.
    """
    return None

  def labels(self, qids: Sequence[str], language: str = "en") -> dict[str, str]:
    """Labels of Wikidata items in `language` ({} entries for items without one).

    Raises:
      ValueError: an id is not `Q…` or the language code is malformed (nothing is sent).
    """
    out: dict[str, str] = {}
    qids = sorted({check_qid(q) for q in qids})
    if not LANG_RE.match(language):
      raise ValueError(f"bad language code {language!r}")
    for i in range(0, len(qids), 200):
      chunk = qids[i:i + 200]
      values = " ".join(f"wd:{q}" for q in chunk)
      rows = self.select(f"SELECT ?e ?l WHERE {{ VALUES ?e {{ {values} }} ?e rdfs:label ?l . "
                         f"FILTER ( lang(?l) = \"{language}\" ) }}")
      for r in rows:
        if "l" in r and r.get("e", "").startswith("wd:"):
          out.setdefault(r["e"][3:], r["l"])
    return out
