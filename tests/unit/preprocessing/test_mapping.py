"""Tests of the Freebase -> Wikidata property mapping on real CFQ records (MCWQ §3.1)."""

import collections
import glob
import itertools
import json
import re

import pytest

from mcwq_t5x.data import readers
from mcwq_t5x.data import sparql as sparql_lib
from preprocessing import cfq, derive_mapping, mapping as mp


@pytest.fixture(scope="module")
def mcwq_queries(mcwq_dir):
  return cfq.read_mcwq_official(sorted(glob.glob(str(mcwq_dir / "official" / "*" / "*.en.txt"))))


def migrate(records, mapping, model, idx):
  return mp.migrate_record(records[idx], mapping, f"idx={idx}", model)


def test_direct_and_reverse_property(records, mapping, model):
  # "What film director directed M0": ?x0 ns:film.director.film M0 (reverse of film.film.directed_by)
  qp, q = migrate(records, mapping, model, 155341)
  assert qp == "What film director directed M0"
  assert records[155341]["sparql"].endswith("?x0 ns:film.director.film ns:m.0gyc7vy\n}")
  assert q.to_sparql() == "SELECT DISTINCT ?x0 WHERE { M0 wdt:P57 ?x0 }"
  # "Was M1 's costume designer M0": costume_design_for_film is reversed to P2515.
  _, q = migrate(
      records, mapping, model,
      next(i for i, r in records.items()
           if r["questionPatternModEntities"] == "Was M1 's costume designer M0"))
  assert q.to_sparql() == "ASK WHERE { M1 wdt:P2515 M0 }"


def test_unary_types_become_triples(records, mapping, model):
  _, q = migrate(records, mapping, model, 201514)  # Which film director executive produced M1
  assert cfq.Clause("?x0", "wdt:P106", "wd:Q2526255") in q.clauses  # occupation
  _, q = migrate(records, mapping, model, 214063)  # Who did M1 star
  assert q.to_sparql() == "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M1 wdt:P161 ?x0 }"


def test_art_director_becomes_composer(records, mapping, model):
  qp, q = migrate(records, mapping, model, 68472)
  assert records[68472]["questionPatternModEntities"] == "Was M1 edited by M0 's art director"
  assert qp == "Was M1 edited by M0 's composer"
  assert q.to_sparql() == "ASK WHERE { M0 wdt:P86 ?x0 . M1 wdt:P1040 ?x0 }"


def test_special_entities_and_ask(records, mapping, model):
  qp, q = migrate(records, mapping, model, 90757)  # Was a Mexican writer of M1 M0
  assert records[90757]["sparql"].startswith("SELECT count(*) WHERE")
  assert q.prefix == "ASK WHERE"
  assert cfq.Clause("M0", "wdt:P27", "wd:Q96") in q.clauses
  genders = [
      r for r in records.values()
      if "ns:people.person.gender ns:m.02zsn" in r["sparql"] and "^" not in r["sparql"]
  ]
  _, q = mp.migrate_record(genders[0], mapping, "g", model)
  assert any(c.predicate == "wdt:P21" and c.object == "wd:Q6581072" for c in q.clauses)


def test_reverse_marks_are_filtered(records, mapping, model):
  with pytest.raises(mp.SkipRecord) as e:
    migrate(records, mapping, model, 65842)
  assert e.value.reason == "reverse mark"
  assert sum("^" in r["sparql"] for r in records.values()) == 26


def test_ambiguous_pattern_alignment_resolved_by_question(records, model):
  # sparqlPattern `?x0 P0 M0 . ?x0 P1 M1 . ...` loses which entity goes with which property.
  rec = records[165069]
  assert len(cfq.placeholder_candidates(rec)) > 1
  q = cfq.sparql_mod_entities(rec, "165069", model)
  assert cfq.Clause("?x0", "ns:film.film.prequel", "M5") in q.clauses  # "sequel of M5"
  assert cfq.Clause("?x0", "ns:film.film.starring/ns:film.performance.actor", "M0") in q.clauses


def test_conformance_with_mcwq(records, mapping, model, mcwq_queries):
  """Every sample record whose question pattern is in MCWQ migrates to MCWQ's query, string for
  string (CFQ's clause order, as MCWQ keeps it)."""
  counts = collections.Counter()
  for idx, rec in records.items():
    if rec["questionPatternModEntities"] not in mcwq_queries:
      continue
    counts["matched"] += 1
    counts["context model"] += cfq.alignment_source(rec) == "context model"
    _, q = mp.migrate_record(rec, mapping, str(idx), model)
    ok, renaming = _equal_up_to_renaming(q.to_sparql(),
                                         mcwq_queries[rec["questionPatternModEntities"]])
    counts["equal"] += ok
    counts["identity"] += ok and all(k == v for k, v in renaming.items())
    counts["same string"] += q.to_sparql() == mcwq_queries[rec["questionPatternModEntities"]]
  assert counts == {
      "matched": 228,
      "context model": 17,
      "equal": 228,
      "identity": 228,
      "same string": 228
  }


