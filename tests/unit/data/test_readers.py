"""Tests of mcwq_t5x.data.paths, mcwq_t5x.data.readers and scripts/download_mcwq.py on the real data."""
import json
import pathlib
import shutil
import stat

import pytest

from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
import local_http
import mains
import readme_commands as rc
import scenarios

# Published dev/test sizes (identical for the four languages).
COUNTS = {
    ("mcd1", "dev"): 5408,
    ("mcd1", "test"): 5310,
    ("mcd2", "dev"): 5929,
    ("mcd2", "test"): 5891,
    ("mcd3", "dev"): 6034,
    ("mcd3", "test"): 6151,
    ("random_split", "dev"): 6163,
    ("random_split", "test"): 6282,
}

MCD1_DEV_EN_FIRST_Q = ("Did M3 's cinematographer and star edit , direct , and write M0 , M1 , "
                       "and M2")
MCD1_DEV_EN_FIRST_SPARQL = (
    "ASK WHERE { M3 wdt:P161 ?x0 . M3 wdt:P344 ?x0 . M0 wdt:P57 ?x0 . M1 wdt:P57 ?x0 . "
    "M2 wdt:P57 ?x0 . M0 wdt:P1040 ?x0 . M1 wdt:P1040 ?x0 . M2 wdt:P1040 ?x0 . "
    "M0 wdt:P58 ?x0 . M1 wdt:P58 ?x0 . M2 wdt:P58 ?x0 }")
MCD1_DEV_FIRST_RIR = (
    "ASK WHERE lb ( M3 ( wdt:P161 , wdt:P344 ) ( ?x0 ) ) . ( M0 ( wdt:P57 , wdt:P1040 , wdt:P58 ) "
    "( ?x0 ) ) . ( M1 ( wdt:P57 , wdt:P1040 , wdt:P58 ) ( ?x0 ) ) . ( M2 ( wdt:P57 , wdt:P1040 , "
    "wdt:P58 ) ( ?x0 ) ) rb")


def _lines(path):
  text = pathlib.Path(path).read_text(encoding="utf-8")
  return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


# --- real data ------------------------------------------------------------------------------


def test_read_official_first_example(mcwq_dir):
  ex = readers.read_official(mcwq_dir / "official/mcd1/dev.en.txt")
  assert len(ex) == 5408
  assert ex[0].question == MCD1_DEV_EN_FIRST_Q
  assert ex[0].sparql == MCD1_DEV_EN_FIRST_SPARQL
  assert ex[0].rir is None and ex[0].language == "en" and ex[0].line == 1
  assert ex[-1].line == 5408
  first_line = _lines(mcwq_dir / "official/mcd1/dev.en.txt")[0]
  assert first_line == f"IN: {ex[0].question}  OUT: {ex[0].sparql}"


@pytest.mark.parametrize("split,part", sorted(COUNTS))
def test_read_split_counts_all_languages(mcwq_dir, split, part):
  first = None
  for lang in readers.LANGUAGES:
    ex = readers.read_split(split, part, lang, mcwq_dir)
    assert len(ex) == COUNTS[split, part]
    assert all(e.language == lang for e in ex[:5])
    # parallel languages: same queries line by line
    if first is None:
      first = [e.sparql for e in ex]
    else:
      assert [e.sparql for e in ex] == first


@pytest.mark.parametrize("part", ["dev", "test"])
@pytest.mark.parametrize("lang", readers.LANGUAGES)
def test_official_matches_translations(mcwq_dir, part, lang):
  """read_split's question/RIR equal the published translations/mcd1 files line by line."""
  ex = readers.read_split("mcd1", part, lang, mcwq_dir)
  questions = _lines(mcwq_dir / f"translations/mcd1/{part}.{lang}.txt")
  rirs = _lines(mcwq_dir / f"translations/mcd1/{part}.{lang}.sparql")
  assert [e.question for e in ex] == questions
  assert [e.rir for e in ex] == rirs
  if part == "dev" and lang == "en":
    assert ex[0].rir == MCD1_DEV_FIRST_RIR


