"""Execution accuracy: a predicted query is right when it has the gold query's answers on a SPARQL
store (not a metric of the MCWQ paper, which reports exact match, §5.2).

Needs a release with entity substitution (§3.2): the `{"M0": "Q42", ...}` assignment of each
example in `dataset.json` (`preprocessing.migrate`). Queries are sent as ASK or SELECT DISTINCT
(W3C SPARQL 1.1 Query §16.3, §16.1), rebuilt term by term from the parsed prediction (`?var`,
`wd:Q<n>`, `wdt:P<n>` paths only; anything else is "invalid_term"). Outcomes per example are
`OUTCOMES`; examples without an assignment ("not_executable") or whose gold query fails
("gold_error") leave the denominator, and with none left the accuracy is None, never 0.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
from typing import Any, Mapping, Optional, Sequence, Union

from mcwq_t5x.data import readers
from mcwq_t5x.data import sparql as sparql_lib
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.stores import endpoint as ep

PathLike = Union[str, pathlib.Path]

# Per-example outcomes; the first three are scored, the last two are left out of the denominator.
CORRECT = "correct"
WRONG_ANSWER = "wrong_answer"
SYNTAX_ERROR = "syntax_error"
INVALID_TERM = "invalid_term"
ENDPOINT_ERROR = "endpoint_error"
NOT_EXECUTABLE = "not_executable"
GOLD_ERROR = "gold_error"
SCORED_OUTCOMES = (CORRECT, WRONG_ANSWER, SYNTAX_ERROR, INVALID_TERM, ENDPOINT_ERROR)
OUTCOMES = SCORED_OUTCOMES + (NOT_EXECUTABLE, GOLD_ERROR)

DEFAULT_MAX_ANSWERS = 10000

_VARIABLE_RE = re.compile(r"^\?[A-Za-z_][A-Za-z0-9_]{0,63}$")
_PLACEHOLDER_RE = re.compile(r"^M[0-9]+$")


def _qid(value: Any) -> str:
  """`value` if it is exactly a Wikidata item id `Q<n>` (no trailing newline), else ValueError."""
  if not isinstance(value, str) or not ep.QID_RE.fullmatch(value):
    raise ValueError(f"not a Wikidata item id: {value!r}")
  return value


def _pid(value: str) -> str:
  """`value` if it is exactly a Wikidata property id `P<n>`, else ValueError."""
  if not isinstance(value, str) or not ep.PID_RE.fullmatch(value):
    raise ValueError(f"not a Wikidata property id: {value!r}")
  return value


class UnsafeQueryError(ValueError):
  """A parsed query has a term that may not be sent to a store (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class ReleaseQuery:
  """The gold query of one release example: `pattern` (`sparqlPatternModEntities`, one line),
  validated `entities` {placeholder: Q-id} (None: no assignment), `source` dataset.json, 0-based
  `index` and 1-based `line` of the record."""
  pattern: str
  entities: Optional[dict[str, str]]
  source: str = ""
  index: int = 0
  line: int = 0


@dataclasses.dataclass(frozen=True)
class Answer:
  """One query's answer: `form` "ask" | "select"; `value` a bool, or a frozenset of the selected
  variable's values (`wd:Q42`, a literal's lexical form, None if unbound); `truncated` when the
  store had more than `max_answers` values."""
  form: str
  value: Union[bool, frozenset]
  truncated: bool = False

  def same_as(self, other: "Answer") -> bool:
    """True iff both are complete answers of the same form with equal values."""
    return (self.form == other.form and not self.truncated and not other.truncated and
            self.value == other.value)

  def to_json(self) -> Any:
    """The answer as JSON: a bool, or a sorted list of values (None last)."""
    if self.form == "ask":
      return bool(self.value)
    return sorted(self.value, key=lambda v: (v is None, v or ""))


def _record_line(path: pathlib.Path, index: int) -> int:
  """1-based line of record `index` of a dataset.json array (1 when it cannot tell)."""
  return readers._array_element_line(path, None, index)  # pylint: disable=protected-access


def _index_line(path: pathlib.Path, key: str, index: int) -> int:
  """1-based line of element `index` of the array `key` of a split file (1 when unknown)."""
  return readers._array_element_line(path, key, index)  # pylint: disable=protected-access


def _load_json(path: pathlib.Path) -> Any:
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no such file (a release folder as written by "
                            "`python -m preprocessing.migrate --out DIR` is expected)")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise readers.DataFormatError(path, e.lineno, f"bad JSON ({e.msg} at column {e.colno})") from e
  except UnicodeDecodeError as e:
    raise readers.DataFormatError(path, 1, f"not valid UTF-8 ({e.reason})") from e


def check_entities(entities: Any) -> dict[str, str]:
  """{placeholder: Q-id} of an assignment `{"M0": "Q42" or "wd:Q42", ...}`.

  ValueError: not a mapping, a key not `M<k>`, or a value not a Wikidata item id.
  """
  if not isinstance(entities, dict):
    raise ValueError(f"entities must be an object {{\"M0\": \"Q42\"}}, got {entities!r}")
  out = {}
  for m, q in entities.items():
    if not isinstance(m, str) or not _PLACEHOLDER_RE.fullmatch(m):
      raise ValueError(f"entity key {m!r} is not a placeholder M0, M1, ...")
    if not isinstance(q, str):
      raise ValueError(f"entity {m} is {q!r}, not a Wikidata item id")
    out[m] = _qid(q.removeprefix("wd:"))
  return out


def entities_from_sparql(pattern: str, query: str) -> Optional[dict[str, str]]:
  """{placeholder: Q-id} read token by token off `pattern` (`sparqlPatternModEntities`) and `query`
  (the record's `sparql`); None when they do not align."""
  a, b = pattern.split(), query.split()
  if len(a) != len(b):
    return None
  out: dict[str, str] = {}
  for x, y in zip(a, b):
    if x == y:
      continue
    if not _PLACEHOLDER_RE.fullmatch(x) or not y.startswith("wd:"):
      return None
    try:
      qid = _qid(y[3:])
    except ValueError:
      return None
    if out.setdefault(x, qid) != qid:
      return None
  return out


def load_release_queries(release_dir: PathLike, split: str, part: str) -> list[ReleaseQuery]:
  """One `ReleaseQuery` per index of `splits/{split}.json`'s `{part}Idxs`, in order (the order of
  `official/{split}/{part}.*.txt`), from `release_dir/dataset.json`.

  Raises FileNotFoundError (a file missing), ValueError (unknown part), readers.DataFormatError
  naming the file and line (bad JSON or index, a record without a parseable
  `sparqlPatternModEntities`, malformed `entities`).
  """
  if part not in readers.PARTS:
    raise ValueError(f"unknown part {part!r}; expected one of {readers.PARTS}")
  root = pathlib.Path(release_dir)
  dataset_path, split_path = root / "dataset.json", root / "splits" / f"{split}.json"
  split_obj = _load_json(split_path)
  key = f"{part}Idxs"
  if not isinstance(split_obj, dict) or not isinstance(split_obj.get(key), list):
    raise readers.DataFormatError(split_path, 1, f"expected an object with an index list {key!r}")
  dataset = _load_json(dataset_path)
  if not isinstance(dataset, list):
    raise readers.DataFormatError(dataset_path, 1, "expected a JSON array of records")
  out = []
  for k, idx in enumerate(split_obj[key]):
    if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(dataset):
      raise readers.DataFormatError(
          split_path, _index_line(split_path, key, k),
          f"{key}[{k}] = {idx!r} is not an index into {dataset_path} ({len(dataset)} records)")
    record = dataset[idx]
    pattern = record.get("sparqlPatternModEntities") if isinstance(record, dict) else None
    if not isinstance(pattern, str):
      raise readers.DataFormatError(dataset_path, _record_line(dataset_path, idx),
                                    f"record {idx} has no string 'sparqlPatternModEntities'")
    pattern = " ".join(pattern.split())
    entities = record.get("entities")
    if "entities" not in record and isinstance(record.get("sparql"), str):
      entities = entities_from_sparql(pattern, record["sparql"])
    try:
      sparql_lib.parse_sparql(pattern)
      if entities is not None:
        entities = check_entities(entities)
    except ValueError as e:
      raise readers.DataFormatError(dataset_path, _record_line(dataset_path, idx),
                                    f"record {idx}: {e}") from None
    out.append(ReleaseQuery(pattern, entities, str(dataset_path), idx, idx + 1))
  return out


# ----------------------------------------------------------------------------------------------
# Building safe SPARQL from a parsed query.


def _term(term: str, entities: Mapping[str, str]) -> str:
  """A subject/object/filter term as sent to the store (see the module docstring)."""
  if _VARIABLE_RE.fullmatch(term):
    return term
  if _PLACEHOLDER_RE.fullmatch(term):
    if term not in entities:
      raise UnsafeQueryError(f"placeholder {term} has no entity in this example")
    return "wd:" + _qid(entities[term])
  if term.startswith("wd:"):
    try:
      return "wd:" + _qid(term[3:])
    except ValueError:
      pass
  raise UnsafeQueryError(f"refusing to send term {term!r} (expected ?var, M<k> or wd:Q<n>)")


def _predicate(predicate: str) -> str:
  """A predicate `wdt:P<n>` or alternative path `wdt:P<n>|wdt:P<m>`, validated."""
  parts = predicate.split("|")
  for p in parts:
    try:
      if not p.startswith("wdt:"):
        raise ValueError(p)
      _pid(p[4:])
    except ValueError:
      raise UnsafeQueryError(f"refusing to send predicate {predicate!r} "
                             "(expected wdt:P<n> or wdt:P<n>|wdt:P<m>)") from None
  return "|".join(parts)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """A query split into connected components (validated SPARQL terms only)."""
  form: str
  variable: Optional[str]
  components: tuple[tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]], ...]
  unsatisfiable: bool


