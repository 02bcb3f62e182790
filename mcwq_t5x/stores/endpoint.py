"""The SPARQL store interface: `Endpoint` (`select`, `ask`, `labels`), its errors, the Wikidata
id checks and the join order of generated queries.

Execution accuracy and dataset creation (entity substitution and negative sampling, MCWQ paper
§3.2) run queries on a store: `oxigraph.OxigraphEndpoint` (embedded, the offline default),
`remote.RemoteEndpoint` (any SPARQL 1.1 endpoint, by default WDQS) or `cache.CachedEndpoint`.
Every store raises `QueryTimeout` past its `timeout_s` (not retried). `select` returns
{variable: term} rows with terms as `compact` writes them (`wd:Q42`, `wdt:P57`, `<iri>`, a
literal's lexical form).
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
  """A query did not finish within the endpoint's `timeout_s` (seconds; not retried)."""

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

  Estimate: the predicate's triples (summed over `|`; 10^6 unknown), x 0.01 with one end constant
  or bound, x 10^-4 with both. The answers do not depend on the order, only the embedded store's
  speed does.
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
    """Rows {variable (no '?'): term} of a SELECT without PREFIX lines (`wd:`, `wdt:`, `rdfs:`
    declared); unbound variables absent. EndpointError if the query failed."""

  @abc.abstractmethod
  def ask(self, query: str) -> bool:
    """Runs an ASK query (prefixes as for `select`). Raises EndpointError on failure."""

  def predicates(self) -> set[str] | None:
    """The `wdt:P…` properties with triples, when cheaply known (None = unknown)."""
    # A property without triples has no solutions: CoDEx lacks many MCWQ properties, and such
    # queries need not run.
    counts = self.predicate_counts()
    return None if counts is None else set(counts)

  def predicate_counts(self) -> dict[str, int] | None:
    """Triples per `wdt:P…` property, when cheaply known (None = unknown), for `order_triples`:
    pyoxigraph joins in the written order, and a bad order turns a 1 ms query into minutes."""
    return None

  def labels(self, qids: Sequence[str], language: str = "en") -> dict[str, str]:
    """{Q-id: label in `language`} (items without one absent); ValueError before sending for a
    bad id or language code."""
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