def test_three_space_separator_line(mcwq_dir):
  # official/mcd1/dev.he.txt line 2209 has a question ending in a space ("M0   OUT:").
  raw = _lines(mcwq_dir / "official/mcd1/dev.he.txt")[2208]
  assert "   OUT: " in raw
  ex = readers.read_official(mcwq_dir / "official/mcd1/dev.he.txt")[2208]
  assert ex.line == 2209 and not ex.question.endswith(" ")
  assert ex.question == _lines(mcwq_dir / "translations/mcd1/dev.he.txt")[2208]


@pytest.mark.parametrize("lang", readers.GOLD_LANGUAGES)
def test_gold(mcwq_dir, lang):
  ex = readers.read_split("gold", "test", lang, mcwq_dir)
  assert len(ex) == 155
  assert ex[0].rir == "ASK WHERE lb ( M0 ( wdt:P106 ) ( wd:Q69423232 ) ) rb"
  assert ex[0].sparql == "ASK WHERE { M0 wdt:P106 wd:Q69423232 }"
  assert ex[0].question == _lines(mcwq_dir / f"translations/gold/test.{lang}.txt")[0]
  jsonl = readers.read_translation_jsonl(mcwq_dir / f"translations/gold/test.{lang}.json")
  assert [(e.question, e.rir) for e in jsonl] == [(e.question, e.rir) for e in ex]
  assert jsonl[0].language == lang


def test_read_rir_pair_without_trailing_newline(mcwq_dir):
  q = mcwq_dir / "translations/mcd1/test.zh.txt"
  assert not q.read_bytes().endswith(b"\n")  # `wc -l` shows 5309
  ex = readers.read_rir_pair(q, q.with_suffix(".sparql"))
  assert len(ex) == 5310 and ex[0].sparql is None and ex[0].language == "zh"


def test_available_parts_and_missing_train(mcwq_dir):
  assert readers.available_parts("mcd1", "en", mcwq_dir) == ("dev", "test")
  assert readers.available_parts("gold", "he", mcwq_dir) == ("test",)
  with pytest.raises(paths.DataNotFoundError) as e:
    readers.read_split("mcd1", "train", "en", mcwq_dir)
  msg = str(e.value)
  assert str(mcwq_dir / "official/mcd1/train.en.txt") in msg
  assert "python scripts/download_mcwq.py" in msg


def test_bad_arguments(mcwq_dir):
  with pytest.raises(ValueError, match="unknown split"):
    readers.read_split("mcd4", "dev", "en", mcwq_dir)
  with pytest.raises(ValueError, match="unknown language"):
    readers.read_split("mcd1", "dev", "fr", mcwq_dir)
  with pytest.raises(ValueError, match="gold set has only"):
    readers.read_split("gold", "dev", "he", mcwq_dir)


# --- malformed input -------------------------------------------------------------------------

LINE = "IN: Did M0 direct M1  OUT: ASK WHERE { M0 wdt:P57 M1 }"


def test_line_without_out(tmp_path):
  f = tmp_path / "dev.en.txt"
  f.write_text(f"{LINE}\n{LINE}\nIN: Did M0 direct M1\n", encoding="utf-8")
  with pytest.raises(readers.DataFormatError) as e:
    readers.read_official(f)
  assert str(e.value).startswith(f"{f}:3: ")
  assert "OUT:" in str(e.value)
  assert e.value.line == 3 and e.value.path == str(f)


def test_line_without_in(tmp_path):
  f = tmp_path / "dev.en.txt"
  f.write_text(f"{LINE}\nDid M0 direct M1  OUT: ASK WHERE {{ M0 wdt:P57 M1 }}\n")
  with pytest.raises(readers.DataFormatError, match=r":2: .*IN:"):
    readers.read_official(f)


