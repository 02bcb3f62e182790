"""Freebase -> Wikidata query migration (MCWQ paper, §3.1).

The mapping is `preprocessing/data/property_mapping.json` (derived and checked by
`python -m preprocessing.derive_mapping`): properties become `wdt:P…` (a path `a|b` becomes
`wdt:P1|wdt:P2`, as MCWQ writes it), reverse properties swap subject and object, type assertions
become triples with an entity (`?x wdt:P106 wd:Q2526255`), special entities (genders,
nationalities) their Q-codes; the art director becomes the composer, in the questions too.
Queries with a reverse mark (`^ns:…`) are filtered out.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any

from mcwq_t5x.data import sparql as sparql_lib
from preprocessing import cfq

DEFAULT_MAPPING = pathlib.Path(__file__).resolve().parent / "data" / "property_mapping.json"

_PID_RE = re.compile(r"^P[1-9][0-9]*$")
_QID_RE = re.compile(r"^Q[1-9][0-9]*$")


class MappingError(ValueError):
  """The mapping file is malformed (message names the file and the entry)."""


class SkipRecord(Exception):
  """A CFQ record that the migration filters out; `reason` is a short category for the counts."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason
    self.detail = detail


@dataclasses.dataclass(frozen=True)
class PropertyMapping:
  """The loaded mapping (see the module docstring and the JSON file's `description`).

  Attributes:
    properties: Freebase predicate expression -> (Wikidata predicate such as "wdt:P162|wdt:P272",
      reverse flag, label).
    types: Freebase type -> (Wikidata property "wdt:P106", entity "wd:Q2526255", label).
    entities: Freebase MID -> ("wd:Q6581097", label).
    question_rewrites: (from, to) phrase replacements applied to questions.
    labels: Wikidata id (P or Q) -> English label, from all entries.
  """
  properties: dict[str, tuple[str, bool, str]]
  types: dict[str, tuple[str, str, str]]
  entities: dict[str, tuple[str, str]]
  question_rewrites: tuple[tuple[str, str], ...]
  labels: dict[str, str]


def load_mapping(path: str | pathlib.Path = DEFAULT_MAPPING) -> PropertyMapping:
  """Loads and validates the mapping file.

  Raises:
    MappingError: a missing section, a bad P/Q id or a missing label (message names file and key).
  """
  path = pathlib.Path(path)
  try:
    raw = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise MappingError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
  for section in ("properties", "types", "entities"):
    if not isinstance(raw.get(section), dict):
      raise MappingError(f"{path}: missing section {section!r}")
  labels: dict[str, str] = {}
  props = {}
  for key, e in raw["properties"].items():
    pids = str(e.get("wikidata", "")).split("|")
    names = str(e.get("label", "")).split("|")
    if not all(_PID_RE.match(p) for p in pids) or len(names) != len(pids) or not all(names):
      raise MappingError(f"{path}: properties[{key!r}]: needs 'wikidata' P-ids and one label each")
    props[key] = ("|".join("wdt:" + p for p in pids), bool(e.get("reverse", False)), e["label"])
    labels.update(zip(pids, names))
  types = {}
  for key, e in raw["types"].items():
    p, q = e.get("property", ""), e.get("entity", "")
    if not _PID_RE.match(p) or not _QID_RE.match(q) or not e.get("label"):
      raise MappingError(f"{path}: types[{key!r}]: needs 'property' P-id, 'entity' Q-id, 'label'")
    types[key] = ("wdt:" + p, "wd:" + q, e["label"])
    labels[q] = e["label"]
    if e.get("property_label"):
      labels[p] = e["property_label"]
  ents = {}
  for key, e in raw["entities"].items():
    q = e.get("wikidata", "")
    if not _QID_RE.match(q) or not e.get("label"):
      raise MappingError(f"{path}: entities[{key!r}]: needs 'wikidata' Q-id and 'label'")
    ents[key] = ("wd:" + q, e["label"])
    labels[q] = e["label"]
  rewrites = tuple((r["from"], r["to"]) for r in raw.get("question_rewrites", []))
  return PropertyMapping(props, types, ents, rewrites, labels)


