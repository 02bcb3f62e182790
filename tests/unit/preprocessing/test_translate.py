"""Tests of translation backends, gold sampling, BLEU and statistics (MCWQ §3.4, §4)."""

import collections
import json
import pathlib
import subprocess
import sys
import time

import pytest

from mcwq_t5x.data import readers

from mcwq_t5x.data import rir
from preprocessing import gold, migrate, stats, translate as tr
import local_http
import mains

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]

# ---------------------------------------------------------------- helpers


class CountingBackend(tr.Backend):
  """Marks each text; records what it was asked; raises (like a kill) after `fail_after` calls."""
  name = "counting"

  def __init__(self, fail_after=None, drop_placeholder=None):
    self.fail_after, self.drop, self.sent, self.calls = fail_after, drop_placeholder, [], 0

  def translate(self, texts, target, source="en"):
    if self.fail_after is not None and self.calls >= self.fail_after:
      raise KeyboardInterrupt("killed")
    self.calls += 1
    self.sent.extend(texts)
    out = []
    for t in texts:
      y = f"<{target}> {t}"
      if self.drop and self.drop in t:
        y = y.replace(self.drop, "X")
      out.append(y)
    return out


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  """A small real release: the first 60 CFQ sample records migrated (no endpoint)."""
  out = tmp_path_factory.mktemp("release")
  args = migrate.build_parser().parse_args(
      ["--out", str(out), "--quiet", "--endpoint", "none", "--max-records", "60"])
  report = migrate.run(args)
  assert report["written"] > 50
  return out


# ---------------------------------------------------------------- Translator


def test_question_mark_and_placeholder_check(tmp_path):
  backend = CountingBackend(drop_placeholder="M1")
  t = tr.Translator(backend, tmp_path / "c.jsonl", batch_size=2)
  out = t.translate(["Who did M1 star", "Was M0 Spanish", "Who did M1 star"], "he")
  assert backend.sent == ["Who did M1 star?", "Was M0 Spanish?"]  # "?" appended, deduplicated
  assert out == ["<he> Who did X star", "<he> Was M0 Spanish", "<he> Who did X star"]  # stripped
  assert [f[0] for f in t.flagged] == ["Who did M1 star", "Who did M1 star"]
  with pytest.raises(ValueError):
    t.translate(["x"], "he; rm -rf")


def test_translation_kill_and_resume(tmp_path):
  texts = [f"Did M0 direct film number {i}" for i in range(11)]
  cache = tmp_path / "c.jsonl"
  first = CountingBackend(fail_after=2)
  with pytest.raises(KeyboardInterrupt):
    tr.Translator(first, cache, batch_size=3).translate(texts, "zh")
  second = CountingBackend()
  out = tr.Translator(second, cache, batch_size=3).translate(texts, "zh")
  assert len(first.sent) == 6 and len(second.sent) == 5
  assert not set(first.sent) & set(second.sent)
  assert sorted(first.sent + second.sent) == sorted(t + "?" for t in texts)
  assert out == [f"<zh> {t}" for t in texts]
  third = CountingBackend()
  assert tr.Translator(third, cache).translate(texts, "zh") == out and third.calls == 0


def test_official_files_of_a_release_with_multiline_queries(tmp_path):
  """dataset.json queries span lines (CFQ style); the official files must stay one line each."""
  rel = tmp_path / "rel"
  (rel / "splits").mkdir(parents=True)
  (rel / "dataset.json").write_text(
      json.dumps([{
          "questionPatternModEntities": "Who directed M0",
          "sparqlPatternModEntities": "SELECT DISTINCT ?x0 WHERE {\n?x0 wdt:P57 M0\n}"
      }, {
          "questionPatternModEntities": "Did M1 marry M0",
          "sparqlPatternModEntities": "ASK WHERE {\nM1 wdt:P26 M0\n}"
      }]))
  (rel / "splits" / "s.json").write_text('{"trainIdxs": [1, 0], "devIdxs": [], "testIdxs": []}')
  t = tr.Translator(CountingBackend(), tmp_path / "c.jsonl")
  tr.translate_release(rel, ["kn"], t, progress=False)
  official = readers.read_official(rel / "official" / "s" / "train.kn.txt", with_rir=True)
  assert [(e.question, e.sparql) for e in official
         ] == [("<kn> Did M1 marry M0", "ASK WHERE { M1 wdt:P26 M0 }"),
               ("<kn> Who directed M0", "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 }")]
  assert [(e.question, e.sparql) for e in official
         ] == [(e.question, e.sparql) for e in readers.read_release(rel, "s", "train", "kn")]


