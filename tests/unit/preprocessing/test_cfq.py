"""Which Freebase entity each CFQ placeholder stands for: exact from the full release's keys,
otherwise chosen by the context model (preprocessing/cfq.py, MCWQ §3.2)."""

import copy
import json

import pytest

from preprocessing import cfq, mapping as mp, migrate

SPOUSE = ("ns:people.person.spouse_s/ns:people.marriage.spouse|ns:fictional_universe.fictional_"
          "character.married_to/ns:fictional_universe.marriage_of_fictional_characters.spouses")
INFLUENCED = "ns:influence.influence_node.influenced"
DIRECTOR_FILM = "ns:film.director.film"
PRODUCER_FILM = "ns:film.producer.film|ns:film.production_company.films"
PRODUCED_BY = "ns:film.film.produced_by|ns:film.film.production_companies"


@pytest.fixture(scope="module")
def mids(records):
  """Real film-domain MIDs of the sample (none of them a gender or nationality)."""
  special = set().union(
      *(cfq.special_constants(cfq.parse_query(r["sparql"])) for r in records.values()))
  return sorted({
      t for r in records.values() for t in r["sparql"].split()
      if t.startswith("ns:m.") and t not in special
  })[:10]


class Contrary(cfq.ContextModel):
  """A context model that always picks the worst-scoring alignment."""

  def choose(self, record, candidates):
    return min(candidates, key=lambda c: self.score(record, c))


def cfq_shaped(question, prefix, mod_entities, mids):
  """A record in the form of CFQ's full release, built from its true `sparqlPatternModEntities`
  (`mod_entities`: (s, p, o) clauses with the question's `Mk`; p "!=" for a filter).

  As in CFQ, `sparql` is that query with MIDs (`mids[k]` for `Mk`), `sparqlPattern` abstracts
  entities (`Mk`, types after the question's indices) and properties (`P0`…), and all three sort
  their clauses; `questionWithMids` has the MIDs where the question has placeholders.
  """

  def text(s, p, o):
    return f"FILTER ( {s} != {o} )" if p == "!=" else f"{s} {p} {o}"

  def query(clauses):
    return prefix + " {\n" + " .\n".join(sorted(text(*c) for c in clauses)) + "\n}"

  mid = {f"M{k}": m for k, m in enumerate(mids)}
  used = {t for c in mod_entities for t in (c[0], c[2]) if cfq.is_placeholder(t)}
  types = sorted({c[2] for c in mod_entities if c[1] == "a"})
  abstract = {t: f"M{len(used) + k}" for k, t in enumerate(types)}
  props: dict[str, str] = {}
  for _, p, _ in sorted(mod_entities, key=lambda c: (c[0], c[2])):
    if p not in ("a", "!="):
      props.setdefault(p, f"P{len(props)}")
  sub = lambda t: mid.get(t, t)  # noqa: E731
  return {
      "questionIdx":
          0,
      "questionPatternModEntities":
          question,
      "questionWithBrackets":
          question,
      "questionWithMids":
          " ".join(mid.get(t, t).removeprefix("ns:") for t in question.split()),
      "sparql":
          query([(sub(s), p, sub(o)) for s, p, o in mod_entities]),
      "sparqlPattern":
          query([
              (abstract.get(s, s), props.get(p, p), abstract.get(o, o)) for s, p, o in mod_entities
          ]),
      "sparqlPatternModEntities":
          query(mod_entities),
  }


def without(record, *keys):
  return {k: v for k, v in record.items() if k not in keys}


# ---------------------------------------------------------------------------------------------
# The full release says which entity is which: questionWithMids / sparqlPatternModEntities.

# Sample record 185244 with the two keys CFQ's full release adds. Its MIDs follow the question's
# bracketed names, which other sample records name too: M0 = ns:m.0162c8 [Brett Ratner],
# M1 = ns:m.02v63m [Scream 3] ("M1 's producer"), M2 = ns:m.0crs094 [Wholphin: Issue 10].
QUESTION_WITH_MIDS_185244 = ("What was written by a director of m.0crs094 , executive produced by "
                             "m.02v63m 's producer , and directed by m.0162c8")
MOD_ENTITIES_185244 = ("SELECT DISTINCT ?x0 WHERE {\n?x0 ns:film.film.directed_by M0 .\n"
                       "?x0 ns:film.film.executive_produced_by ?x1 .\n"
                       "?x0 ns:film.film.written_by ?x2 .\n"
                       f"?x1 {PRODUCER_FILM} M1 .\n?x2 ns:film.director.film M2\n}}")