def _plan(query: sparql_lib.Query, entities: Mapping[str, str]) -> _Plan:
  """Validates `query`, binds its placeholders and splits it into connected components.

  Raises UnsafeQueryError: an invalid term, a placeholder without entity, an unsupported form.
  """
  if query.prefix == sparql_lib.ASK:
    form, variable = "ask", None
  else:
    match = re.fullmatch(r"SELECT DISTINCT (\?[A-Za-z_][A-Za-z0-9_]*) WHERE", query.prefix)
    if match is None:
      raise UnsafeQueryError(f"unsupported query form {query.prefix!r} (ASK or SELECT DISTINCT)")
    form, variable = "select", _term(match.group(1), entities)
  triples = [(_term(t.subject, entities), _predicate(t.predicate), _term(t.object, entities))
             for t in query.triples]
  filters = [(_term(f.left, entities), _term(f.right, entities)) for f in query.filters]
  for f in query.filters:
    if f.op != "!=":
      raise UnsafeQueryError(f"unsupported filter operator {f.op!r}")
  # Union-find over variables; triples and filters join the variables they mention.
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    while parent.setdefault(x, x) != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  def variables(terms: Sequence[str]) -> list[str]:
    return [t for t in terms if t.startswith("?")]

  triple_vars = {v for s, _, o in triples for v in variables((s, o))}
  unsatisfiable = False
  for clause in [(s, o) for s, _, o in triples] + filters:
    vs = variables(clause)
    for v in vs[1:]:
      parent[find(vs[0])] = find(v)
  groups: dict[Any, tuple[list, list]] = collections.OrderedDict()
  for n, (s, p, o) in enumerate(triples):
    vs = variables((s, o))
    groups.setdefault(find(vs[0]) if vs else ("ground triple", n), ([], []))[0].append((s, p, o))
  for n, (a, b) in enumerate(filters):
    vs = variables((a, b))
    if any(v not in triple_vars for v in vs):
      unsatisfiable = True  # An unbound variable in a filter: an error, so no solution (§17.2).
      continue
    groups.setdefault(find(vs[0]) if vs else ("ground filter", n),
                      ([], []))[1].append(f"FILTER ( {a} != {b} )")
  # why: a prediction of two unconnected patterns must not enumerate their cross product; the
  # answers are those of the unsplit query.
  components = tuple((tuple(ts), tuple(fs)) for ts, fs in groups.values())
  return _Plan(form, variable, components, unsatisfiable)