def test_file_backend_end_to_end(release, tmp_path):
  data = json.loads((release / "dataset.json").read_text())
  first = data[0]["questionPatternModEntities"]
  assert first == "Who did M1 star"
  broken = "HE Who did X star"  # M1 lost
  tsv = tmp_path / "he.tsv"
  with open(tsv, "w") as f:
    for r in data:
      q = r["questionPatternModEntities"]
      f.write(f"{q}\t{broken if q == first else 'HE ' + q}\n")
  t = tr.Translator(tr.FileBackend(tsv, "he"), tmp_path / "c.jsonl")
  report = tr.translate_release(release, ["he"], t, progress=False)
  # The translation that lost M1 is reported, not written: the train part stays incomplete.
  assert not report["complete"]
  assert report["languages"]["he"]["placeholders"] == 1
  assert report["languages"]["he"]["missing"] == report["languages"]["he"]["failed"] == 0
  problems = [json.loads(l) for l in (release / "translation_problems.he.jsonl").open()]
  assert [(p["problem"], p["source"], p["output"]) for p in problems] == [("placeholders", first,
                                                                           broken)]
  data = json.loads((release / "dataset.json").read_text())
  assert "questionPatternModEntities_he" not in data[0]
  assert [r["questionPatternModEntities_he"] for r in data[1:]
         ] == ["HE " + r["questionPatternModEntities"] for r in data[1:]]
  assert not (release / "official" / "cfq_sample" / "train.he.txt").exists()
  assert report["official_incomplete"] == {
      str(release / "official" / "cfq_sample" / "train.he.txt"): 1
  }
  assert not (tmp_path / "c.jsonl").exists()  # the file backend is not cached
  backend, q = tr.FileBackend(tsv, "he"), data[1]["questionPatternModEntities"]
  assert backend.translate(["unknown question", q + "?"], "he") == [None, "HE " + q]
  assert backend.translate([q], "kn") == [None]  # the file's entries are Hebrew