WIKIDATA_185244 = ("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 . ?x0 wdt:P1431 ?x1 . "
                   "?x0 wdt:P58 ?x2 . M1 wdt:P272 ?x1 . M2 wdt:P57 ?x2 }")


@pytest.fixture()
def full_record(records):
  rec = copy.deepcopy(records[185244])
  assert rec["questionPatternModEntities"] == ("What was written by a director of M2 , executive "
                                               "produced by M1 's producer , and directed by M0")
  assert "questionWithMids" not in rec and "sparqlPatternModEntities" not in rec
  rec["questionWithMids"] = QUESTION_WITH_MIDS_185244
  rec["sparqlPatternModEntities"] = MOD_ENTITIES_185244
  return rec


def test_exact_keys_decide_the_alignment(full_record, records, model, mapping):
  exact = {"M0": "ns:m.0162c8", "M1": "ns:m.02v63m", "M2": "ns:m.0crs094"}
  # sparqlPattern alone leaves M1 and M2 interchangeable ("?x1 P3 M1 . ?x2 P4 M2"); the context
  # model of commit c88dcbf chose the wrong one here.
  bare = records[185244]
  assert len(cfq.placeholder_candidates(bare)) == 2
  assert cfq.alignment_source(bare) == "context model"
  # A model that guesses the other alignment is wrong without the keys ...
  wrong = cfq.sparql_mod_entities(bare, "185244", Contrary().fit(records.values()))
  assert wrong.to_sparql() != cfq.parse_query(MOD_ENTITIES_185244).to_sparql()
  # ... and ignored with either key, or both.
  for rec in (full_record, without(full_record, "questionWithMids"),
              without(full_record, "sparqlPatternModEntities")):
    assert cfq.alignment_source(rec) == "exact"
    assert cfq.exact_entity_constants(rec, "185244") == exact
    assert cfq.placeholder_constants(rec, "185244", Contrary())["M1"] == "ns:m.02v63m"
    q = cfq.sparql_mod_entities(rec, "185244", Contrary().fit(records.values()))
    assert q == cfq.parse_query(MOD_ENTITIES_185244)
    _, migrated = mp.migrate_record(rec, mapping, "185244", Contrary())
    assert migrated.to_sparql() == WIKIDATA_185244
  # The context model, asked without the keys, agrees with them.
  assert cfq.sparql_mod_entities(bare, "185244", model) == cfq.parse_query(MOD_ENTITIES_185244)


def test_question_mids_spellings(full_record):
  # `'s` attached or not, `ns:` or not: the k-th MID is the k-th placeholder occurrence.
  full_record["questionWithMids"] = ("What was written by a director of ns:m.0crs094, executive "
                                     "produced by m.02v63m's producer, and directed by m.0162c8")
  assert cfq.question_mids(full_record) == {
      "M2": "ns:m.0crs094",
      "M1": "ns:m.02v63m",
      "M0": "ns:m.0162c8"
  }
  del full_record["questionWithMids"]
  assert cfq.question_mids(full_record) is None


def test_exact_keys_follow_the_record_not_the_guess(full_record, model):
  # The record says it: exchanging the two MIDs in questionWithMids exchanges M1 and M2.
  swapped = without(full_record, "sparqlPatternModEntities")
  swapped["questionWithMids"] = (
      QUESTION_WITH_MIDS_185244.replace("m.0crs094",
                                        "TMP").replace("m.02v63m",
                                                       "m.0crs094").replace("TMP", "m.02v63m"))
  q = cfq.sparql_mod_entities(swapped, "185244", model)
  assert cfq.Clause("?x1", PRODUCER_FILM, "M2") in q.clauses
  assert cfq.Clause("?x2", "ns:film.director.film", "M1") in q.clauses


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("questionWithMids", "What was written by a director of m.0crs094 , executive produced by "
         "m.02v63m 's producer , and directed by Brett Ratner",
         "questionWithMids names 2 MIDs but .* has 3"),
        ("questionWithMids", QUESTION_WITH_MIDS_185244.replace("m.0162c8", "m.0abcdef"),
         r"questionWithMids names \['ns:m.0abcdef'\], absent from sparql"),
        ("questionWithMids", QUESTION_WITH_MIDS_185244.replace(
            "m.0162c8", "m.02v63m"), "questionWithMids gives two placeholders the same MID"),
        ("sparqlPatternModEntities", MOD_ENTITIES_185244.replace("directed_by M0", "written_by M0"),
         "sparqlPatternModEntities and questionWithMids do not align with sparql"),
        (
            "sparqlPatternModEntities",
            MOD_ENTITIES_185244.replace("M1", "M2"),  # contradicts the MIDs
            "sparqlPatternModEntities and questionWithMids do not align with sparql"),
        ("sparqlPatternModEntities", MOD_ENTITIES_185244.replace("M0", "M7"),
         r"sparqlPatternModEntities has placeholders \['M7'\] that the question does not"),
        ("questionWithMids", ["m.0crs094"], "questionWithMids is list, not a string"),
    ])