def _body(triples: Sequence[tuple[str, str, str]], filters: Sequence[str],
          counts: Optional[dict[str, int]]) -> str:
  # Rarest predicate first where the store knows the counts: pyoxigraph joins in the written order.
  ordered = ep.order_triples(list(triples), counts)
  return " . ".join([" ".join(t) for t in ordered] + list(filters))


@dataclasses.dataclass(frozen=True)
class _Requests:
  """What `execute` sends for one query: ASKs of the components without the selected variable,
  then (SELECT) the query of the component with it (None when no triple has it)."""
  form: str
  variable: Optional[str]
  asks: tuple[str, ...]
  select: Optional[str]
  unsatisfiable: bool


def _requests(query: sparql_lib.Query, entities: Mapping[str, str],
              counts: Optional[dict[str, int]], max_answers: int) -> _Requests:
  plan = _plan(query, entities)
  asks, select = [], None
  for ts, fs in plan.components:
    if plan.variable is not None and any(plan.variable in (s, o) for s, _, o in ts):
      select = (f"SELECT DISTINCT {plan.variable} WHERE {{ {_body(ts, fs, counts)} }} "
                f"LIMIT {int(max_answers) + 1}")
    else:
      asks.append(f"ASK WHERE {{ {_body(ts, fs, counts)} }}")
  return _Requests(plan.form, plan.variable, tuple(asks), select, plan.unsatisfiable)