# ---------------------------------------------------------------- Hugging Face backend


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory):
  """A tiny random MarianMTModel + tokenizer saved locally (no download), with a word-level
  vocabulary that has the placeholders M0..M9 (`make_tiny_translation_model.save_marian`)."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  import sentencepiece as spm
  d = tmp_path_factory.mktemp("marian")
  corpus = d / "corpus.txt"
  corpus.write_text("\n".join([
      "Who did M0 star ?", "Was M1 directed by M2 ?", "Did M0 marry M1 's sibling ?",
      "What film did M3 edit ?"
  ] * 20))
  spm.SentencePieceTrainer.train(
      input=str(corpus),
      model_prefix=str(d / "sp"),
      vocab_size=40,
      model_type="word",
      hard_vocab_limit=False,
      user_defined_symbols=[f"M{i}" for i in range(10)])
  out = d / "model"
  out.mkdir()
  mains.load_script("make_tiny_translation_model").save_marian(
      out, (d / "sp.model").read_bytes(), seed=0, max_position_embeddings=64)
  return out


def test_hf_backend_tiny_marian(tiny_marian, tmp_path):
  backend = tr.HFBackend(tiny_marian, batch_size=2, max_new_tokens=8, num_beams=1)
  assert backend.kind == "marian"
  t = tr.Translator(backend, tmp_path / "c.jsonl", batch_size=2)
  texts = ["Who did M0 star", "Was M1 directed by M2", "Did M0 marry M1 's sibling"]
  out = t.translate(texts, "he")
  assert len(out) == 3 and all(isinstance(o, str) for o in out)
  direct = tr.HFBackend(
      tiny_marian, batch_size=2, max_new_tokens=8, num_beams=1).translate([x + "?" for x in texts],
                                                                          "he")
  assert out == [tr.Translator._strip_q(d) for d in direct]  # deterministic, "?" handled
  # A random model does not copy placeholders: each text whose placeholders were lost is flagged.
  lost = [s for s, o in zip(texts, out) if tr.placeholders(s) != tr.placeholders(o)]
  assert [f[0] for f in t.flagged] == lost
  assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 3


def test_hf_backend_end_to_end_cli(tiny_marian, release, tmp_path):
  import shutil
  rel = tmp_path / "rel"
  shutil.copytree(release, rel)
  status = tr.main([
      "--release",
      str(rel), "--lang", "zh", "--backend", "hf", "--model",
      str(tiny_marian), "--batch-size", "32", "--quiet"
  ])
  data = json.loads((rel / "dataset.json").read_text())
  cache = [json.loads(l) for l in (rel / "cache" / "translations.jsonl").open()]
  sources = {r["questionPatternModEntities"] for r in data}
  assert sorted(c["source"] for c in cache) == sorted(sources)  # each text translated once
  # A random model does not copy placeholders: those translations are reported, not written.
  lost = {c["source"] for c in cache if tr.placeholders(c["source"]) != tr.placeholders(c["value"])}
  assert lost
  problems = [json.loads(l) for l in (rel / "translation_problems.zh.jsonl").open()]
  assert {p["source"] for p in problems} == lost
  assert {p["problem"] for p in problems} == {"placeholders"}
  assert status == tr.EXIT_INCOMPLETE
  by_source = {c["source"]: c["value"] for c in cache}
  for r in data:
    q = r["questionPatternModEntities"]
    assert r.get("questionPatternModEntities_zh") == (None if q in lost else by_source[q])
  # Rerun: the gaps come from the cache (no new translation), and are still reported.
  assert tr.main([
      "--release",
      str(rel), "--lang", "zh", "--backend", "hf", "--model",
      str(tiny_marian), "--quiet"
  ]) == tr.EXIT_INCOMPLETE
  assert len((rel / "cache" / "translations.jsonl").read_text().splitlines()) == len(cache)


def test_keep_placeholders_backend():
  backend = tr.KeepPlaceholdersBackend(CountingBackend())
  assert backend.name == "counting+keep-placeholders"
  out = backend.translate(["Did M0 marry M1?", "Who did M1 star?", "M2"], "fr")
  assert out == ["<fr> Did M0 <fr> marry M1?", "<fr> Who did M1 <fr> star?", "M2"]
  # Each distinct piece is sent once; placeholders and punctuation are not sent.
  assert backend.inner.sent == ["Did", "marry", "Who did", "star?"]
  assert tr.KeepPlaceholdersBackend.pieces("Did M0 marry M1?") == [
      "Did ", "M0", " marry ", "M1", "?"
  ]


def test_random_weight_model_script_with_keep_placeholders(release, tmp_path):
  """scripts/make_tiny_translation_model.py (the worked example of docs/dataset_creation.md): a random Marian model
  that never writes a placeholder; with --keep-placeholders the release is complete, every
  question keeps its placeholders, and a rerun translates nothing again (the cache)."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  import shutil
  make_tiny_translation_model = mains.load_script("make_tiny_translation_model")
  model = tmp_path / "mt"
  assert make_tiny_translation_model.build(model, "fr") == 10672
  rel = tmp_path / "rel"
  shutil.copytree(release, rel)
  args = [
      "--release",
      str(rel), "--lang", "fr", "--backend", "hf", "--model",
      str(model), "--keep-placeholders", "--max-new-tokens", "6", "--num-beams", "1", "--quiet"
  ]
  assert tr.main(args) == 0
  data = json.loads((rel / "dataset.json").read_text())
  for r in data:
    fr = r["questionPatternModEntities_fr"]
    assert tr.placeholders(fr) == tr.placeholders(r["questionPatternModEntities"])
    assert [m for m in tr.PLACEHOLDER_RE.findall(fr)
           ] == tr.PLACEHOLDER_RE.findall(r["questionPatternModEntities"])  # source order
  assert (rel / "official" / "cfq_sample" / "train.fr.txt").is_file()
  cache = (rel / "cache" / "translations.jsonl").read_text()
  assert tr.main(args) == 0
  assert (rel / "cache" / "translations.jsonl").read_text() == cache


# ---------------------------------------------------------------- Google REST v2 against a local server
V2 = "/language/translate/v2"
V2_JSON = "application/json; charset=UTF-8"


def _v2_translations(form):
  """A Cloud Translation v2 answer to the request `form`: each text of `q` as "[<target>] text"."""
  return json.dumps({
      "data": {
          "translations": [{
              "translatedText": f"[{form['target'][0]}] {q}"
          } for q in form["q"]]
      }
  }).encode()


class _FakeGoogle(local_http.Handler):
  """Asks the first request to retry after 3 s; refuses (403) a key other than "k123"; translates.
  Records each request's form in `server.forms`."""

  def do_POST(self):  # noqa: N802
    form = self.read_form()
    self.server.forms.append(form)
    if len(self.server.forms) == 1:
      self.answer(429, content_type=V2_JSON, headers={"Retry-After": "3"})
    elif form.get("key") != ["k123"]:
      self.answer(403, content_type=V2_JSON)
    else:
      self.answer(200, _v2_translations(form), V2_JSON)