def test_malformed_exact_keys_name_the_record(full_record, key, value, message):
  full_record[key] = value
  with pytest.raises(cfq.CfqFormatError, match=f"^cfq.json:questionIdx=185244: {message}"):
    cfq.validate_record(full_record, "cfq.json:questionIdx=185244")
    cfq.sparql_mod_entities(full_record, "cfq.json:questionIdx=185244")


# ---------------------------------------------------------------------------------------------
# Without the keys: several entity lists after different verbs.

MULTI_VERB = [
    # The filters already tell the spouses from the others.
    ("Did M0 marry M1 , M2 , and M3 and influence M4 and M5", "SELECT count(*) WHERE", [
        ("M0", SPOUSE, "M1"), ("M0", SPOUSE, "M2"), ("M0", SPOUSE, "M3"), ("M0", "!=", "M1"),
        ("M0", "!=", "M2"), ("M0", "!=", "M3"), ("M0", INFLUENCED, "M4"), ("M0", INFLUENCED, "M5")
    ], "ASK WHERE { FILTER ( M0 != M1 ) . FILTER ( M0 != M2 ) . FILTER ( M0 != M3 ) . "
     "M4 wdt:P737 M0 . M5 wdt:P737 M0 . M0 wdt:P26 M1 . M0 wdt:P26 M2 . M0 wdt:P26 M3 }"),
    # Lists of equal length: only the verbs say which list goes with which property.
    ("Did M0 influence M1 and M2 and direct M3 and M4", "SELECT count(*) WHERE", [
        ("M0", INFLUENCED, "M1"), ("M0", INFLUENCED, "M2"), ("M0", DIRECTOR_FILM, "M3"),
        ("M0", DIRECTOR_FILM, "M4")
    ], "ASK WHERE { M3 wdt:P57 M0 . M4 wdt:P57 M0 . M1 wdt:P737 M0 . M2 wdt:P737 M0 }"),
    ("Who directed M0 and M1 and produced M2 and M3", "SELECT DISTINCT ?x0 WHERE", [
        ("?x0", "a", "ns:people.person"), ("?x0", DIRECTOR_FILM, "M0"),
        ("?x0", DIRECTOR_FILM, "M1"), ("?x0", PRODUCER_FILM, "M2"), ("?x0", PRODUCER_FILM, "M3")
    ], "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M0 wdt:P57 ?x0 . M1 wdt:P57 ?x0 . "
     "M2 wdt:P272 ?x0 . M3 wdt:P272 ?x0 }"),
    ("What was written by M0 and M1 and produced by M2 and M3", "SELECT DISTINCT ?x0 WHERE", [
        ("?x0", "ns:film.film.written_by", "M0"), ("?x0", "ns:film.film.written_by", "M1"),
        ("?x0", PRODUCED_BY, "M2"), ("?x0", PRODUCED_BY, "M3")
    ], "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P162|wdt:P272 M2 . ?x0 wdt:P162|wdt:P272 M3 . "
     "?x0 wdt:P58 M0 . ?x0 wdt:P58 M1 }"),
    ("What was produced by M0 and M1 and executive produced by M2 and M3",
     "SELECT DISTINCT ?x0 WHERE", [
         ("?x0", PRODUCED_BY, "M0"), ("?x0", PRODUCED_BY, "M1"),
         ("?x0", "ns:film.film.executive_produced_by", "M2"),
         ("?x0", "ns:film.film.executive_produced_by", "M3")
     ], "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P1431 M2 . ?x0 wdt:P1431 M3 . "
     "?x0 wdt:P162|wdt:P272 M0 . ?x0 wdt:P162|wdt:P272 M1 }"),
    # Three lists of three: 1,296 alignments of sparqlPattern, 6 different queries.
    ("What was produced by M0 , M1 , and M2 , edited by M3 , M4 , and M5 , and directed by M6 , "
     "M7 , and M8", "SELECT DISTINCT ?x0 WHERE", [("?x0", PRODUCED_BY, f"M{k}") for k in range(3)] +
     [("?x0", "ns:film.film.edited_by", f"M{k}") for k in range(3, 6)] +
     [("?x0", "ns:film.film.directed_by", f"M{k}") for k in range(6, 9)],
     "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M6 . ?x0 wdt:P57 M7 . ?x0 wdt:P57 M8 . "
     "?x0 wdt:P1040 M3 . ?x0 wdt:P1040 M4 . ?x0 wdt:P1040 M5 . ?x0 wdt:P162|wdt:P272 M0 . "
     "?x0 wdt:P162|wdt:P272 M1 . ?x0 wdt:P162|wdt:P272 M2 }"),
]


