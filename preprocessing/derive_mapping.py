r"""Derives the Freebase -> Wikidata property mapping by aligning CFQ with MCWQ (MCWQ §3.1).

  python -m preprocessing.derive_mapping [--cfq FILE ...] [--mcwq DIR] [--mapping FILE] [--json OUT]

The same question pattern has the same query shape in CFQ and MCWQ: each CFQ record whose
`questionPatternModEntities` is in an MCWQ `official/*/*.en.txt` file is aligned clause by clause
with the MCWQ query. A Freebase predicate on (s, o) votes for every Wikidata property of an MCWQ
triple (s, P, o) or (o, P, s) (reverse); a type `?x a ns:T` for every (P, Q) of `?x P wd:Q`; a
constant object (gender, nationality) for (P, Q) of `s P wd:Q`. A key's value is the candidate
present in all its occurrences. Prints the derived table beside the curated
`preprocessing/data/property_mapping.json` (which adds labels and what the data cannot reveal);
exit status 1 on a contradiction.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib
import sys
from typing import Any, Iterable

from preprocessing import cfq
from preprocessing.cfq import ContextModel

_REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CFQ = [
    str(_REPO.parent / "shared" / "cfq" / f"cfq_sample_{p}.json") for p in ("train", "dev")
]
DEFAULT_MCWQ = str(_REPO.parent / "shared" / "mcwq" / "official")
DEFAULT_MAPPING = str(pathlib.Path(__file__).resolve().parent / "data" / "property_mapping.json")


def matched_pairs(records: Iterable[tuple[str, dict[str, Any]]],
                  mcwq: dict[str, str]) -> list[tuple[str, dict[str, Any], str]]:
  """CFQ records whose question pattern has an MCWQ query: [(where, record, mcwq_sparql)]."""
  out = []
  for where, rec in records:
    if isinstance(rec, dict) and rec.get("questionPatternModEntities") in mcwq:
      out.append((where, rec, mcwq[rec["questionPatternModEntities"]]))
  return out


def align(pairs: list[tuple[str, dict[str, Any], str]],
          context_model: cfq.ContextModel | None = None) -> dict[str, Any]:
  """Votes for each Freebase key (see module docstring).

  Args:
    pairs: output of `matched_pairs`.
    context_model: resolves ambiguous CFQ placeholder alignments (default: fitted on `pairs`).

  Returns:
    {"properties": {fb_pred: Counter{(P, reversed): n}}, "types": {fb_type: Counter{(P, Q): n}},
     "entities": {mid: Counter{Q: n}}, "occurrences": {key: n}, "skipped": [where...]}.
  """
  props: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  types: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  ents: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  occ: collections.Counter = collections.Counter()
  skipped = []
  model = ContextModel().fit(rec for _, rec, _ in pairs) if context_model is None else context_model
  for where, rec, mcwq_sparql in pairs:
    if "^" in rec["sparql"]:
      skipped.append(where)  # reverse marks are filtered out (MCWQ §3.1)
      continue
    q = cfq.sparql_mod_entities(rec, where, model)
    m = cfq.parse_query(mcwq_sparql, where + " (MCWQ)")
    wd = [c for c in m.clauses if not c.is_filter]
    for c in q.clauses:
      if c.is_filter:
        continue
      if c.predicate == "a":
        key = c.object
        occ[("type", key)] += 1
        types[key].update({(t.predicate, t.object)
                           for t in wd
                           if t.subject == c.subject and t.object.startswith("wd:")})
      elif c.object.startswith("ns:"):
        occ[("prop", c.predicate)] += 1
        occ[("entity", c.object)] += 1
        cands = {(t.predicate, t.object)
                 for t in wd
                 if t.subject == c.subject and t.object.startswith("wd:")}
        props[c.predicate].update({(p, False) for p, _ in cands})
        ents[c.object].update({o for _, o in cands})
      else:
        occ[("prop", c.predicate)] += 1
        cands = {(t.predicate, False) for t in wd if (t.subject, t.object) == (c.subject, c.object)}
        cands |= {(t.predicate, True) for t in wd if (t.subject, t.object) == (c.object, c.subject)}
        props[c.predicate].update(cands)
  return {
      "properties": props,
      "types": types,
      "entities": ents,
      "occurrences": occ,
      "skipped": skipped
  }


def decide(votes: dict[str, collections.Counter], occ: collections.Counter,
           kind: str) -> dict[str, Any]:
  """Keeps, per key, the candidates present in every occurrence (None if none or ambiguous)."""
  out = {}
  for key, counter in votes.items():
    n = occ[(kind, key)]
    full = [c for c, v in counter.items() if v == n]
    out[key] = {
        "n":
            n,
        "derived":
            full[0] if len(full) == 1 else None,
        "candidates":
            [[list(c) if isinstance(c, tuple) else c, v] for c, v in counter.most_common(4)]
    }
  return out


def derive(cfq_files: list[str], mcwq_dir: str) -> dict[str, Any]:
  """Runs the whole alignment; returns {"matched": n, "properties": …, "types": …, "entities": …}."""
  mcwq = cfq.read_mcwq_official(sorted(glob.glob(os.path.join(mcwq_dir, "*", "*.en.txt"))))
  pairs = matched_pairs(cfq.load_records(cfq_files), mcwq)
  model = cfq.ContextModel().fit(rec for _, rec in cfq.load_records(cfq_files))
  v = align(pairs, model)
  return {
      "matched": len(pairs),
      "skipped_reverse_marks": v["skipped"],
      "properties": decide(v["properties"], v["occurrences"], "prop"),
      "types": decide(v["types"], v["occurrences"], "type"),
      "entities": decide(v["entities"], v["occurrences"], "entity")
  }


def compare(derived: dict[str, Any], mapping: dict[str, Any]) -> list[str]:
  """Contradictions between derived values and the curated mapping file (empty = consistent)."""
  problems = []
  for key, d in derived["properties"].items():
    if d["derived"] is None:
      continue
    e = mapping["properties"].get(key)
    p, rev = d["derived"]
    p = p.replace("wdt:", "")
    if e is None or e["wikidata"] != p or bool(e.get("reverse")) != rev:
      problems.append(f"property {key}: derived {p} reverse={rev}, mapping file has {e}")
  for key, d in derived["types"].items():
    if d["derived"] is None:
      continue
    e = mapping["types"].get(key)
    p, q = d["derived"]
    if e is None or (e["property"], e["entity"]) != (p.removeprefix("wdt:"), q.removeprefix("wd:")):
      problems.append(f"type {key}: derived {p} {q}, mapping file has {e}")
  for key, d in derived["entities"].items():
    if d["derived"] is None:
      continue
    e = mapping["entities"].get(key)
    if e is None or e["wikidata"] != d["derived"].removeprefix("wd:"):
      problems.append(f"entity {key}: derived {d['derived']}, mapping file has {e}")
  return problems


def main(argv: list[str] | None = None) -> int:
  """Command line: prints the derived table and the comparison with the mapping file."""
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--cfq", nargs="+", default=DEFAULT_CFQ, help="CFQ dataset JSON files")
  ap.add_argument("--mcwq", default=DEFAULT_MCWQ, help="MCWQ official/ folder")
  ap.add_argument("--mapping", default=DEFAULT_MAPPING, help="curated mapping file to check")
  ap.add_argument("--json", help="also write the derived table to this JSON file")
  args = ap.parse_args(argv)
  d = derive(args.cfq, args.mcwq)
  print(f"matched CFQ records: {d['matched']} (skipped with reverse marks: "
        f"{len(d['skipped_reverse_marks'])})")
  for kind in ("properties", "types", "entities"):
    print(f"== {kind}")
    for key, e in sorted(d[kind].items()):
      print(
          f"  {e['n']:4d} {key} -> {e['derived']}   {e['candidates'] if e['derived'] is None else ''}"
      )
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(d, indent=1, default=list), encoding="utf-8")
  if os.path.exists(args.mapping):
    mapping = json.loads(pathlib.Path(args.mapping).read_text(encoding="utf-8"))
    problems = compare(d, mapping)
    for p in problems:
      print("CONTRADICTION:", p)
    print(f"mapping file {args.mapping}: {len(problems)} contradiction(s)")
    return 1 if problems else 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