def test_google_backend_against_local_server(tmp_path, local_server):
  srv = local_server(_FakeGoogle, V2, forms=[])
  waits = []
  g = tr.GoogleBackend("k123", url=srv.url, batch_size=2, min_interval_s=0.0, sleep=waits.append)
  t = tr.Translator(g, tmp_path / "c.jsonl", batch_size=5)
  texts = ["Who did M0 star", "Was M1 Spanish", "Did M2 edit M3", "Who wrote M4", "Was M5 male"]
  out = t.translate(texts, "kn")
  assert out == [f"[kn] {x}" for x in texts]
  assert waits == [3.0]  # Retry-After of the 429
  reqs = srv.forms
  assert [r["q"] for r in reqs[1:]] == [["Who did M0 star?", "Was M1 Spanish?"],
                                        ["Did M2 edit M3?", "Who wrote M4?"], ["Was M5 male?"]]
  assert all(
      r["target"] == ["kn"] and r["source"] == ["en"] and r["format"] == ["text"] for r in reqs)
  assert t.flagged == [] and g.num_requests == 4
  bad = tr.GoogleBackend("wrong", url=g.url, min_interval_s=0.0, sleep=waits.append)
  with pytest.raises(tr.TranslationError, match="HTTP 403"):
    bad.translate(["x"], "he")


def _google_error(status, reason):
  """A Google API error body (the shape Cloud Translation v2 sends)."""
  return status, V2_JSON, json.dumps({
      "error": {
          "code":
              status,
          "message":
              f"{reason} for this project",
          "errors": [{
              "message": f"{reason} for this project",
              "domain": "usageLimits",
              "reason": reason
          }]
      }
  }).encode()


class _ScriptedGoogle(local_http.Handler):
  """Answers the server's `script` of (status, content type, body[, headers]) in turn, then
  translations; records each request's `q` values in `server.queries` and its path in
  `server.paths`."""

  def do_POST(self):  # noqa: N802
    form = self.read_form()
    self.server.queries.append(form["q"])
    self.server.paths.append(self.path)
    if self.server.script:
      status, content_type, body, *more = self.server.script.pop(0)
      self.answer(status, body, content_type, more[0] if more else {})
    else:
      self.answer(200, _v2_translations(form), V2_JSON)


@pytest.fixture
def scripted_google(local_server):
  return local_server(_ScriptedGoogle, V2, script=[], queries=[], paths=[])


def test_google_backend_retries_a_403_rate_limit_and_not_other_403s(scripted_google):
  scripted_google.script = [
      _google_error(403, "userRateLimitExceeded"),
      _google_error(403, "rateLimitExceeded")
  ]
  waits = []
  g = tr.GoogleBackend(
      "k", url=scripted_google.url, min_interval_s=0.0, backoff_s=1.5, sleep=waits.append)
  assert g.translate(["Who did M0 star"], "he") == ["[he] Who did M0 star"]
  assert waits == [1.5, 3.0] and g.num_requests == 3  # backed off, as Google asks
  scripted_google.script = [_google_error(403, "dailyLimitExceeded")]
  with pytest.raises(tr.TranslationError, match="HTTP 403.*dailyLimitExceeded"):
    g.translate(["Was M1 Spanish"], "he")
  assert g.num_requests == 4 and waits == [1.5, 3.0]  # refused: not retried


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_google_backend_redirect_resends_the_form_to_the_new_location(scripted_google, status):
  """The SPARQL client's redirects (one transport): the form is POSTed again, not turned into a
  GET without it."""
  scripted_google.script = [(status, "text/plain", b"", {"Location": "/moved/v2"})]
  g = tr.GoogleBackend("k", url=scripted_google.url, min_interval_s=0.0, sleep=lambda s: None)
  assert g.translate(["Who did M0 star"], "he") == ["[he] Who did M0 star"]
  assert scripted_google.paths == ["/language/translate/v2", "/moved/v2"]
  assert scripted_google.queries == [["Who did M0 star"]] * 2 and g.num_requests == 2
  g.translate(["Was M1 Spanish"], "he")  # a permanent redirect is remembered
  assert scripted_google.paths[2:] == (["/moved/v2"]
                                       if status in (301, 308) else ["/language/translate/v2"])


def test_google_backend_retry_after_longer_than_the_maximum_is_a_failure_not_a_crash(
    scripted_google, tmp_path):
  scripted_google.script = [(429, "text/plain", b"", {"Retry-After": "3600"})] * 3
  waits = []
  g = tr.GoogleBackend("k", url=scripted_google.url, min_interval_s=0.0, sleep=waits.append)
  with pytest.raises(tr.TranslationError, match=r"HTTP 429.*3600 s.*maximum of 600 s.*stopping"):
    g.translate(["Who did M0 star"], "he")
  assert waits == [] and g.num_requests == 1  # not waited for, not retried
  # In a run it is a "failed" problem; the run goes on and finishes.
  t = tr.Translator(g, tmp_path / "c.jsonl", batch_size=1)
  assert t.translate(["Was M1 Spanish", "Did M2 edit M3"], "he") == [None, None]
  assert "3600 s" in t.failures[("he", "Was M1 Spanish")].detail