def rewrite_question(question: str, mapping: PropertyMapping) -> str:
  """Applies the mapping's phrase rewrites (e.g. "art director" -> "composer")."""
  for a, b in mapping.question_rewrites:
    question = question.replace(a, b)
  return question


@dataclasses.dataclass(frozen=True)
class Migrated:
  """One migrated query: prefix and ordered clauses, with `Mk` placeholders for question entities.

  Attributes:
    prefix: "ASK WHERE" or "SELECT DISTINCT ?x0 WHERE".
    clauses: Wikidata clauses in CFQ order, one per CFQ clause (repetitions kept).
  """
  prefix: str
  clauses: tuple[cfq.Clause, ...]

  def to_sparql(self) -> str:
    """MCWQ one-line format, clauses in CFQ order (filters where CFQ has them)."""
    return cfq.ParsedQuery(self.prefix, self.clauses).to_sparql()

  def query(self) -> sparql_lib.Query:
    """The `mcwq_t5x.data.sparql.Query` of this query."""
    return sparql_lib.parse_sparql(self.to_sparql())


def migrate_query(q: cfq.ParsedQuery,
                  mapping: PropertyMapping,
                  where: str = "<record>") -> Migrated:
  """The Wikidata query of a CFQ query whose question entities are `Mk` (`cfq.sparql_mod_entities`).

  SkipRecord reasons (naming `where`): "reverse mark", "unmapped property", "unmapped type",
  "unmapped entity".
  """
  # MCWQ writes CFQ's `SELECT count(*) WHERE` as `ASK WHERE`.
  prefix = "ASK WHERE" if q.prefix == "SELECT count(*) WHERE" else q.prefix

  def term(t: str) -> str:
    if cfq.is_variable(t) or cfq.is_placeholder(t):
      return t
    if t in mapping.entities:
      return mapping.entities[t][0]
    raise SkipRecord("unmapped entity", f"{where}: {t}")

  # One Wikidata clause per CFQ clause, in order, repeats kept: MCWQ keeps CFQ's repeated "sibling
  # and spouse" filter (all 64 such dev/test queries) and repeated triples (random_split/test line
  # 388).
  out: list[cfq.Clause] = []
  for c in q.clauses:
    if c.is_filter:
      new = cfq.Clause(term(c.subject), "!=", term(c.object))
    elif c.predicate.startswith("^") or "|^" in c.predicate or "/^" in c.predicate:
      raise SkipRecord("reverse mark", f"{where}: {c.predicate}")
    elif c.predicate == "a":
      if c.object not in mapping.types:
        raise SkipRecord("unmapped type", f"{where}: {c.object}")
      p, o, _ = mapping.types[c.object]
      new = cfq.Clause(term(c.subject), p, o)
    else:
      if c.predicate not in mapping.properties:
        raise SkipRecord("unmapped property", f"{where}: {c.predicate}")
      p, rev, _ = mapping.properties[c.predicate]
      s, o = term(c.subject), term(c.object)
      # A reverse property (`film.director.film` -> reverse of P57) swaps subject and object.
      new = cfq.Clause(o, p, s) if rev else cfq.Clause(s, p, o)
    out.append(new)
  return Migrated(prefix, tuple(out))


def migrate_record(record: dict[str, Any],
                   mapping: PropertyMapping,
                   where: str = "<record>",
                   context_model: cfq.ContextModel | None = None) -> tuple[str, Migrated]:
  """Migrates one CFQ record: returns (rewritten question pattern, Wikidata query).

  Raises:
    cfq.CfqFormatError: malformed record.
    SkipRecord: filtered out (see `migrate_query`).
  """
  cfq.validate_record(record, where)
  if "^" in record["sparql"]:
    raise SkipRecord("reverse mark", where)
  q = cfq.sparql_mod_entities(record, where, context_model)
  return rewrite_question(record["questionPatternModEntities"],
                          mapping), migrate_query(q, mapping, where)
