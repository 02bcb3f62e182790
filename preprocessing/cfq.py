"""Reading CFQ records and their Freebase SPARQL (input side of the MCWQ pipeline).

CFQ (Keysers et al., ICLR 2020) `dataset.json` records have `questionIdx`, `questionWithBrackets`,
`questionPatternModEntities`, `sparql` (Freebase, MIDs such as `ns:m.0hhkf7k`), `sparqlPattern`
(constants as `M0`…, properties as `P0`…), `recursionDepth`, `expectedResponse`, and in the full
release `questionWithMids` and `sparqlPatternModEntities` (the sample in
`../shared/cfq/cfq_sample_{train,dev}.json` lacks these two). `sparqlPattern`'s M indices are the
question pattern's (MCWQ §3.2 relies on this), so aligning it with `sparql` gives each
placeholder's constant; placeholders not in the question are types or special entities. Which
entity goes with which property comes from the two full-release keys when present
(`exact_entity_constants`), else `ContextModel` chooses from the question's words. No TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import pathlib
import re
from typing import Any, Iterable, Iterator, Sequence

from mcwq_t5x.data import readers
from mcwq_t5x.data import sparql as sparql_lib

#: Keys every CFQ record must have for the migration.
REQUIRED_KEYS = ("questionIdx", "questionPatternModEntities", "questionWithBrackets", "sparql",
                 "sparqlPattern")

#: Query forms used by CFQ and MCWQ.
CFQ_PREFIXES = ("SELECT count(*) WHERE", "SELECT DISTINCT ?x0 WHERE", "ASK WHERE")

#: Freebase properties whose object is a special entity (gender, nationality; MCWQ §3.1).
SPECIAL_ENTITY_PREDICATES = ("ns:people.person.gender", "ns:people.person.nationality")

#: Optional keys of the full CFQ release that state which constant each question entity is.
EXACT_KEYS = ("questionWithMids", "sparqlPatternModEntities")

_VARIABLE_RE = re.compile(r"^\?x\d+$")
#: A Freebase MID as `questionWithMids` writes it (`m.04lhs01`, `g.1yxkhhbn3`), `ns:` optional.
_MID_RE = re.compile(r"(?<![\w.:])(?:ns:)?([mg]\.[0-9a-z_]+)")
#: Tokens that join the members of a list ("M1 , M2 , and M3") or coordinated phrases.
_LIST_JOINERS = frozenset({",", "and"})


class CfqFormatError(ValueError):
  """A CFQ record or query is malformed; the message names the record and the problem."""


@dataclasses.dataclass(frozen=True)
class Clause:
  """One clause of a query body: a triple `s p o` or a filter `FILTER ( s != o )`.

  Attributes:
    subject: first term (variable `?x0`, placeholder `M0`, constant `ns:m.0abc` / `wd:Q5`).
    predicate: predicate expression as written (may be a Freebase path such as `ns:a/ns:b|ns:c`,
      the keyword `a`, a `^`-reversed property) or `!=` for a filter.
    object: last term.
  """
  subject: str
  predicate: str
  object: str

  @property
  def is_filter(self) -> bool:
    """True for a filter `FILTER ( s != o )` (stored with predicate `!=`)."""
    return self.predicate == "!="

  def text(self) -> str:
    """MCWQ spelling of the clause (`s p o` or `FILTER ( s != o )`)."""
    if self.is_filter:
      return f"FILTER ( {self.subject} != {self.object} )"
    return f"{self.subject} {self.predicate} {self.object}"


@dataclasses.dataclass(frozen=True)
class ParsedQuery:
  """A parsed CFQ or MCWQ query: prefix (one of `CFQ_PREFIXES`) and clauses in source order."""
  prefix: str
  clauses: tuple[Clause, ...]

  def to_sparql(self) -> str:
    """Serialises in the MCWQ one-line format `PREFIX { c1 . c2 }`."""
    return self.prefix + " { " + " . ".join(c.text() for c in self.clauses) + " }"

  def canonical(self) -> tuple[str, frozenset[Clause]]:
    """Order- and duplicate-insensitive key of the query (prefix, set of clauses)."""
    return self.prefix, frozenset(self.clauses)


def is_placeholder(term: str) -> bool:
  """True for the entity placeholders `M0`…`M9` of CFQ/MCWQ (`mcwq_t5x.data.sparql.is_placeholder`)."""
  return sparql_lib.is_placeholder(term)


def is_variable(term: str) -> bool:
  """True for the query variables `?x0`, `?x1`, …."""
  return bool(_VARIABLE_RE.match(term))


def parse_query(text: str, where: str = "<query>") -> ParsedQuery:
  """Parses a CFQ (multi-line, Freebase) or MCWQ (one-line, Wikidata) SPARQL query.

  Both are whitespace-tokenised: `PREFIX { clause . clause ... }` where a clause is three tokens
  `s p o` or the six tokens `FILTER ( s != o )`.

  Args:
    text: the query.
    where: names the record in error messages (e.g. `cfq_sample_train.json:questionIdx=12`).

  Returns:
    The parsed query.

  Raises:
    CfqFormatError: unknown prefix, missing braces, or a clause of the wrong shape.
  """
  text = text.strip()
  prefix = next((p for p in CFQ_PREFIXES if text.startswith(p)), None)
  if prefix is None:
    raise CfqFormatError(f"{where}: query does not start with one of {CFQ_PREFIXES}: {text[:60]!r}")
  rest = text[len(prefix):].strip()
  if not rest.startswith("{") or not rest.endswith("}"):
    raise CfqFormatError(f"{where}: query body is not enclosed in braces: {text[:80]!r}")
  tokens = rest[1:-1].split()
  clauses = []
  i = 0
  while i < len(tokens):
    if tokens[i] == "FILTER":
      part = tokens[i:i + 6]
      if len(part) != 6 or part[1] != "(" or part[3] != "!=" or part[5] != ")":
        raise CfqFormatError(f"{where}: malformed FILTER near {' '.join(part)!r}")
      clauses.append(Clause(part[2], "!=", part[4]))
      i += 6
    else:
      part = tokens[i:i + 3]
      if len(part) != 3 or "." in (part[0], part[1], part[2]) or part[0] in ("{", "}"):
        raise CfqFormatError(f"{where}: malformed triple near {' '.join(tokens[i:i + 4])!r}")
      clauses.append(Clause(*part))
      i += 3
    if i < len(tokens):
      if tokens[i] != ".":
        raise CfqFormatError(f"{where}: expected '.' between clauses, got {tokens[i]!r}")
      i += 1
      if i == len(tokens):
        raise CfqFormatError(f"{where}: trailing '.' at end of query body")
  if not clauses:
    raise CfqFormatError(f"{where}: empty query body")
  return ParsedQuery(prefix, tuple(clauses))


def _exact_field(record: dict[str, Any], key: str, where: str) -> str | None:
  """The text of an optional key of the full CFQ release (`EXACT_KEYS`); None when absent or null.

  Raises:
    CfqFormatError: the key holds something other than a string or null.
  """
  value = record.get(key)
  if value is not None and not isinstance(value, str):
    raise CfqFormatError(f"{where}: {key} is {type(value).__name__}, not a string")
  return value


def question_mids(record: dict[str, Any], where: str = "<record>") -> dict[str, str] | None:
  """The Freebase constant of each question placeholder, as CFQ's `questionWithMids` states it.

  The full CFQ release writes each question with placeholders (`questionPatternModEntities`,
  "Did M0 executive produce M1") and with MIDs (`questionWithMids`, "Did m.04lhs01 executive
  produce m.0gx0plf"; Keysers et al., ICLR 2020, appendix A): the k-th placeholder occurrence and
  the k-th MID name the same entity (a repeated placeholder repeats its MID).

  Args:
    record: a CFQ record.
    where: names the record in error messages.

  Returns:
    {"M0": "ns:m.04lhs01", "M1": "ns:m.0gx0plf"} (MIDs spelled as in `sparql`), or None when the
    record has no `questionWithMids` (the sample in ../shared/cfq has none).

  Raises:
    CfqFormatError: not as many MIDs as placeholder occurrences, a placeholder with two MIDs, two
      placeholders with one MID, or a MID that `sparql` does not mention.
  """
  text = _exact_field(record, "questionWithMids", where)
  if text is None:
    return None
  occurrences = [t for t in record["questionPatternModEntities"].split() if is_placeholder(t)]
  mids = ["ns:" + m for m in _MID_RE.findall(text)]
  if len(mids) != len(occurrences):
    raise CfqFormatError(f"{where}: questionWithMids names {len(mids)} MIDs but "
                         f"questionPatternModEntities has {len(occurrences)} placeholders")
  out: dict[str, str] = {}
  for m, mid in zip(occurrences, mids):
    if out.setdefault(m, mid) != mid:
      raise CfqFormatError(f"{where}: questionWithMids gives {m} two MIDs, {out[m]} and {mid}")
  if len(set(out.values())) < len(out):
    raise CfqFormatError(f"{where}: questionWithMids gives two placeholders the same MID")
  terms = {t for c in parse_query(record["sparql"], where).clauses for t in (c.subject, c.object)}
  absent = sorted(mid for mid in out.values() if mid not in terms)
  if absent:
    raise CfqFormatError(f"{where}: questionWithMids names {absent}, absent from sparql")
  return out


def exact_entity_constants(record: dict[str, Any],
                           where: str = "<record>") -> dict[str, str] | None:
  """Each question placeholder's Freebase constant, when the record says it (full CFQ release).

  Read from `questionWithMids` (`question_mids`) or, without it, by aligning
  `sparqlPatternModEntities` (the query with question entities as `Mk`, types and special entities
  kept) with `sparql`. When both are present, they must agree with `sparql` together.

  Returns:
    {"M0": "ns:m.04lhs01", ...} for every placeholder of `questionPatternModEntities`, or None when
    the record has neither key (then `ContextModel` chooses among `placeholder_candidates`).

  Raises:
    CfqFormatError: a key is malformed, or the keys contradict each other or `sparql`.
  """
  pins = question_mids(record, where)
  text = _exact_field(record, "sparqlPatternModEntities", where)
  if text is None:
    return pins
  mod = parse_query(text, where + " (sparqlPatternModEntities)")
  q = parse_query(record["sparql"], where)
  qph = question_placeholders(record["questionPatternModEntities"])
  extra = sorted(_pattern_placeholders(mod) - set(qph))
  if extra:
    raise CfqFormatError(f"{where}: sparqlPatternModEntities has placeholders {extra} that the "
                         "question does not")
  forbid = {m: (lambda c, mid=mid: c != mid) for m, mid in (pins or {}).items()}
  if mod.prefix == q.prefix and len(mod.clauses) == len(q.clauses):
    for solution in _match_clauses(list(mod.clauses), list(q.clauses), {}, set(), forbid):
      missing = [m for m in qph if m not in solution]
      if missing:
        raise CfqFormatError(f"{where}: question placeholders {missing} not in "
                             "sparqlPatternModEntities")
      return pins if pins is not None else {m: solution[m] for m in qph}
  also = " and questionWithMids" if pins is not None else ""
  raise CfqFormatError(f"{where}: sparqlPatternModEntities{also} do not align with sparql")


def placeholder_candidates(record: dict[str, Any],
                           where: str = "<record>",
                           limit: int = 64) -> list[dict[str, str]]:
  """The distinct alignments of `sparqlPattern` placeholders with the constants of `sparql`.

  A non-empty list (at most `limit`) of {"M0": "ns:people.person", "M1": "ns:m.0abc", ...}.
  CFQ's canonicalised `sparqlPattern` lets symmetric patterns (`?x0 P0 M0 . ?x0 P1 M1`) align in
  several ways (`ContextModel` chooses); alignments that only swap interchangeable constants give
  the same query and are listed once. `where` names the record in errors.

  Raises:
    CfqFormatError: the two queries do not align, or see `exact_entity_constants`.
  """
  return _candidates(record, where, limit)[0]


def _candidates(record: dict[str, Any],
                where: str,
                limit: int = 64) -> tuple[list[dict[str, str]], dict[str, str] | None]:
  """(`placeholder_candidates`, `exact_entity_constants`) of a record."""
  q = parse_query(record["sparql"], where)
  p = parse_query(record["sparqlPattern"], where + " (sparqlPattern)")
  if len(q.clauses) != len(p.clauses) or q.prefix != p.prefix:
    raise CfqFormatError(f"{where}: sparql and sparqlPattern do not align")
  qph = set(question_placeholders(record["questionPatternModEntities"]))
  special = special_constants(q)
  exact = exact_entity_constants(record, where)
  # A question placeholder never stands for a type or a special entity, and a placeholder absent
  # from the question always does; this removes the ambiguity of patterns such as
  # `?x1 P2 M1 . ?x1 P3 M2` ("M2 's Mexican director").
  forbid = {
      m: (lambda c: c in special) if m in qph else (lambda c: c not in special)
      for m in _pattern_placeholders(p)
  }
  if exact is not None:
    forbid.update({m: (lambda c, mid=mid: c != mid) for m, mid in exact.items()})
  twins = None if exact is not None else _twin_classes(q)
  out: list[dict[str, str]] = []
  for solution in _match_clauses(list(p.clauses), list(q.clauses), {}, set(), forbid, twins):
    ph = {k: v for k, v in solution.items() if is_placeholder(k)}
    if ph not in out:
      out.append(ph)
      if len(out) >= limit:
        break
  if not out:
    raise CfqFormatError(f"{where}: sparql and sparqlPattern do not align")
  return out, exact


def alignment_source(record: dict[str, Any], where: str = "<record>") -> str:
  """How `placeholder_constants` knows the record's entities: "exact" (`questionWithMids` or
  `sparqlPatternModEntities`), "unique" (one alignment of `sparqlPattern`) or "context model"
  (several, chosen by `ContextModel`).

  Raises:
    CfqFormatError: see `placeholder_candidates`.
  """
  if exact_entity_constants(record, where) is not None:
    return "exact"
  return "unique" if len(placeholder_candidates(record, where)) == 1 else "context model"


def placeholder_constants(record: dict[str, Any],
                          where: str = "<record>",
                          context_model: "ContextModel | None" = None) -> dict[str, str]:
  """Maps each placeholder `Mk` of `sparqlPattern` to the Freebase constant it stands for.

  Exact when the record has `questionWithMids` or `sparqlPatternModEntities` (full CFQ release);
  otherwise `context_model` chooses among `placeholder_candidates` (default: the first).

  Raises:
    CfqFormatError: the two queries do not align, or see `exact_entity_constants`.
  """
  cands, exact = _candidates(record, where)
  if len(cands) == 1 or context_model is None or exact is not None:
    return cands[0]
  return context_model.choose(record, cands)


class ContextModel:
  """Chooses among ambiguous placeholder alignments by the words around each placeholder.

  Needed only for records without `questionWithMids` and `sparqlPatternModEntities` (such as the
  sample in ../shared/cfq), which state the alignment exactly (`exact_entity_constants`). CFQ's
  `sparqlPattern` loses which entity of `?x0 P0 M0 . ?x0 P1 M1` goes with which property. The
  question says it ("executive produce M0", "M1 's costume designer"), so this model counts, on the
  records whose alignment is known (unique, or stated by the record), how often a context feature
  of a placeholder (the one and two words before it, the two words after it) co-occurs with the
  placeholder being subject or object of a Freebase predicate, and picks the alignment with the
  highest smoothed log-probability (`score`). Two rules make it hold when several entity lists
  follow different verbs ("Did M0 marry M1 , M2 , and M3 and influence M4 and M5"): the context
  stops at a joiner ("," or "and"), since the words beyond it belong to the neighbouring phrase
  ("M3 and influence" would tie M3 to "influence"), and "executive" forms one word with the next
  ("executive produced by M0" vs "produced by M0"). The other members of a list share the
  pattern's property slot with the member that follows the verb, which decides for them. This is
  our reconstruction, not CFQ's.
  """

  #: Weight of the prior in the smoothed estimate (in observations; `score`).
  PRIOR_WEIGHT = 10.0

  def __init__(self) -> None:
    self.counts: dict[tuple[str, str], int] = collections.Counter()
    self.totals: dict[str, int] = collections.Counter()
    self.event_counts: dict[str, int] = collections.Counter()

  @staticmethod
  def _tokens(question: str) -> list[str]:
    """The question's words, "executive" joined to the next one ("executive produced" is one
    verb: without this, "executive produced by M0" and "produced by M0" have the same two words
    before M0)."""
    toks: list[str] = []
    for t in question.split():
      if toks and toks[-1] == "executive":
        toks[-1] += " " + t
      else:
        toks.append(t)
    return toks

  @classmethod
  def _features(cls, question: str, m: str) -> list[str]:
    """Context features of each occurrence of placeholder `m` in the question: "L1 w" (word
    before), "L2 w w" (two words before), "R2 w w" (two words after), none reaching past a joiner
    ("L1 ," and "R2 and" alone next to one), e.g. ["L1 marry", "L2 M0 marry", "R2 ,"] for M1 in
    "Did M0 marry M1 , M2"."""
    toks = cls._tokens(question)
    feats = []
    for i, t in enumerate(toks):
      if t == m:
        before, after = toks[max(0, i - 2):i], toks[i + 1:i + 3]
        # Past a joiner the words belong to another phrase: in "marry M1 , M2 , and M3 and
        # influence M4", "M3 and influence" says nothing about M3, whose verb is "marry".
        feats.append("L1 " + " ".join(before[-1:]))
        if not before or before[-1] not in _LIST_JOINERS:
          feats.append("L2 " + " ".join(before))
        if after and after[0] in _LIST_JOINERS:
          after = after[:1]
        feats.append("R2 " + " ".join(after))
    return feats

  @staticmethod
  def _events(query: ParsedQuery, consts: dict[str, str], m: str) -> list[str]:
    c = consts[m]
    out = []
    for cl in query.clauses:
      if cl.subject == c:
        out.append("s " + cl.predicate)
      if cl.object == c:
        out.append("o " + cl.predicate)
    return out

  def fit(self, records: Iterable[dict[str, Any]]) -> "ContextModel":
    """Counts features and events on the records whose question placeholders have one alignment
    (unique, or stated by `questionWithMids`/`sparqlPatternModEntities`); malformed records are
    ignored. Returns the model itself."""
    for rec in records:
      try:
        cands = placeholder_candidates(rec)
        qph = question_placeholders(rec["questionPatternModEntities"])
        query = parse_query(rec["sparql"])
      except (CfqFormatError, KeyError, TypeError, AttributeError):
        continue
      if len({tuple(c.get(m) for m in qph) for c in cands}) != 1:
        continue
      for m in qph:
        if m not in cands[0]:
          continue
        events = self._events(query, cands[0], m)
        self.event_counts.update(events)
        for f in self._features(rec["questionPatternModEntities"], m):
          for e in events:
            self.counts[(f, e)] += 1
            self.totals[f] += 1
    return self

  def score(self, record: dict[str, Any], consts: dict[str, str]) -> float:
    """Log-probability of an alignment (higher is better): the sum over the question placeholders'
    features f and events e of log P(e | f), estimated as (count(f, e) + w P(e)) / (count(f) + w)
    with the events' overall frequency P(e) as prior and w = `PRIOR_WEIGHT`, so that a feature
    seen a few times does not veto an event it happened not to meet."""
    qp = record["questionPatternModEntities"]
    query = parse_query(record["sparql"])
    seen = sum(self.event_counts.values())
    w = self.PRIOR_WEIGHT
    total = 0.0
    for m in question_placeholders(qp):
      for f in self._features(qp, m):
        for e in self._events(query, consts, m):
          prior = (self.event_counts.get(e, 0) + 1.0) / (seen + 1.0)
          total += math.log((self.counts.get((f, e), 0) + w * prior) / (self.totals.get(f, 0) + w))
    return total

  def choose(self, record: dict[str, Any], candidates: list[dict[str, str]]) -> dict[str, str]:
    """The best-scoring candidate (the first on ties)."""
    return max(candidates, key=lambda c: self.score(record, c))


def special_constants(q: ParsedQuery) -> set[str]:
  """Constants that are types (`?x a T`) or special entities (objects of gender/nationality)."""
  out = set()
  for c in q.clauses:
    if c.predicate == "a" or c.predicate in SPECIAL_ENTITY_PREDICATES:
      out.add(c.object)
    elif c.predicate.startswith("^") and c.predicate[1:] in SPECIAL_ENTITY_PREDICATES:
      out.add(c.subject)
  return {t for t in out if not is_variable(t)}


def _pattern_placeholders(p: ParsedQuery) -> set[str]:
  return {t for c in p.clauses for t in (c.subject, c.object) if is_placeholder(t)}


def _twin_classes(q: ParsedQuery) -> dict[str, tuple[str, ...]]:
  """Interchangeable tokens of a query: for each term or predicate that has a twin, its class.

  Two tokens are twins when exchanging them everywhere leaves the multiset of clauses unchanged
  (`M1` and `M2` in `?x0 P M1 . ?x0 P M2`); twins form classes, listed in sorted order. Alignments
  that differ by exchanging twins give the same query, so `_match_clauses` keeps only the one that
  uses each class in sorted order.
  """
  clauses = collections.Counter(q.clauses)
  tokens = sorted({t for c in q.clauses for t in (c.subject, c.object)}
                  | {c.predicate for c in q.clauses if c.predicate not in ("a", "!=")})
  out: dict[str, tuple[str, ...]] = {}
  for i, a in enumerate(tokens):
    if a in out:
      continue
    cls = [a]
    for b in tokens[i + 1:]:
      if b in out:
        continue
      swap = {a: b, b: a}
      s = lambda t, swap=swap: swap.get(t, t)  # noqa: E731
      swapped = collections.Counter(
          Clause(s(c.subject), s(c.predicate), s(c.object)) for c in q.clauses)
      if swapped == clauses:
        cls.append(b)
    if len(cls) > 1:
      for t in cls:
        out[t] = tuple(cls)
  return out


def _match_term(pat: str,
                term: str,
                binding: dict[str, str],
                used: set[str],
                forbid: dict[str, Any],
                twins: dict[str, tuple[str, ...]] | None = None) -> list[tuple[str, str]] | None:
  """Binding additions making pattern term `pat` match `term` (None = no match)."""
  if is_variable(pat) != is_variable(term):
    return None
  abstract = is_placeholder(pat) or is_variable(pat) or re.match(r"^P\d+$", pat)
  if not abstract:
    return [] if pat == term else None
  if pat in binding:
    return [] if binding[pat] == term else None
  if term in used or (pat in forbid and forbid[pat](term)):
    return None
  if twins and term in twins:  # Only the first unused twin: the others give the same query.
    if any(t not in used for t in twins[term][:twins[term].index(term)]):
      return None
  return [(pat, term)]


def _match_clauses(pats: list[Clause],
                   terms: list[Clause],
                   binding: dict[str, str],
                   used: set[str],
                   forbid: dict[str, Any],
                   twins: dict[str, tuple[str, ...]] | None = None) -> Iterator[dict[str, str]]:
  """Yields every bijection between pattern clauses and query clauses (as a binding).

  CFQ's `sparqlPattern` sorts clauses and may number variables differently from `sparql`, so
  placeholders, property slots and variables are all matched up to a consistent renaming. With
  `twins` (`_twin_classes` of the query), bijections that differ only by exchanging twins are
  yielded once; a repeated query clause is tried once per pattern clause.
  """
  if not pats:
    yield binding
    return
  pat, rest = pats[0], pats[1:]
  tried: set[Clause] = set()
  for i, c in enumerate(terms):
    if c.is_filter != pat.is_filter or c in tried:
      continue
    tried.add(c)
    b, u, ok = dict(binding), set(used), True
    for tp, tq in ((pat.subject, c.subject), (pat.predicate, c.predicate), (pat.object, c.object)):
      new = _match_term(tp, tq, b, u, forbid, twins)
      if new is None:
        ok = False
        break
      for k, v in new:
        b[k] = v
        u.add(v)
    if ok:
      yield from _match_clauses(rest, terms[:i] + terms[i + 1:], b, u, forbid, twins)


def question_placeholders(question_pattern: str) -> list[str]:
  """Placeholders `Mk` in a question pattern, in order of first occurrence."""
  seen: list[str] = []
  for tok in question_pattern.split():
    if is_placeholder(tok) and tok not in seen:
      seen.append(tok)
  return seen


def sparql_mod_entities(record: dict[str, Any],
                        where: str = "<record>",
                        context_model: ContextModel | None = None) -> ParsedQuery:
  """CFQ's `sparqlPatternModEntities`: the query with question entities replaced by `Mk`.

  The record's own `sparqlPatternModEntities` when it has one (full CFQ release; checked against
  `sparql` and `questionWithMids` by `exact_entity_constants`). Otherwise it is rebuilt from
  `sparql` and `placeholder_constants` (exact with `questionWithMids`, else chosen by
  `context_model`), with the clauses sorted by their text as CFQ sorts them, so that both ways
  give the same query in the same order (MCWQ keeps CFQ's clause order). Types and special entities
  (constants not mentioned in the question) stay as Freebase constants.

  Raises:
    CfqFormatError: see `placeholder_constants`, or a question placeholder absent from the query.
  """
  text = _exact_field(record, "sparqlPatternModEntities", where)
  if text is not None:
    exact_entity_constants(record, where)
    return parse_query(text, where + " (sparqlPatternModEntities)")
  consts = placeholder_constants(record, where, context_model)
  qph = question_placeholders(record["questionPatternModEntities"])
  missing = [m for m in qph if m not in consts]
  if missing:
    raise CfqFormatError(f"{where}: question placeholders {missing} not in sparqlPattern")
  back = {consts[m]: m for m in qph}
  q = parse_query(record["sparql"], where)
  sub = lambda t: back.get(t, t)  # noqa: E731
  clauses = [Clause(sub(c.subject), c.predicate, sub(c.object)) for c in q.clauses]
  return ParsedQuery(q.prefix, tuple(sorted(clauses, key=Clause.text)))


def validate_record(record: Any, where: str) -> None:
  """Checks that a CFQ record has the keys and types the migration needs (`REQUIRED_KEYS` strings;
  `EXACT_KEYS`, when present, strings or null).

  Raises:
    CfqFormatError: naming `where` and the problem.
  """
  if not isinstance(record, dict):
    raise CfqFormatError(f"{where}: record is {type(record).__name__}, not an object")
  for k in REQUIRED_KEYS:
    if k not in record:
      raise CfqFormatError(f"{where}: missing key {k!r}")
  for k in REQUIRED_KEYS[1:]:
    if not isinstance(record[k], str):
      raise CfqFormatError(f"{where}: {k} is not a string")
  for k in EXACT_KEYS:
    _exact_field(record, k, where)


def load_records(paths: Sequence[str | pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
  """Yields `(where, record)` for every record of CFQ JSON array files, in file order.

  `where` is `FILE:questionIdx=N` (or `FILE:#i` when the index is missing) for error reporting.
  Records are NOT validated here (see `validate_record`), so callers can report and skip bad ones.

  Raises:
    CfqFormatError: a file is not a JSON array.
  """
  for path in paths:
    path = pathlib.Path(path)
    with path.open(encoding="utf-8") as f:
      try:
        data = json.load(f)
      except json.JSONDecodeError as e:
        raise CfqFormatError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
    if not isinstance(data, list):
      raise CfqFormatError(f"{path}:1: expected a JSON array of CFQ records")
    for i, rec in enumerate(data):
      idx = rec.get("questionIdx") if isinstance(rec, dict) else None
      yield (f"{path.name}:questionIdx={idx}" if idx is not None else f"{path.name}:#{i}"), rec


def read_mcwq_official(files: Iterable[str | pathlib.Path]) -> dict[str, str]:
  """Reads MCWQ `official/*/*.en.txt` files into {question pattern: SPARQL}.

  Format: one example per line, `IN: <question>  OUT: <sparql>` (two spaces before `OUT:`), read
  with `mcwq_t5x.data.readers.read_official` (question stripped, query whitespace-collapsed).

  Raises:
    mcwq_t5x.data.paths.DataNotFoundError: a file does not exist.
    mcwq_t5x.data.readers.DataFormatError: `FILE:LINE` of a malformed line, or of a question with two
      different queries.
  """
  out: dict[str, str] = {}
  for path in files:
    for ex in readers.read_official(path):
      if out.setdefault(ex.question, ex.sparql) != ex.sparql:
        raise readers.DataFormatError(path, ex.line,
                                      f"question {ex.question!r} has two different queries")
  return out