def test_google_backend_timeout_bounds_the_whole_request_as_for_sparql(local_server):
  srv = local_server(
      local_http.Trickle,
      V2,
      phase="body-with-length",  # the head of a v2 answer at once, its body one byte every 0.2 s
      body=json.dumps({
          "data": {
              "translations": [{
                  "translatedText": "x" * 40
              }]
          }
      }).encode(),
      content_type=V2_JSON,
      interval_s=0.2)
  waits = []
  g = tr.GoogleBackend("k", url=srv.url, min_interval_s=0.0, timeout_s=1.0, sleep=waits.append)
  start = time.monotonic()
  with pytest.raises(tr.TranslationError, match="no complete answer within 1 s"):
    g.translate(["Who did M0 star"], "he")
  elapsed = time.monotonic() - start
  assert 1.0 <= elapsed < 2.0, elapsed  # not ~12 s (the whole trickle), nor 6 tries of it
  assert srv.requests == 1 and waits == []  # a timeout is final: not retried
  assert srv.disconnected.wait(2.0)  # the connection was dropped, not left trickling


def test_google_backend_200_that_is_not_a_v2_answer_is_a_clear_error_and_progress_is_kept(
    scripted_google, tmp_path):
  html = b"<!DOCTYPE html><html><head><title>Sign in - Google Accounts</title></head></html>"
  g = tr.GoogleBackend("k", url=scripted_google.url, min_interval_s=0.0, sleep=lambda s: None)
  scripted_google.script = [(200, "text/html; charset=UTF-8", html)]
  with pytest.raises(tr.TranslationError) as e:
    g.translate(["Who did M0 star"], "kn")
  assert str(e.value).startswith(f"{scripted_google.url}: HTTP 200 but the answer is not JSON")
  assert "<!DOCTYPE html><html><head><title>Sign in" in str(e.value)
  scripted_google.script = [(200, "application/json", b'{"kind": "translate#translations"}')]
  with pytest.raises(tr.TranslationError, match="no 'data.translations' list.*translate#"):
    g.translate(["Who did M0 star"], "kn")
  # In a run, the first batch is translated and kept, the bad answers are reported problems.
  scripted_google.script = [(200, V2_JSON,
                             json.dumps({
                                 "data": {
                                     "translations": [{
                                         "translatedText": "[kn] Who did M0 star?"
                                     }]
                                 }
                             }).encode()), (200, "text/html", html),
                            (200, "application/json", b'{"data": {}}')]
  t = tr.Translator(g, tmp_path / "c.jsonl", batch_size=1)
  texts = ["Who did M0 star", "Was M1 Spanish", "Did M2 edit M3"]
  assert t.translate(texts, "kn") == ["[kn] Who did M0 star", None, None]
  assert "not JSON" in t.failures[("kn", texts[1])].detail
  assert "no 'data.translations'" in t.failures[("kn", texts[2])].detail
  key = t._key(texts[0], "kn", "en")  # pylint: disable=protected-access
  assert tr.Translator(g, tmp_path / "c.jsonl").cache.get(key) == "[kn] Who did M0 star"


# ---------------------------------------------------------------- runs that finish


def _texts(release):
  """Distinct texts to translate in a release: question patterns and bracketed questions."""
  recs = (
      json.loads((release / "dataset.json").read_text()) + json.loads(
          (release / "negatives.json").read_text()))
  return sorted({r[f] for r in recs for f in tr.FIELDS if r.get(f)})