def execute(query: sparql_lib.Query,
            entities: Mapping[str, str],
            endpoint: ep.Endpoint,
            max_answers: int = DEFAULT_MAX_ANSWERS) -> Answer:
  """The `Answer` of `query` with its placeholders bound to `entities`, run on `endpoint`.

  Raises UnsafeQueryError (a term not `?var`, a bound placeholder, `wd:Q<n>` or a `wdt:P<n>` path;
  a form other than ASK / SELECT DISTINCT ?var), stores.endpoint.EndpointError (the store failed).
  """
  req = _requests(query, entities, endpoint.predicate_counts(), max_answers)
  empty = Answer(req.form, False if req.form == "ask" else frozenset())
  if req.unsatisfiable:
    return empty
  for ask in req.asks:
    # A component without the selected variable that is false: no answers.
    if not endpoint.ask(ask):
      return empty
  if req.form == "ask":
    return Answer("ask", True)
  if req.select is None:  # The selected variable is in no triple: one solution, unbound.
    return Answer("select", frozenset({None}))
  rows = endpoint.select(req.select)
  name = req.variable[1:]
  # A truncated answer is never equal to another (`Answer.same_as`).
  values = frozenset(r.get(name) for r in rows[:max_answers])
  return Answer("select", values, truncated=len(rows) > max_answers)


# ----------------------------------------------------------------------------------------------
# Scoring.