def test_read_lines_splits_only_at_newline_and_reports_bad_utf8(tmp_path):
  f = tmp_path / "preds.txt"
  # U+2028 and U+0085 are line breaks for str.splitlines but not for the MCWQ files.
  f.write_bytes("a\u2028b\u0085c\r\nd\n\nlast".encode())
  assert readers.read_lines(f) == ["a\u2028b\u0085c", "d", "", "last"]
  f.write_bytes(b"ok\nbad \xff byte\n")
  with pytest.raises(readers.DataFormatError) as e:
    readers.read_lines(f)
  assert str(e.value).startswith(f"{f}:2: not valid UTF-8")
  assert readers.read_lines(f, strict=False) == ["ok", "bad \ufffd byte"]
  with pytest.raises(paths.DataNotFoundError, match="download_mcwq.py"):
    readers.read_lines(tmp_path / "absent.txt")


def test_decode_lines_is_read_lines_of_bytes(tmp_path):
  """Standard input (`mcwq_t5x.infer`) is split as files are: BOM, CRLF, final line without newline,
  no empty line after the last newline; bad UTF-8 names the source and line."""
  data = "\ufeffDid M0 direct M1\r\nWas M2 \u2028 a film\n\nlast".encode()
  f = tmp_path / "questions.txt"
  f.write_bytes(data)
  assert readers.decode_lines(data, "<stdin>") == readers.read_lines(f) == [
      "Did M0 direct M1", "Was M2 \u2028 a film", "", "last"
  ]
  assert readers.decode_lines(b"", "<stdin>") == [] and readers.decode_lines(b"\n", "x") == [""]
  with pytest.raises(readers.DataFormatError, match=r"^<stdin>:3: not valid UTF-8"):
    readers.decode_lines(b"a\nb\n\xc3(\n", "<stdin>")
  assert readers.decode_lines(b"a\n\xc3(\n", "<stdin>", strict=False) == ["a", "\ufffd("]


def test_split_official_line(mcwq_dir):
  first = readers.read_lines(mcwq_dir / "official/mcd1/dev.en.txt")[0]
  question, sparql = readers.split_official_line(first)
  assert question == "Did M3 's cinematographer and star edit , direct , and write M0 , M1 , and M2"
  assert sparql.startswith("ASK WHERE { M3 wdt:P161 ?x0 . M3 wdt:P344 ?x0 .")
  assert readers.split_official_line("IN: Who is M0   OUT:  ASK  WHERE { M0 wdt:P57 ?x0 }") == (
      "Who is M0", "ASK WHERE { M0 wdt:P57 ?x0 }")
  assert readers.split_official_line("IN: Did M0 direct M1") is None
  assert readers.split_official_line("Did M0 direct M1  OUT: ASK WHERE { }") is None


def test_format_official_line_round_trips(tmp_path):
  line = readers.format_official_line("Who directed  M0 ",
                                      "SELECT DISTINCT ?x0 WHERE {\n?x0 wdt:P57 M0\n}")
  assert line == "IN: Who directed M0  OUT: SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 }"
  assert readers.split_official_line(line) == ("Who directed M0",
                                               "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 }")
  f = tmp_path / "train.en.txt"
  f.write_text(line + "\n", encoding="utf-8")
  [ex] = readers.read_official(f, with_rir=True)
  assert ex.rir == "SELECT DISTINCT ?x0 WHERE lb ( ?x0 ( wdt:P57 ) ( M0 ) ) rb"


def test_crlf_and_no_trailing_newline(tmp_path):
  f = tmp_path / "dev.he.txt"
  f.write_bytes(f"{LINE}\r\n{LINE}".encode())
  ex = readers.read_official(f)
  assert len(ex) == 2 and ex[1].sparql == "ASK WHERE { M0 wdt:P57 M1 }"
  assert ex[1].language == "he"