def test_translate_cli_partial_file_reports_gaps_and_rerun_completes(migrated_cfq_sample, tmp_path):
  """`python -m preprocessing.translate --backend file` with a file covering part of the migrated
  CFQ sample: the run finishes, writes what it has, lists every gap, exits 3; a rerun with the
  rest completes the release."""
  import shutil
  rel = tmp_path / "rel"
  shutil.copytree(migrated_cfq_sample, rel)
  texts = _texts(rel)
  data = json.loads((rel / "dataset.json").read_text())
  split = json.loads((rel / "splits" / "cfq_sample.json").read_text())
  dev_questions = {data[k]["questionPatternModEntities"] for k in split["devIdxs"]}
  missing = {t for i, t in enumerate(texts) if i % 4 == 0 and t not in dev_questions}
  broken = next(t for t in texts if "M1" in t and t not in missing and t not in dev_questions)
  with open(tmp_path / "part.he.tsv", "w") as f:
    for t in texts:
      if t not in missing:
        f.write(f"{t}\t{'HE ' + t.replace('M1', 'X') if t == broken else 'HE ' + t}\n")

  def run(file):
    return subprocess.run([
        sys.executable, "-m", "preprocessing.translate", "--release",
        str(rel), "--lang", "he", "--backend", "file", "--file",
        str(file), "--quiet"
    ],
                          cwd=REPO_ROOT,
                          capture_output=True,
                          text=True,
                          check=False,
                          timeout=300)

  proc = run(tmp_path / "part.he.tsv")
  assert proc.returncode == tr.EXIT_INCOMPLETE, proc.stderr
  assert "Traceback" not in proc.stderr
  assert len(texts) == 2038 and len(missing) == 459
  bad = len(missing) + 1
  assert (f"he: {bad} of 2038 texts have no usable translation ({len(missing)} missing, 0 failed, "
          f"1 placeholders); {2038 - bad} done") in proc.stderr
  report = json.loads(proc.stdout)
  assert report["complete"] is False
  assert report["languages"]["he"] == {
      "texts": 2038,
      "kept": 0,
      "translated": 2038 - bad,
      "missing": len(missing),
      "failed": 0,
      "placeholders": 1,
      "records": 1896,
      "records_complete": report["languages"]["he"]["records_complete"]
  }
  assert len(report["problem_examples"]) == 5
  problems = [json.loads(l) for l in (rel / "translation_problems.he.jsonl").open()]
  assert {p["source"] for p in problems if p["problem"] == "missing"} == missing
  assert [(p["source"], p["output"]) for p in problems if p["problem"] == "placeholders"
         ] == [(broken, "HE " + broken.replace("M1", "X"))]
  # What was translated is written; the gaps are absent.
  recs = (
      json.loads((rel / "dataset.json").read_text()) + json.loads(
          (rel / "negatives.json").read_text()))
  for r in recs:
    for field in tr.FIELDS:
      if r.get(field):
        gap = r[field] in missing or r[field] == broken
        assert r.get(f"{field}_he") == (None if gap else "HE " + r[field])
  complete = sum(1 for r in recs if all(f"{f}_he" in r for f in tr.FIELDS if r.get(f)))
  assert report["languages"]["he"]["records_complete"] == complete < 1896
  official = rel / "official" / "cfq_sample"
  dev = readers.read_official(official / "dev.he.txt")
  assert [e.question for e in dev
         ] == ["HE " + e.question for e in readers.read_official(official / "dev.en.txt")]
  assert not (official / "train.he.txt").exists()
  assert report["official_incomplete"] == {
      str(official / "train.he.txt"):
          sum(1 for k in split["trainIdxs"]
              if data[k]["questionPatternModEntities"] in missing | {broken})
  }

  # The rest of the translations: the problem file with its targets filled in.
  with open(tmp_path / "rest.he.jsonl", "w") as f:
    for p in problems:
      f.write(json.dumps({**p, "target": "HE " + p["source"]}, ensure_ascii=False) + "\n")
  proc = run(tmp_path / "rest.he.jsonl")
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout)
  assert report["complete"] is True
  assert report["languages"]["he"] == {
      "texts": 2038,
      "kept": 2038 - bad,
      "translated": bad,
      "missing": 0,
      "failed": 0,
      "placeholders": 0,
      "records": 1896,
      "records_complete": 1896
  }
  assert (rel / "translation_problems.he.jsonl").read_text() == ""
  for part, n in (("train", 1598), ("dev", 220)):
    he = readers.read_release(rel, "cfq_sample", part, "he")
    en = readers.read_release(rel, "cfq_sample", part, "en")
    assert len(he) == n and [e.question for e in he] == ["HE " + e.question for e in en]
    assert [e.question for e in readers.read_official(official / f"{part}.he.txt")
           ] == [e.question for e in he]


class _Flaky(local_http.Handler):
  """Cloud Translation v2 that refuses (400) texts with a word of `server.refuse` and is
  unavailable (503) for texts with a word of `server.unavailable`; records each request's `q`
  values in `server.queries`."""

  def do_POST(self):  # noqa: N802
    form = self.read_form()
    self.server.queries.append(form["q"])
    if any(w in q for q in form["q"] for w in self.server.refuse):
      self.answer(400, content_type=V2_JSON)
    elif any(w in q for q in form["q"] for w in self.server.unavailable):
      self.answer(503, content_type=V2_JSON)
    else:
      self.answer(200, _v2_translations(form), V2_JSON)


