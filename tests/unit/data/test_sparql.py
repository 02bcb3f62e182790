"""The SPARQL model: parsing, canonical form and term classes."""
import pytest

from mcwq_t5x.data import sparql


def test_parse_real_query_keeps_order_and_classifies_terms():
  text = ("ASK WHERE { ?x0 wdt:P106 wd:Q2526255 . ?x0 wdt:P27 wd:Q142 . FILTER ( M2 != ?x0 ) . "
          "M2 wdt:P26 ?x0 . ?x0 wdt:P750|wdt:P272 M1 }")
  q = sparql.parse_sparql(text)
  assert q.prefix == sparql.ASK
  assert q.properties() == ["wdt:P106", "wdt:P27", "wdt:P26", "wdt:P750|wdt:P272"]
  assert q.entities() == ["wd:Q2526255", "wd:Q142", "M2", "M1"]
  assert q.entities(include_filters=True) == ["wd:Q2526255", "wd:Q142", "M2", "M1", "M2"]
  assert q.variables() == ["?x0"]
  assert q.filters == (sparql.Filter("M2", "!=", "?x0"),)
  assert sparql.parse_sparql(q.to_sparql()) == q


def _equivalent(a: str, b: str) -> bool:
  return sparql.parse_sparql(a).equivalent(sparql.parse_sparql(b))


def test_canonical_ignores_order_duplicates_and_filter_direction():
  a = "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 . ?x0 wdt:P58 M1 . FILTER ( ?x0 != M1 ) }"
  b = ("SELECT DISTINCT ?x0 WHERE { FILTER ( M1 != ?x0 ) . ?x0 wdt:P58 M1 . ?x0 wdt:P57 M0 . "
       "?x0 wdt:P57 M0 }")
  assert _equivalent(a, b)
  assert not _equivalent(a, a.replace("SELECT DISTINCT ?x0", "ASK"))
  assert not _equivalent(a, a.replace("wdt:P58 M1", "wdt:P58 M2"))
  assert not sparql.parse_sparql(a).equivalent(None)  # a prediction that does not parse


def test_repeated_triple_and_repeated_filter_are_treated_alike():
  # random_split/test.en.txt line 388 repeats `M2 wdt:P108 M1` (its RIR repeats the object).
  text = ("ASK WHERE { ?x0 wdt:P3373 ?x1 . ?x1 wdt:P106 wd:Q36834 . FILTER ( ?x0 != ?x1 ) . "
          "?x0 wdt:P108 M1 . M2 wdt:P108 M1 . M2 wdt:P108 M1 . M3 wdt:P108 M1 . M4 wdt:P108 M1 . "
          "M5 wdt:P108 M1 }")
  q = sparql.parse_sparql(text)
  assert len(q.triples) == 8 and len(set(q.triples)) == 7  # the parse keeps the repetition
  assert q.properties().count("wdt:P108") == 6
  assert q.entities().count("M2") == 2
  once = text.replace("M2 wdt:P108 M1 . M2 wdt:P108 M1", "M2 wdt:P108 M1")
  twice_filtered = text.replace("FILTER ( ?x0 != ?x1 )",
                                "FILTER ( ?x0 != ?x1 ) . FILTER ( ?x1 != ?x0 )")
  assert _equivalent(text, once)
  assert _equivalent(once, twice_filtered)
  assert not _equivalent(text, once.replace("M2 wdt:P108 M1", "M2 wdt:P108 M3"))


def test_count_form_parses():
  q = sparql.parse_sparql("SELECT count ( * ) WHERE { ?x0 ns:film.film.directed_by ns:m.0abc }")
  assert q.prefix == sparql.COUNT
  assert q.entities() == ["ns:m.0abc"]


@pytest.mark.parametrize("bad", [
    "",
    "ASK WHERE",
    "ASK WHERE { }",
    "ASK WHERE { M0 wdt:P57 }",
    "ASK WHERE { M0 wdt:P57 ?x0 . }",
    "ASK WHERE { M0 wdt:P57 ?x0",
    "DESCRIBE WHERE { M0 wdt:P57 ?x0 }",
    "ASK WHERE { FILTER ( ?x0 < M0 ) }",
    "ASK WHERE { M0 wdt:P57 ?x0 } }",
    "ASK WHERE { M0 \"x\" ?x0 }",
])
def test_malformed_queries_raise(bad):
  with pytest.raises(sparql.SparqlParseError):
    sparql.parse_sparql(bad)