def test_unequal_parallel_files(tmp_path):
  q, s = tmp_path / "train.en.txt", tmp_path / "train.en.sparql"
  q.write_text("Did M0 direct M1\nDid M1 direct M0\nWho directed M0")
  s.write_text(
      "ASK WHERE lb ( M0 ( wdt:P57 ) ( M1 ) ) rb\nASK WHERE lb ( M1 ( wdt:P57 ) ( M0 ) ) rb")
  with pytest.raises(readers.DataFormatError) as e:
    readers.read_rir_pair(q, s)
  assert str(e.value).startswith(f"{s}:3: ")
  assert "3 lines" in str(e.value) and "2" in str(e.value)


def test_bad_json_line(tmp_path):
  f = tmp_path / "test.kn.json"
  good = json.dumps(
      {"translation": {
          "src": "q",
          "tgt": "ASK WHERE lb ( M0 ( wdt:P57 ) ( M1 ) ) rb"
      }})
  f.write_text(f"{good}\n{good}\n{{\"translation\": {{\"src\": \"q\"\n")
  with pytest.raises(readers.DataFormatError, match=r"test\.kn\.json:3: bad JSON"):
    readers.read_translation_jsonl(f)
  f.write_text(f'{good}\n{{"src": "q", "tgt": "x"}}\n')
  with pytest.raises(readers.DataFormatError, match=r":2: expected \{\"translation\""):
    readers.read_translation_jsonl(f)
  f.write_text(f'{good}\n\n{{"translation": {{"src": "  ", "tgt": "ASK WHERE lb rb"}}}}\n')
  with pytest.raises(readers.DataFormatError, match=r"test\.kn\.json:3: empty question"):
    readers.read_translation_jsonl(f)


def test_read_bytes_of_a_file_or_an_object(tmp_path, local_gcs, monkeypatch):
  """`paths.read_bytes`: a local file, an object of the GCS stand-in by its `gs://` URL (a key
  with "/" and a space), a missing object (FileNotFoundError) and a store that does not answer
  (OSError naming the URL and TensorStore's error after its retries)."""
  (tmp_path / "local.model").write_bytes(b"\x00local")
  (local_gcs.root / "bucket" / "a dir").mkdir(parents=True)
  (local_gcs.root / "bucket" / "a dir" / "spm.model").write_bytes(b"\x00remote" * 1000)
  assert paths.read_bytes(tmp_path / "local.model") == b"\x00local"
  assert paths.read_bytes("gs://bucket/a dir/spm.model") == b"\x00remote" * 1000
  with pytest.raises(FileNotFoundError, match=r"^gs://bucket/a dir/other.model: no such object$"):
    paths.read_bytes("gs://bucket/a dir/other.model")
  assert [p.partition("?")[0] for p in local_gcs.seen] == [
      "/storage/v1/b/bucket/o/a%20dir%2Fspm.model", "/storage/v1/b/bucket/o/a%20dir%2Fother.model"
  ]
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{local_http.free_port()}")
  with pytest.raises(OSError, match=r"^gs://bucket/x: ABORTED: All 4 retry attempts failed: "):
    paths.read_bytes("gs://bucket/x")


def test_missing_data_dir(tmp_path, monkeypatch):
  missing = tmp_path / "nowhere" / "mcwq"
  monkeypatch.setenv("MCWQ_DATA_DIR", str(missing))
  with pytest.raises(paths.DataNotFoundError) as e:
    readers.read_split("mcd1", "dev", "en")
  assert str(missing) in str(e.value)
  assert "python scripts/download_mcwq.py --out" in str(e.value)
  with pytest.raises(paths.DataNotFoundError):
    readers.read_official(tmp_path / "dev.en.txt")


# --- the full-release layout (synthetic dataset.json + splits) --------------------------------


def _record(i, en, he, sparql, depth, answer):
  return {
      "questionIdx": i,
      "questionPatternModEntities": en,
      "questionPatternModEntities_he": he,
      "questionWithBrackets": en.replace("M0", "[Ridley Scott]"),
      "questionWithBrackets_he": he.replace("M0", "[רידלי סקוט]"),
      "sparqlPatternModEntities": sparql,
      "recursionDepth": depth,
      "expectedResponse": answer,
  }