def test_translate_remote_failures_are_collected_and_rerun_requests_only_gaps(
    release, tmp_path, local_server):
  import shutil
  rel = tmp_path / "rel"
  shutil.copytree(release, rel)
  texts = _texts(rel)
  refused = {t for t in texts if "star" in t}
  unavailable = {t for t in texts if "influence" in t and t not in refused}
  assert refused and unavailable
  srv = local_server(_Flaky, V2, queries=[], refuse=("star",), unavailable=("influence",))
  waits = []
  google = tr.GoogleBackend(
      "k", url=srv.url, batch_size=1, min_interval_s=0.0, max_retries=2, sleep=waits.append)
  cache = tmp_path / "c.jsonl"
  report = tr.translate_release(
      rel, ["kn"], tr.Translator(google, cache, batch_size=1), progress=False)
  assert not report["complete"]
  c = report["languages"]["kn"]
  assert (c["failed"], c["missing"],
          c["translated"]) == (len(refused) + len(unavailable), 0,
                               len(texts) - len(refused) - len(unavailable))
  problems = {
      p["source"]: p for p in map(json.loads, (rel / "translation_problems.kn.jsonl").open())
  }
  assert set(problems) == refused | unavailable
  assert all("HTTP 400" in problems[t]["detail"] for t in refused)
  assert all("giving up after 3 attempts" in problems[t]["detail"] for t in unavailable)
  assert len(srv.queries) == len(texts) + 2 * len(unavailable)  # 503s retried twice
  data = json.loads((rel / "dataset.json").read_text())
  assert all(
      r.get("questionPatternModEntities_kn") == (
          None if r["questionPatternModEntities"] in problems else "[kn] " +
          r["questionPatternModEntities"]) for r in data)
  # Rerun with the service back: only the gaps are requested.
  srv.queries, srv.refuse, srv.unavailable = [], (), ()
  report = tr.translate_release(
      rel, ["kn"], tr.Translator(google, cache, batch_size=1), progress=False)
  assert report["complete"]
  assert sorted(q for (q,) in srv.queries) == sorted(t + "?" for t in problems)
  assert report["languages"]["kn"]["kept"] == len(texts) - len(problems)
  assert len(readers.read_release(rel, "cfq_sample", "train", "kn")) == len(data)
  # --overwrite translates everything again.
  counting = CountingBackend()
  report = tr.translate_release(
      rel, ["kn"], tr.Translator(counting), progress=False, overwrite=True)
  assert sorted(counting.sent) == sorted(t + "?" for t in texts)
  assert report["complete"] and report["languages"]["kn"]["kept"] == 0
  assert [
      e.question for e in readers.read_official(rel / "official" / "cfq_sample" / "train.kn.txt")
  ] == ["<kn> " + e.question for e in readers.read_release(rel, "cfq_sample", "train", "en")]


def test_translate_stops_sending_after_repeated_failures(tmp_path):

  class Down(tr.Backend):
    name, calls = "down", 0

    def translate(self, texts, target, source="en"):
      Down.calls += 1
      raise tr.TranslationError("HTTP 403: API key not valid")

  t = tr.Translator(Down(), tmp_path / "c.jsonl", batch_size=2, max_consecutive_failures=3)
  texts = [f"Did M0 edit film {i}" for i in range(10)]
  assert t.translate(texts, "zh") == [None] * 10
  assert Down.calls == 3
  assert [t.failures[("zh", x)].detail for x in texts] == ["HTTP 403: API key not valid"] * 6 + [
      "not sent: the last 3 requests failed (last error: HTTP 403: API key not valid)"
  ] * 4
  assert not (tmp_path / "c.jsonl").exists()


# ---------------------------------------------------------------- gold set, BLEU, statistics


@pytest.fixture(scope="module")
def mcd_tests(mcwq_dir):
  return [readers.read_official(mcwq_dir / "official" / s / "test.en.txt") for s in gold.MCD_SPLITS]


def test_gold_intersection_contains_published_gold(mcd_tests, mcwq_dir):
  inter = gold.mcd_test_intersection(mcd_tests)
  assert len(inter) == 1318
  keys = {gold.canonical(e.sparql) for e in inter}
  for lang in ("he", "kn", "zh"):
    gq = readers.read_rir_pair(mcwq_dir / "translations" / "gold" / f"test.{lang}.txt",
                               mcwq_dir / "translations" / "gold" / f"test.{lang}.sparql")
    assert len(gq) == 155
    assert all(gold.canonical(rir.rir_to_sparql(e.rir)) in keys for e in gq)