@pytest.mark.parametrize(
    "question, prefix, truth, wikidata", MULTI_VERB, ids=[q for q, *_ in MULTI_VERB])
def test_entity_lists_after_different_verbs_align(question, prefix, truth, wikidata, model, mids,
                                                  mapping):
  full = cfq_shaped(question, prefix, truth, mids)
  bare = without(full, "questionWithMids", "sparqlPatternModEntities")
  expected = cfq.parse_query(full["sparqlPatternModEntities"])
  guessed = cfq.sparql_mod_entities(bare, question, model)
  assert guessed.canonical() == expected.canonical()  # the context model aligns right
  assert guessed == expected == cfq.sparql_mod_entities(full, question)  # in CFQ's clause order
  _, migrated = mp.migrate_record(bare, mapping, question, model)
  assert migrated.to_sparql() == wikidata


def test_context_features_stop_at_list_joiners():
  feats = cfq.ContextModel._features
  question = "Did M0 marry M1 , M2 , and M3 and influence M4 and M5"
  assert feats(question, "M1") == ["L1 marry", "L2 M0 marry", "R2 ,"]
  assert feats(question, "M3") == ["L1 and", "R2 and"]  # not "R2 and influence"
  assert feats(question, "M4") == ["L1 influence", "L2 and influence", "R2 and"]
  assert feats("What was executive produced by M0",
               "M0") == ["L1 by", "L2 executive produced by", "R2 "]


def test_interchangeable_entities_are_one_candidate(records):
  # "What sequel of M5 was written by M2 , M3 , and M4 , was executive produced by M1 , and
  # starred M0": the three writers are interchangeable; the three single properties are not.
  rec = records[165069]
  cands = cfq.placeholder_candidates(rec)
  assert len(cands) == 6  # 3! for the single properties (the writers' orders are one candidate)
  writers = {"ns:m.02wk_2f", "ns:m.07s8874", "ns:m.08lftk1"}
  assert all({c["M2"], c["M3"], c["M4"]} == writers for c in cands)
  assert len({(c["M0"], c["M1"], c["M5"]) for c in cands}) == 6


def test_migration_uses_the_keys_and_reports_how_it_aligned(full_record, records, tmp_path):
  contradicting = copy.deepcopy(full_record)
  contradicting["questionIdx"] = 1
  contradicting["sparqlPatternModEntities"] = MOD_ENTITIES_185244.replace("M1", "M2")
  path = tmp_path / "cfq_full_dev.json"
  path.write_text(json.dumps([full_record, records[138310], records[165069], contradicting]))
  args = migrate.build_parser().parse_args(
      ["--cfq", str(path), "--out",
       str(tmp_path / "o"), "--endpoint", "none", "--quiet"])
  report = migrate.run(args)
  assert report["migrated"] == 3 and report["malformed"] == 1
  assert report["alignment"] == {"exact": 1, "unique": 1, "context model": 1}
  assert report["malformed_records"] == [
      "cfq_full_dev.json:questionIdx=1: sparqlPatternModEntities and questionWithMids do not "
      "align with sparql"
  ]
  dataset = json.loads((tmp_path / "o" / "dataset.json").read_text())
  assert dataset[0]["sparqlPatternModEntities"] == WIKIDATA_185244