@pytest.fixture()
def release_dir(tmp_path):
  records = [
      _record(0, "Did M0 direct M1", "האם M0 ביים את M1", "ASK WHERE {\nM0 wdt:P57 M1\n}", 10,
              "Yes"),
      _record(1, "Who directed M0", "מי ביים את M0",
              "SELECT DISTINCT ?x0 WHERE {\n?x0 wdt:P57 M0\n}", 12, ["wd:Q56005"]),
      _record(2, "Did M1 's star marry M0", "האם הכוכב של M1 התחתן עם M0",
              "ASK WHERE {\nM1 wdt:P161 ?x0 .\n?x0 wdt:P26 M0 .\nFILTER ( ?x0 != M0 )\n}", 15,
              "No"),
  ]
  (tmp_path / "dataset.json").write_text(
      json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits/mcd1.json").write_text(
      json.dumps({
          "trainIdxs": [2, 0],
          "devIdxs": [1],
          "testIdxs": []
      }, indent=1))
  return tmp_path


def test_release_layout(release_dir):
  train = readers.read_split("mcd1", "train", "he", release_dir)
  assert [e.question for e in train] == ["האם הכוכב של M1 התחתן עם M0", "האם M0 ביים את M1"]
  assert train[0].sparql == "ASK WHERE { M1 wdt:P161 ?x0 . ?x0 wdt:P26 M0 . FILTER ( ?x0 != M0 ) }"
  assert train[0].rir == ("ASK WHERE lb ( M1 ( wdt:P161 ) ( ?x0 ) ) . ( ?x0 ( wdt:P26 ) ( M0 ) ) . "
                          "( FILTER ( ?x0 != M0 ) ) rb")
  assert (train[0].recursionDepth, train[0].expectedResponse) == (15, "No")
  assert train[0].line == 3 and train[0].source == str(release_dir / "dataset.json")
  dev = readers.read_split("mcd1", "dev", "en", release_dir)
  assert dev[0].question == "Who directed M0"
  assert dev[0].expectedResponse == ["wd:Q56005"] and dev[0].recursionDepth == 12
  assert readers.read_split("mcd1", "test", "en", release_dir) == []
  assert readers.split_files("mcd1", "dev", "en", release_dir)[0] == "release"


def test_release_missing_language_field(release_dir):
  with pytest.raises(readers.DataFormatError) as e:
    readers.read_split("mcd1", "dev", "kn", release_dir)
  assert "questionPatternModEntities_kn" in str(e.value)
  assert str(e.value).startswith(f"{release_dir / 'dataset.json'}:")


def test_release_index_out_of_range(release_dir):
  (release_dir / "splits/mcd2.json").write_text(
      '{\n "trainIdxs": [\n  0,\n  1\n ],\n "devIdxs": [\n  2,\n  7\n ],\n "testIdxs": []\n}')
  with pytest.raises(readers.DataFormatError) as e:
    readers.read_split("mcd2", "dev", "en", release_dir)
  assert str(e.value).startswith(f"{release_dir / 'splits/mcd2.json'}:8: ")
  assert "devIdxs[1] = 7" in str(e.value) and "3 records" in str(e.value)


def test_release_bad_json(release_dir):
  (release_dir / "splits/mcd3.json").write_text('{"trainIdxs": [0,\n 1,,\n]}')
  with pytest.raises(readers.DataFormatError, match=r"mcd3\.json:2: bad JSON"):
    readers.read_split("mcd3", "train", "en", release_dir)