def test_gold_sampling(mcd_tests):
  inter = gold.mcd_test_intersection(mcd_tests)
  a = gold.sample_gold(inter, seed=0)
  assert a == gold.sample_gold(inter, seed=0) and a != gold.sample_gold(inter, seed=1)
  per = collections.Counter((gold.complexity(e), gold.is_yes_no(e)) for e in a)
  levels = {gold.complexity(e) for e in inter}
  assert set(per.values()) <= {1, 2} and {lvl for lvl, _ in per} == levels
  assert len(a) == 58  # 15 clause-count levels; levels 15 (2 wh-) and 1 (no wh- pair) are short


def test_bleu_machine_vs_human(mcwq_dir):
  """BLEU of the published MT (mcd1 test) against the human gold translations, on the gold
  questions whose query identifies a single mcd1 test question."""
  figures = {}
  for lang in ("he", "kn", "zh"):
    mt = collections.defaultdict(set)
    for e in readers.read_official(mcwq_dir / "official" / "mcd1" / f"test.{lang}.txt"):
      mt[gold.canonical(e.sparql)].add(e.question)
    gq = readers.read_rir_pair(mcwq_dir / "translations" / "gold" / f"test.{lang}.txt",
                               mcwq_dir / "translations" / "gold" / f"test.{lang}.sparql")
    pairs = [(next(iter(mt[k])), e.question)
             for e in gq
             for k in [gold.canonical(rir.rir_to_sparql(e.rir))]
             if len(mt[k]) == 1]
    figures[lang] = (len(pairs),
                     round(gold.bleu([h for h, _ in pairs], [r for _, r in pairs], lang), 2))
  assert figures == {"he": (92, 78.52), "kn": (91, 63.86), "zh": (90, 76.15)}
  assert gold.bleu(["a b c d"], ["a b c d"]) == pytest.approx(100.0)
  with pytest.raises(ValueError):
    gold.bleu(["a"], [])


def test_statistics(mcwq_dir, release, tmp_path, monkeypatch):
  s = stats.compute(
      stats.from_examples(readers.read_official(mcwq_dir / "official" / "mcd1" / "test.en.txt")))
  assert s["examples"] == 5310 and s["yes_no"] + s["wh"] == 5310
  assert s["question_patterns"] == s["unique_questions"] == 5310
  assert s["unique_queries"] == 4036 and s["query_patterns"] == 1435
  assert sum(v for c in s["complexity"].values() for v in c.values()) == 5310
  png = tmp_path / "c.png"
  stats.plot_complexity(s, png)
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  data = json.loads((release / "dataset.json").read_text())
  r = stats.compute(data)
  assert r["examples"] == len(data) and r["yes_no"] == sum(
      d["sparqlPatternModEntities"].startswith("ASK") for d in data)
  assert set(r["complexity"]) == {d["recursionDepth"] for d in data}
  # The measure is named (the official files record no depth) ...
  assert s["complexity_measure"] == "clauses" and r["complexity_measure"] == "recursionDepth"
  # ... and the command's figure is titled with the release (its folder), not "dataset.json".
  drawn = {}
  monkeypatch.setattr(
      stats, "plot_complexity",
      lambda st, path, title: drawn.update(title=title, measure=st["complexity_measure"]))
  assert stats.main(["--dataset", str(release / "dataset.json"), "--png", str(png)]) == 0
  assert drawn == {"title": f"{release.name}: {len(data):,} questions", "measure": "recursionDepth"}
  official = mcwq_dir / "official" / "mcd1" / "test.en.txt"
  assert stats.main(["--official", str(official), "--png", str(png)]) == 0
  assert drawn == {"title": "mcd1/test.en.txt: 5,310 questions", "measure": "clauses"}
  assert stats.COMPLEXITY_AXIS["clauses"] == "complexity level (triples and filters of the query)"


def test_retry_delay_and_pacing():
  from mcwq_t5x.stores import transport  # pylint: disable=g-import-not-at-top
  assert transport.retry_delay(0.5, None) == 0.5
  assert transport.retry_delay(0.5, "") == 0.5
  assert transport.retry_delay(0.5, "7") == 7.0
  assert transport.retry_delay(0.5, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.5  # a past date: backoff
  assert transport.retry_delay(0.5, "Wed, 21 Oct 2015 07:30:00 GMT", now=1445412480.0) == 120.0
  with pytest.raises(transport.RetryAfterTooLong):  # more than the caller's maximum: no capped wait
    transport.retry_delay(0.5, "120", max_s=60.0)
  waits = []
  start = transport.pace(0.0, 0.0, waits.append)
  assert waits == []
  transport.pace(start, 30.0, waits.append)  # 30 s after a request that just started
  assert len(waits) == 1 and 29.0 < waits[0] <= 30.0