def test_repeated_clauses_are_kept_as_mcwq_keeps_them(records, mapping, model, mcwq_queries):
  # CFQ repeats the filter of "sibling and spouse"; MCWQ keeps both ("Who was M0 's sibling and
  # spouse", mcd1/dev.en.txt line 5065), so the migration keeps every clause.
  rec = records[138310]
  assert rec["questionPatternModEntities"] == "What character was M0 's sibling and spouse"
  assert rec["sparql"].count("FILTER ( ?x0 != ns:m.026dx0b )") == 2
  _, q = mp.migrate_record(rec, mapping, "138310", model)
  assert q.to_sparql() == mcwq_queries["Who was M0 's sibling and spouse"].replace(
      "wd:Q5", "wd:Q95074") == ("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q95074 . "
                                "?x0 wdt:P3373 M0 . ?x0 wdt:P26 M0 . FILTER ( ?x0 != M0 ) . "
                                "FILTER ( ?x0 != M0 ) }")
  repeated = [
      i for i, r in records.items() if "^" not in r["sparql"] and
      len(set(cfq.parse_query(r["sparql"]).clauses)) < len(cfq.parse_query(r["sparql"]).clauses)
  ]
  assert len(repeated) == 12
  for i in repeated:
    _, q = mp.migrate_record(records[i], mapping, str(i), model)
    assert len(q.clauses) == len(cfq.parse_query(records[i]["sparql"]).clauses)


def test_derived_mapping_agrees_with_file(cfq_files, mcwq_dir):
  d = derive_mapping.derive(cfq_files, str(mcwq_dir / "official"))
  assert d["matched"] == 228
  assert d["properties"]["ns:film.director.film"]["derived"] == ("wdt:P57", True)
  assert d["types"]["ns:film.director"]["derived"] == ("wdt:P106", "wd:Q2526255")
  assert d["entities"]["ns:m.0b90_r"]["derived"] == "wd:Q96"
  assert derive_mapping.compare(d, json.loads(mp.DEFAULT_MAPPING.read_text())) == []


def test_mapping_file_covers_sample_and_has_labels(records, mapping):
  raw = json.loads(mp.DEFAULT_MAPPING.read_text())
  for section in ("properties", "types", "entities"):
    assert all(e.get("label") for e in raw[section].values()), section
  assert mapping.labels["P57"] == "director" and mapping.labels["Q5"] == "human"
  used = {
      c.predicate for r in records.values() if "^" not in r["sparql"]
      for c in cfq.parse_query(r["sparql"]).clauses if not c.is_filter and c.predicate != "a"
  }
  assert used <= set(mapping.properties)


def test_bad_mapping_file_is_rejected(tmp_path):
  bad = json.loads(mp.DEFAULT_MAPPING.read_text())
  bad["properties"]["ns:film.film.directed_by"]["wikidata"] = "P57 } DROP"
  path = tmp_path / "m.json"
  path.write_text(json.dumps(bad))
  with pytest.raises(mp.MappingError, match="directed_by"):
    mp.load_mapping(path)


def _equal_up_to_renaming(a: str, b: str) -> tuple[bool, dict[str, str] | None]:
  """Whether two MCWQ queries are equal up to clause order and a consistent renaming of `Mk`.

  Uses `mcwq_t5x.data.sparql.Query.canonical` for the order-insensitive comparison.

  Returns:
    (equal, renaming of a's placeholders into b's that makes them equal, identity first) or
    (False, None).
  """
  qa, qb = sparql_lib.parse_sparql(a), sparql_lib.parse_sparql(b)
  pa = sorted({t for t in qa.entities(include_filters=True) if sparql_lib.is_placeholder(t)})
  pb = sorted({t for t in qb.entities(include_filters=True) if sparql_lib.is_placeholder(t)})
  if len(pa) != len(pb):
    return False, None
  target = qb
  for perm in itertools.permutations(pb):
    ren = dict(zip(pa, perm))
    r = lambda t, ren=ren: ren.get(t, t)  # noqa: E731
    qr = sparql_lib.Query(
        qa.prefix,
        tuple(sparql_lib.Triple(r(t.subject), t.predicate, r(t.object)) for t in qa.triples),
        tuple(sparql_lib.Filter(r(f.left), f.op, r(f.right)) for f in qa.filters))
    if target.equivalent(qr):
      return True, ren
  return False, None


def test_equal_up_to_renaming():
  ok, ren = _equal_up_to_renaming("ASK WHERE { M0 wdt:P57 M1 . M1 wdt:P27 wd:Q96 }",
                                  "ASK WHERE { M0 wdt:P27 wd:Q96 . M1 wdt:P57 M0 }")
  assert ok and ren == {"M0": "M1", "M1": "M0"}
  assert not _equal_up_to_renaming("ASK WHERE { M0 wdt:P57 M1 }", "ASK WHERE { M0 wdt:P58 M1 }")[0]


def test_malformed_query_names_record():
  with pytest.raises(cfq.CfqFormatError, match="idx=7: malformed triple"):
    cfq.parse_query("ASK WHERE { M0 wdt:P57 }", "idx=7")
  with pytest.raises(cfq.CfqFormatError, match="missing key 'sparql'"):
    cfq.validate_record(
        {
            "questionIdx": 1,
            "questionPatternModEntities": "x",
            "questionWithBrackets": "x",
            "sparqlPattern": "x"
        }, "f.json:questionIdx=1")


def test_read_mcwq_official_rejects_a_question_with_two_queries(tmp_path, mcwq_queries):
  assert len(mcwq_queries) == 29895  # distinct English dev/test questions of the four splits
  assert mcwq_queries["Did M3 's cinematographer and star edit , direct , and write M0 , M1 , and "
                      "M2"].startswith("ASK WHERE { M3 wdt:P161 ?x0 .")
  f = tmp_path / "dev.en.txt"
  f.write_text(
      "IN: Did M0 direct M1  OUT: ASK WHERE { M0 wdt:P57 M1 }\n"
      "IN: Did M0 direct M1  OUT: ASK WHERE { M1 wdt:P57 M0 }\n",
      encoding="utf-8")
  with pytest.raises(readers.DataFormatError, match=rf"^{re.escape(str(f))}:2: question"):
    cfq.read_mcwq_official([f])