def test_official_layout_preferred_and_translations_layout(release_dir):
  (release_dir / "official/mcd1").mkdir(parents=True)
  (release_dir / "official/mcd1/dev.en.txt").write_text(LINE + "\n")
  assert readers.read_split("mcd1", "dev", "en", release_dir)[0].question == "Did M0 direct M1"
  (release_dir / "translations/mcd2").mkdir(parents=True)
  (release_dir / "translations/mcd2/train.zh.txt").write_text("M0导演了M1吗？")
  (release_dir /
   "translations/mcd2/train.zh.sparql").write_text("ASK WHERE lb ( M0 ( wdt:P57 ) ( M1 ) ) rb")
  ex = readers.read_split("mcd2", "train", "zh", release_dir)
  assert ex[0].sparql == "ASK WHERE { M0 wdt:P57 M1 }" and ex[0].question == "M0导演了M1吗？"
  (release_dir / "translations/mcd3").mkdir(parents=True)
  (release_dir / "translations/mcd3/dev.kn.json").write_text(
      json.dumps(
          {"translation": {
              "src": "M0 ?",
              "tgt": "ASK WHERE lb ( M0 ( wdt:P57 ) ( M1 ) ) rb"
          }}) + "\n")
  assert readers.split_files("mcd3", "dev", "kn", release_dir)[0] == "jsonl"
  ex = readers.read_split("mcd3", "dev", "kn", release_dir)
  assert (ex[0].question, ex[0].sparql) == ("M0 ?", "ASK WHERE { M0 wdt:P57 M1 }")


# --- paths ----------------------------------------------------------------------------------


def test_paths_argument_env_and_default(tmp_path, monkeypatch, mcwq_dir):
  monkeypatch.delenv("MCWQ_DATA_DIR", raising=False)
  assert paths.data_dir() == mcwq_dir.absolute()
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path))
  assert paths.data_dir() == tmp_path
  other = tmp_path / "other"
  other.mkdir()
  assert paths.data_dir(other) == other  # an explicit path wins over the environment
  with pytest.raises(paths.DataNotFoundError, match="missing"):
    paths.data_dir(tmp_path / "missing")
  monkeypatch.setenv("MCWQ_CACHE_DIR", str(tmp_path / "cache"))
  assert paths.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()


# --- scripts/download_mcwq.py ---------------------------------------------------------------


def _download_script():
  return mains.load_script("download_mcwq")


@pytest.mark.xdist_group(f"readme-{rc.chain(rc.DOWNLOAD)}")  # reads its README run
def test_download_from_local_copy(tmp_path, mcwq_dir, readme, capsys):
  """The README's `python scripts/download_mcwq.py --from ../shared/mcwq --out runs/mcwq_copy`
  (run once per session by the `readme` fixture) copies and verifies the release."""
  stdout = scenarios.check(readme.result(rc.DOWNLOAD))["stdout"]
  assert "mcd1   dev: en=5,408  he=5,408  kn=5,408  zh=5,408" in stdout
  assert "gold  test: he=155  kn=155  zh=155" in stdout
  copy = readme.repo / "runs/mcwq_copy"
  assert (copy /
          "official/mcd1/dev.en.txt").read_bytes() == (mcwq_dir /
                                                       "official/mcd1/dev.en.txt").read_bytes()
  assert len(readers.read_split("mcd3", "test", "kn", copy)) == 6151
  # CI's ../shared has no write bits; the copy must not inherit them (root ignores them, so
  # check the bits rather than a write).
  for p in [copy / "official", copy / "official/mcd2", copy / "official/mcd2/test.he.txt"]:
    assert p.stat().st_mode & stat.S_IWUSR, p
  # A truncated language file is caught (in a copy of the README's copy).
  dl = _download_script()
  out = tmp_path / "mcwq"
  shutil.copytree(copy, out)
  f = out / "official/mcd2/test.he.txt"
  f.write_text("\n".join(_lines(f)[:-1]) + "\n", encoding="utf-8")
  assert dl.main(["--verify-only", "--out", str(out)]) == 1
  err = capsys.readouterr().err
  assert "mcd2/test: parallel languages differ" in err
  assert "expected 5,891 examples, found {'he': 5890}" in err


def test_download_upstream_file_list():
  dl = _download_script()
  files = dict(dl.upstream_files())
  assert files["official/mcd1/dev.he.txt"] is True
  assert files["translations/random_split/train.zh.sparql"] is False
  assert files["translations/gold/test.kn.sparql"] is True
  assert len([f for f in files if f.startswith("official/")]) == 32