@dataclasses.dataclass
class ExecutionScores:
  """One of `OUTCOMES` per example, in input order, and the failed requests' (number, message)."""
  outcomes: list[str]
  endpoint_errors: list[tuple[int, str]] = dataclasses.field(default_factory=list)

  def summary(self) -> dict[str, Any]:
    """{"execution_accuracy": 100 * correct / n, "execution": {"n", "correct", "outcomes", ...}}.

    n counts `SCORED_OUTCOMES`; the accuracy is None when n == 0 (see `undefined_reason`).
    """
    counts = collections.Counter(self.outcomes)
    n = sum(counts[o] for o in SCORED_OUTCOMES)
    return {
        # why None: a dead store must not read as a model that is always wrong.
        "execution_accuracy": 100.0 * counts[CORRECT] / n if n else None,
        "execution": {
            "n": n,
            "correct": counts[CORRECT],
            "outcomes": {
                o: counts[o] for o in OUTCOMES
            },
            "endpoint_errors": [f"example {i}: {m}" for i, m in self.endpoint_errors[:5]]
        }
    }

  def undefined_reason(self) -> Optional[str]:
    """Why execution accuracy is undefined (no scored example), or None when it is defined."""
    counts = collections.Counter(self.outcomes)
    if any(counts[o] for o in SCORED_OUTCOMES):
      return None
    if counts[GOLD_ERROR]:
      first = next(m for _, m in self.endpoint_errors if m.startswith("gold: "))
      return (f"the gold query of every executable example failed on the store "
              f"({counts[GOLD_ERROR]} examples; the first error: {first[len('gold: '):]})")
    if counts[NOT_EXECUTABLE]:
      return (f"no example has an entity assignment ({counts[NOT_EXECUTABLE]} examples are "
              "not executable)")
    return "there are no examples"


def score_execution(examples: Sequence[ReleaseQuery],
                    predictions: Sequence[metrics.Text],
                    endpoint: ep.Endpoint,
                    fmt: str = metrics.RIR,
                    max_answers: int = DEFAULT_MAX_ANSWERS) -> ExecutionScores:
  """`ExecutionScores` of line-parallel predictions (format `fmt`, anything) against `examples`.

  Malformed predictions are wrong, never an exception. Raises ValueError: lengths differ, unknown
  `fmt`, or a gold query with a term that cannot be sent (names dataset.json and the line).
  """
  if len(examples) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions but {len(examples)} gold queries: "
                     "they must be line-parallel")
  if fmt not in metrics.FORMATS:
    raise ValueError(f"unknown query format {fmt!r}; expected one of {metrics.FORMATS}")
  scores = ExecutionScores([])
  gold_answers: dict[tuple, Any] = {}
  for number, (example, prediction) in enumerate(zip(examples, predictions), start=1):
    if example.entities is None:
      # No satisfying assignment was found (§3.2): out of the denominator.
      scores.outcomes.append(NOT_EXECUTABLE)
      continue
    gold = sparql_lib.parse_sparql(example.pattern)
    key = (gold.canonical(), tuple(sorted(example.entities.items())))
    if key not in gold_answers:
      try:
        gold_answers[key] = execute(gold, example.entities, endpoint, max_answers)
      except UnsafeQueryError as e:
        raise ValueError(f"{example.source}:{example.line}: gold query of record {example.index} "
                         f"cannot be executed: {e}") from None
      except ep.EndpointError as e:
        gold_answers[key] = e
    gold_answer = gold_answers[key]
    if isinstance(gold_answer, ep.EndpointError):
      scores.outcomes.append(GOLD_ERROR)
      scores.endpoint_errors.append((number, f"gold: {gold_answer}"))
      continue
    parsed = metrics.parse_query(prediction, fmt)
    if parsed is None:
      scores.outcomes.append(SYNTAX_ERROR)
      continue
    if gold.equivalent(parsed):  # why: correct without a request
      scores.outcomes.append(CORRECT)
      continue
    try:
      answer = execute(parsed, example.entities, endpoint, max_answers)
    except UnsafeQueryError:
      scores.outcomes.append(INVALID_TERM)
      continue
    except ep.EndpointError as e:
      scores.outcomes.append(ENDPOINT_ERROR)
      scores.endpoint_errors.append((number, str(e)))
      continue
    scores.outcomes.append(CORRECT if answer.same_as(gold_answer) else WRONG_ANSWER)
  return scores
