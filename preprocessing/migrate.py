r"""Migrates CFQ to Wikidata: the MCWQ dataset-creation pipeline (Cui et al., TACL 2022, §3).

  python -m preprocessing.migrate --out /tmp/mcwq_sample
  python -m preprocessing.migrate --cfq cfq/dataset.json --cfq-split cfq/splits/mcd1.json \
      --endpoint remote --rate 1.0 --require-assignment --out out/

Reads CFQ records (malformed ones reported by questionIdx and skipped), migrates each query
with the property mapping (§3.1), finds and substitutes a satisfying entity assignment on a
SPARQL endpoint (§3.2; `--endpoint oxigraph|remote|none`, `--timeout` per query), samples a
verified negative per yes/no question (§3.2), and writes a release: `dataset.json` (CFQ's keys;
with an assignment also `sparql`, `entities` {"M0": "Q42"}, `expectedResponse`, else null),
`splits/{NAME}.json` (parts from the input file names, or `--cfq-split`), `official/{NAME}/
{part}.en.txt`, `negatives.json`, `report.json` (counts, `mcwq_conformance` with `--mcwq`) and
`cache/endpoint.jsonl` (append-only: a rerun resumes; timeouts not re-run without
`--retry-timeouts`).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import pathlib
import re
import sys
from typing import Any, Sequence

from tqdm import tqdm

from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from mcwq_t5x.data import sparql as sparql_lib
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import endpoint as ep
from mcwq_t5x.stores import flags as store_flags
from preprocessing import cfq, mapping as mp, substitute as sb

_REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CFQ = [
    str(_REPO.parent / "shared" / "cfq" / f"cfq_sample_{p}.json") for p in ("train", "dev")
]
DEFAULT_CODEX = str(_REPO.parent / "shared" / "wikidata" / "codex-m")
DEFAULT_MCWQ = str(_REPO.parent / "shared" / "mcwq" / "official")
PARTS = ("train", "dev", "test")

_log = logging.getLogger(__name__)


def part_of_file(name: str) -> str:
  """Split part implied by an input file name (`*train*`, `*dev*`/`*valid*`, `*test*`)."""
  n = name.lower()
  if "dev" in n or "valid" in n:
    return "dev"
  if "test" in n:
    return "test"
  return "train"


def sparql_pattern(q: mp.Migrated) -> str:
  """CFQ-style `sparqlPattern`: entities -> M0…, properties -> P0… by first occurrence."""
  ents: dict[str, str] = {}
  props: dict[str, str] = {}

  def t(x: str) -> str:
    if cfq.is_variable(x):
      return x
    return ents.setdefault(x, f"M{len(ents)}")

  clauses = []
  for c in q.clauses:
    if c.is_filter:
      clauses.append(cfq.Clause(t(c.subject), "!=", t(c.object)))
    else:
      s = t(c.subject)
      p = props.setdefault(c.predicate, f"P{len(props)}")
      clauses.append(cfq.Clause(s, p, t(c.object)))
  return cfq.ParsedQuery(q.prefix, tuple(clauses)).to_sparql()


def make_endpoint(args: argparse.Namespace) -> ep.Endpoint | None:
  """Builds the endpoint named by the command line (None for `--endpoint none`)."""
  if args.endpoint == "none":
    return None
  inner = store_flags.endpoint_from_arguments(args, embedded_timeout=True, allow_empty=True)
  cache = args.cache or os.path.join(args.out, "cache", "endpoint.jsonl")
  return cache_lib.CachedEndpoint(inner, cache, retry_timeouts=args.retry_timeouts)


def mcwq_conformance(migrated: Sequence[dict[str, Any]], mcwq_official: str) -> dict[str, Any]:
  """How many migrated records give exactly MCWQ's query, where MCWQ has their question.

  `migrated`: records {`rec`: CFQ record, `q`: migrated query}; `mcwq_official`: an `official/`
  folder whose `*/*.en.txt` give MCWQ's query per English question pattern. Returns {"mcwq",
  "question pattern in MCWQ": records found there, "same query": of those, string-equal}.

  Raises:
    DataNotFoundError / DataFormatError: as `cfq.read_mcwq_official` (a missing folder: no files).
  """
  files = sorted(pathlib.Path(mcwq_official).glob("*/*.en.txt"))
  if not files:
    raise paths.not_found(
        pathlib.Path(mcwq_official) / "*/*.en.txt", "MCWQ official English files (--mcwq)")
  queries = cfq.read_mcwq_official(files)
  matched = [m for m in migrated if m["rec"]["questionPatternModEntities"] in queries]
  same = sum(m["q"].to_sparql() == queries[m["rec"]["questionPatternModEntities"]] for m in matched)
  return {"mcwq": str(mcwq_official), "question pattern in MCWQ": len(matched), "same query": same}


def run(args: argparse.Namespace, endpoint: ep.Endpoint | None = None) -> dict[str, Any]:
  """The report dict (also report.json) of the pipeline on `args`; `endpoint` overrides
  `make_endpoint(args)` (tests inject counting or failing ones).

  dataset.json keys: questionIdx (CFQ's), cfqFile, questionPatternModEntities,
  sparqlPatternModEntities, sparqlPattern, recursionDepth; with an assignment questionWithMids,
  questionWithBrackets, sparql (`wd:Q…`), entities, expectedResponse ("True" for yes/no, answers
  joined by "; " for wh-), else null. report.json: records read, malformed, migrated, skipped by
  reason, entity alignment (`cfq.alignment_source`), assigned, negatives, endpoint requests,
  cache hits and timeouts.
  """
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  mapping = mp.load_mapping(args.mapping)
  report: dict[str, Any] = collections.OrderedDict()
  counts: collections.Counter = collections.Counter()
  malformed: list[str] = []

  # 1. Read.
  raw = list(cfq.load_records(args.cfq))
  if args.max_records:
    raw = raw[:args.max_records]
  good: list[tuple[int, str, str, dict[str, Any]]] = []  # (input position, file, where, record)
  for pos, (where, rec) in enumerate(raw):
    try:
      cfq.validate_record(rec, where)
      cfq.parse_query(rec["sparql"], where)
    except cfq.CfqFormatError as e:
      malformed.append(str(e))
      continue
    good.append((pos, where.split(":", 1)[0], where, rec))
  counts["read"] = len(raw)
  model = cfq.ContextModel().fit(r for _, _, _, r in good)

  # 2. Migrate.
  migrated: list[dict[str, Any]] = []
  skipped: collections.Counter = collections.Counter()
  alignment: collections.Counter = collections.Counter()
  for pos, fname, where, rec in tqdm(good, desc="migrate", unit="rec", disable=args.quiet):
    try:
      qp, q = mp.migrate_record(rec, mapping, where, model)
    except mp.SkipRecord as e:
      skipped[e.reason] += 1
      continue
    except (cfq.CfqFormatError, sparql_lib.SparqlParseError) as e:
      malformed.append(str(e))
      continue
    migrated.append({"pos": pos, "file": fname, "rec": rec, "qp": qp, "q": q})
    alignment[cfq.alignment_source(rec, where)] += 1
  counts["migrated"] = len(migrated)
  if args.mcwq:
    report["mcwq_conformance"] = mcwq_conformance(migrated, args.mcwq)

  # 3. Entity substitution.
  endpoint = endpoint if endpoint is not None else make_endpoint(args)
  assigned = 0
  if endpoint is not None:
    for m in tqdm(migrated, desc="substitute", unit="query", disable=args.quiet):
      try:
        if sb.placeholders(m["q"]):
          cands = sb.find_assignments(m["q"], endpoint, args.limit)
        else:  # no entity to substitute: kept when the query has an answer
          cands = [{}] if sb.satisfiable(m["q"], endpoint) else []
      except ep.EndpointError as e:
        counts["endpoint errors"] += 1
        _log.warning("questionIdx=%s: %s", m["rec"]["questionIdx"], e)
        continue
      m["assignment"] = sb.choose(cands, args.seed * 1000003 + int(m["rec"]["questionIdx"]))
      assigned += m["assignment"] is not None
  counts["assigned"] = assigned

  # 4. Negatives for yes/no questions.
  negatives = []
  if endpoint is not None and not args.no_negatives:
    pool = sb.EntityPool()
    for i, m in enumerate(migrated):
      if m.get("assignment"):
        pool.add(i, m["q"], m["assignment"])
    asks = [(i, m)
            for i, m in enumerate(migrated)
            if m.get("assignment") is not None and m["q"].prefix == "ASK WHERE"]
    for i, m in tqdm(asks, desc="negatives", unit="query", disable=args.quiet):
      try:
        neg = sb.sample_negative(i, m["q"], m["assignment"], pool, endpoint,
                                 args.seed * 1000003 + int(m["rec"]["questionIdx"]) + 1,
                                 args.negative_tries)
      except ep.EndpointError as e:
        counts["endpoint errors"] += 1
        _log.warning("questionIdx=%s: %s", m["rec"]["questionIdx"], e)
        continue
      if neg is not None:
        m["negative"] = neg[0]
        negatives.append(m)
  counts["yes/no with assignment"] = sum(
      1 for m in migrated if m.get("assignment") is not None and m["q"].prefix == "ASK WHERE")
  counts["negatives"] = len(negatives)

  # 5. Labels and answers.
  labels: dict[str, str] = {}
  answers: dict[int, list[str]] = {}
  if endpoint is not None:
    for i, m in enumerate(tqdm(migrated, desc="answers", unit="query", disable=args.quiet)):
      if m.get("assignment") is not None and m["q"].prefix != "ASK WHERE":
        try:
          rows = endpoint.select(
              sb.answers_query(m["q"], m["assignment"], counts=endpoint.predicate_counts()))
        except ep.EndpointError as e:  # e.g. a timeout: written without assignment, not unanswered
          counts["endpoint errors"] += 1
          counts["assigned"] -= 1
          m["assignment"] = None
          _log.warning("questionIdx=%s: %s", m["rec"]["questionIdx"], e)
          continue
        answers[i] = sb.qids(r.get("x0", "") for r in rows)
    want = set()
    for i, m in enumerate(migrated):
      for a in (m.get("assignment"), m.get("negative")):
        if a:
          want.update(sb.qids(a.values()))
      want.update(answers.get(i, []))
    if want:
      labels = endpoint.labels(sorted(want), args.label_language)
  counts["entities without label"] = sum(
      1 for q in {
          x for m in migrated for a in (m.get("assignment"), m.get("negative"))
          if a for x in sb.qids(a.values())
      } if q not in labels)

  # 6. Write.
  def record(i: int, m: dict[str, Any], assignment: dict[str, str] | None,
             response: Any) -> dict[str, Any]:
    rec, q = m["rec"], m["q"]
    r = {
        "questionIdx": rec["questionIdx"],
        "cfqFile": m["file"],
        "questionPatternModEntities": m["qp"],
        "sparqlPatternModEntities": q.to_sparql(),
        "sparqlPattern": sparql_pattern(q),
        "recursionDepth": rec.get("recursionDepth"),
        "questionWithMids": None,
        "questionWithBrackets": None,
        "sparql": None,
        "entities": None,
        "expectedResponse": None
    }
    if assignment is not None:
      mids, br = sb.fill_question(m["qp"], assignment, labels)
      r.update(
          questionWithMids=mids,
          questionWithBrackets=br,
          sparql=sb.substituted_sparql(q, assignment),
          entities={
              k: v.removeprefix("wd:") for k, v in assignment.items()
          },
          expectedResponse=response)
    return r

  records = []
  index_of_pos: dict[int, int] = {}
  for i, m in enumerate(migrated):
    if args.require_assignment and m.get("assignment") is None:
      continue
    if m["q"].prefix == "ASK WHERE":
      resp = "True"
    else:
      resp = "; ".join(labels.get(a, a) for a in answers.get(i, []))
    index_of_pos[m["pos"]] = len(records)
    records.append(record(i, m, m.get("assignment"), resp))
  negs = []
  for m in negatives:
    if m["pos"] not in index_of_pos:
      continue
    r = record(0, m, m["negative"], "False")
    r["negativeOf"] = index_of_pos[m["pos"]]
    negs.append(r)
  counts["written"] = len(records)

  splits: dict[str, dict[str, list[int]]] = {}
  by_part = {p: [] for p in PARTS}
  for m in migrated:
    if m["pos"] in index_of_pos:
      by_part[part_of_file(m["file"])].append(index_of_pos[m["pos"]])
  splits[args.split_name] = {f"{p}Idxs": v for p, v in by_part.items()}
  for path in args.cfq_split or ():
    obj = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    splits[pathlib.Path(path).stem] = {
        f"{p}Idxs": [
            index_of_pos[int(k)] for k in obj.get(f"{p}Idxs", []) if int(k) in index_of_pos
        ] for p in PARTS
    }

  _write_json(out / "dataset.json", records)
  _write_json(out / "negatives.json", negs)
  for name, sp in splits.items():
    _write_json(out / "splits" / f"{name}.json", sp)
    for p in PARTS:
      idxs = sp[f"{p}Idxs"]
      if not idxs:
        continue
      d = out / "official" / name
      d.mkdir(parents=True, exist_ok=True)
      with open(d / f"{p}.en.txt", "w", encoding="utf-8") as f:
        for k in idxs:
          f.write(
              readers.format_official_line(records[k]["questionPatternModEntities"], records[k]
                                           ["sparqlPatternModEntities"]) + "\n")

  report.update(counts)
  report["skipped"] = dict(skipped)
  report["alignment"] = dict(alignment)
  report["malformed"] = len(malformed)
  report["malformed_records"] = malformed
  if isinstance(endpoint, cache_lib.CachedEndpoint):
    report["endpoint_cache_hits"] = endpoint.hits
    report["endpoint_requests"] = endpoint.misses
    report["endpoint_timeouts"] = endpoint.timeouts
  report["splits"] = {n: {k: len(v) for k, v in sp.items()} for n, sp in splits.items()}
  _write_json(out / "report.json", report)
  return report


def _write_json(path: pathlib.Path, obj: Any) -> None:
  """Writes atomically (temporary file + rename), so a kill never leaves a half file."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
  os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
  """The command line (documented in the module docstring)."""
  ap = argparse.ArgumentParser(
      prog="python -m preprocessing.migrate",
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--cfq", nargs="+", default=DEFAULT_CFQ, help="CFQ dataset JSON file(s)")
  ap.add_argument("--out", required=True, help="output folder")
  ap.add_argument("--mapping", default=str(mp.DEFAULT_MAPPING), help="property mapping JSON")
  ap.add_argument("--endpoint", choices=("oxigraph", "remote", "none"), default="oxigraph")
  ap.add_argument(
      "--codex",
      default=DEFAULT_CODEX,
      help="CoDEx folder loaded into the embedded store ('' for none)")
  ap.add_argument("--ntriples", nargs="*", help="N-Triples files loaded into the embedded store")
  store_flags.add_endpoint_arguments(ap, embedded_timeout=True, max_retry_after=True)
  ap.add_argument(
      "--retry-timeouts", action="store_true", help="re-run queries the cache records as timed out")
  ap.add_argument("--cache", help="endpoint cache JSONL (default OUT/cache/endpoint.jsonl)")
  ap.add_argument("--limit", type=int, default=100, help="LIMIT of the assignment query")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--negative-tries", type=int, default=10, help="ASK queries per negative")
  ap.add_argument("--no-negatives", action="store_true")
  ap.add_argument(
      "--require-assignment",
      action="store_true",
      help="drop records without a satisfying assignment (as MCWQ does)")
  ap.add_argument("--label-language", default="en")
  ap.add_argument("--split-name", default="cfq_sample", help="name of the file-derived split")
  ap.add_argument("--cfq-split", nargs="*", help="CFQ split files to induce onto the output")
  ap.add_argument("--max-records", type=int, default=0, help="only the first N input records")
  ap.add_argument("--quiet", action="store_true", help="no progress bars")
  ap.add_argument(
      "--mcwq",
      default=DEFAULT_MCWQ if os.path.isdir(DEFAULT_MCWQ) else "",
      help="an MCWQ official/ folder to compare the migrated queries with (report.json's "
      "mcwq_conformance; default ../shared/mcwq/official when it exists, '' for none)")
  return ap


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point; prints the report."""
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  args = build_parser().parse_args(argv)
  if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.split_name):
    raise SystemExit(f"bad --split-name {args.split_name!r}")
  report = run(args)
  for line in report["malformed_records"]:
    print("MALFORMED", line, file=sys.stderr)
  print(json.dumps({k: v for k, v in report.items() if k != "malformed_records"}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
