"""Readers for every published form of MCWQ (Cui et al., TACL 2022), all returning `Example`.

Layouts (upstream GitHub `coastalcph/seq2sparql`, `mcwq/`, and the full release; docs/data.md):
`official/{split}/{part}.{lang}.txt` (`read_official`), `translations/` line-parallel `.txt` +
`.sparql` RIR files (`read_rir_pair`) or Hugging Face JSON lines (`read_translation_jsonl`), and
`dataset.json` + `splits/{split}.json` (`read_release`). `read_split(split, part, language)` is
the one entry point: it finds whichever layout exists; `discover(data_dir)` finds a directory's
splits and languages from listings alone. Questions are normalised by `normalize_question` and
line files split by `decode_lines`, everywhere in the project. Reading is cached per file (path,
size, mtime). Malformed input raises `DataFormatError` (`FILE:LINE: problem`); missing files
`paths.DataNotFoundError`. No TensorFlow or seqio import.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import unicodedata
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from mcwq_t5x.data import paths

SPLITS = ("mcd1", "mcd2", "mcd3", "random_split")
LANGUAGES = ("en", "he", "kn", "zh")
PARTS = ("train", "dev", "test")
# TFDS / SeqIO split name -> MCWQ part (the release calls the validation part `dev`).
DATASET_SPLIT_TO_PART = {"train": "train", "validation": "dev", "test": "test"}
GOLD_LANGUAGES = ("he", "kn", "zh")
GOLD_SPLIT = "gold"
#: A language code in a file name (`dev.fr.txt`): ISO 639-1/-3 letters, the form task names take.
LANGUAGE_CODE_RE = re.compile(r"^[a-z]{2,3}$")
#: A split name (a folder under `official/` or `translations/`, a `splits/{name}.json` stem).
SPLIT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")

PathLike = Union[str, os.PathLike]

# `IN: question<whitespace>OUT: query`; the question is taken up to the first " OUT:".
_OFFICIAL_RE = re.compile(r"^IN:[ \t]?(?P<question>.*?)[ \t]+OUT:[ \t]?(?P<query>.*)$")

#: The byte order mark (U+FEFF) some editors put at the start of a UTF-8 file.
BOM = "\ufeff"
#: The Unicode normalisation form of every question (see `normalize_question`).
NORMALIZATION_FORM = "NFC"


def normalize_question(text: str) -> str:
  """The one normalisation of questions: leading BOM dropped, Unicode NFC, stripped ("" if
  blank)."""
  text = text.lstrip(BOM)
  # why NFC: canonically equivalent spellings (a Kannada question typed in NFD) become the same
  # tokens; not NFKC, which would rewrite every Chinese question's full-width punctuation (the
  # published files are NFC already; mT5's sentencepiece applies its own `nmt_nfkc` on top).
  if not unicodedata.is_normalized(NORMALIZATION_FORM, text):
    text = unicodedata.normalize(NORMALIZATION_FORM, text)
  return text.strip()


class DataFormatError(ValueError):
  """Malformed MCWQ input; the message is `FILE:LINE: problem` (LINE is 1-based)."""

  def __init__(self, path: PathLike, line: int, problem: str):
    self.path = str(path)
    self.line = line
    self.problem = problem
    super().__init__(f"{path}:{line}: {problem}")


@dataclasses.dataclass(frozen=True)
class Example:
  """One MCWQ example (field names as dataset.json's).

  `question` with placeholders M0..M9, normalised on creation; `sparql` (MCWQ formatting) or None
  when the source has only RIR; `rir` or None; `language` ("en", "he", "kn", "zh" or a release's
  own); `recursionDepth` and `expectedResponse` where dataset.json has them; `source` and 1-based
  `line` (dataset.json: record number).
  """
  question: str
  sparql: Optional[str]
  rir: Optional[str]
  language: str
  recursionDepth: Optional[int] = None  # pylint: disable=invalid-name
  expectedResponse: Any = None  # pylint: disable=invalid-name
  source: str = ""
  line: int = 0

  def __post_init__(self):
    if isinstance(self.question, str):
      object.__setattr__(self, "question", normalize_question(self.question))


# ------------------------------------------------------------------------------------------
# Low-level helpers.


def decode_lines(data: bytes, source: PathLike, strict: bool = True) -> list[str]:
  """The lines of a UTF-8 line file's bytes, without terminators; "\\n" alone ends a line.

  A final line without newline counts; "\\r" before "\\n" and a leading BOM go. `strict=False`
  (predictions): undecodable bytes become U+FFFD. DataFormatError (`SOURCE:LINE`) when strict.
  """
  try:
    text = data.decode("utf-8", errors="strict" if strict else "replace")
  except UnicodeDecodeError as e:
    raise DataFormatError(source,
                          data.count(b"\n", 0, e.start) + 1, f"not valid UTF-8 ({e.reason})") from e
  text = text[1:] if text.startswith(BOM) else text
  if not text:
    return []
  # why not `str.splitlines`: it also breaks at U+2028, U+0085, ... inside questions or junk.
  lines = text.split("\n")
  # why: the `translations/` files lack the final newline (`wc -l` shows 5407 for 5408 lines).
  if lines[-1] == "":
    lines.pop()
  return [l[:-1] if l.endswith("\r") else l for l in lines]


def read_lines(path: PathLike, strict: bool = True) -> list[str]:
  """The lines of a UTF-8 text file (`decode_lines`); DataNotFoundError (naming the fetch command),
  DataFormatError (`FILE:LINE`, when strict)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise paths.not_found(path, "MCWQ file")
  return decode_lines(path.read_bytes(), path, strict)


def split_official_line(line: str) -> Optional[tuple[str, str]]:
  """`IN: <question>  OUT: <SPARQL>` -> (question stripped, SPARQL whitespace-collapsed), or
  None."""
  # The question ends at the first whitespace-preceded `OUT:` (a few he/kn questions end in a
  # space); either side may be empty.
  m = _OFFICIAL_RE.match(line)
  if m is None:
    return None
  return m.group("question").strip(), " ".join(m.group("query").split())


def _language_from_name(path: PathLike) -> str:
  """`.../dev.he.txt` -> "he", `.../dev.fr.txt` -> "fr"; "" when the name has no language code."""
  parts = pathlib.Path(path).name.split(".")
  for p in reversed(parts[:-1]):
    if p in LANGUAGES:
      return p
  # A published code anywhere before the extension wins; else the component before it, if code-like.
  if len(parts) >= 3 and LANGUAGE_CODE_RE.match(parts[-2]):
    return parts[-2]
  return ""


def _cached(fn: Callable[..., tuple[Example, ...]]) -> Callable[..., tuple[Example, ...]]:
  """Caches a reader on (resolved path(s), size, mtime) plus its other arguments."""

  @functools.lru_cache(maxsize=256)
  def _inner(key, *args, **kwargs):
    del key
    return fn(*args, **kwargs)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    key = []
    for a in list(args) + list(kwargs.values()):
      if isinstance(a, (str, os.PathLike)) and os.path.isfile(a):
        st = os.stat(a)
        key.append((os.path.realpath(a), st.st_size, st.st_mtime_ns))
      else:
        key.append(a)
    return _inner(tuple(key), *args, **kwargs)

  wrapper.cache_clear = _inner.cache_clear  # type: ignore[attr-defined]
  return wrapper


@functools.lru_cache(maxsize=1 << 18)
def _rir_of(sparql: str) -> str:
  """`rir.sparql_to_rir`, kept per query: the four languages of a split share their queries (a
  failed conversion is not kept: it raises again)."""
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  return rir.sparql_to_rir(sparql)


def _sparql_to_rir(sparql: str, path: PathLike, line: int) -> str:
  try:
    return _rir_of(sparql)
  except ValueError as e:  # RIRError and SparqlParseError are ValueErrors.
    raise DataFormatError(path, line, f"cannot convert SPARQL to RIR: {e}") from e


def _rir_to_sparql(rir_text: str, path: PathLike, line: int) -> str:
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  try:
    return rir.rir_to_sparql(rir_text)
  except ValueError as e:
    raise DataFormatError(path, line, f"malformed RIR query: {e}") from e


def format_official_line(question: str, sparql: str) -> str:
  """The `official/` line `IN: <question>  OUT: <SPARQL>` of one example (no newline), whitespace
  runs (newlines of CFQ-style records too) as single spaces; the inverse of
  `split_official_line`."""
  return f"IN: {' '.join(question.split())}  OUT: {' '.join(sparql.split())}"


# ------------------------------------------------------------------------------------------
# Readers of the published forms.


@_cached
def _read_official(path: PathLike, language: str, with_rir: bool) -> tuple[Example, ...]:
  lines = read_lines(path)
  examples = []
  for i, line in enumerate(lines, start=1):
    sides = split_official_line(line)
    if sides is None:
      if not line.startswith("IN:"):
        problem = "expected a line `IN: <question>  OUT: <SPARQL>`, it does not start with `IN:`"
      else:
        problem = "expected `IN: <question>  OUT: <SPARQL>`, found no `OUT:` separator"
      raise DataFormatError(path, i, f"{problem}: {line[:80]!r}")
    question, sparql = sides
    if not question:
      raise DataFormatError(path, i, "empty question")
    if not sparql:
      raise DataFormatError(path, i, "empty SPARQL query after `OUT:`")
    examples.append(
        Example(
            question=question,
            sparql=sparql,
            rir=_sparql_to_rir(sparql, path, i) if with_rir else None,
            language=language,
            source=str(path),
            line=i))
  return tuple(examples)


def read_official(path: PathLike,
                  language: Optional[str] = None,
                  with_rir: bool = False) -> list[Example]:
  """One Example per line of `official/{split}/{part}.{lang}.txt` (`language` from the name).

  Raises DataNotFoundError, DataFormatError (no `IN:`/`OUT:`, an empty side, or with `with_rir` a
  query that does not convert to RIR).
  """
  language = language if language is not None else _language_from_name(path)
  return list(_read_official(str(path), language, with_rir))


@_cached
def _read_rir_pair(question_path: PathLike, sparql_path: PathLike, language: str,
                   with_sparql: bool) -> tuple[Example, ...]:
  questions = read_lines(question_path)
  queries = read_lines(sparql_path)
  if len(questions) != len(queries):
    shorter, n = ((question_path, len(questions)) if len(questions) < len(queries) else
                  (sparql_path, len(queries)))
    raise DataFormatError(
        shorter, n + 1,
        f"parallel files have unequal line counts: {question_path} has {len(questions)} lines, "
        f"{sparql_path} has {len(queries)}")
  return tuple(
      _rir_example(
          q,
          r,
          language,
          with_sparql, (question_path, i, "empty question line"), (sparql_path, i,
                                                                   "empty query line"),
          source=question_path,
          line=i) for i, (q, r) in enumerate(zip(questions, queries), start=1))


def _rir_example(question: str, rir: str, language: str, with_sparql: bool,
                 question_where: tuple[PathLike, int, str], rir_where: tuple[PathLike, int, str],
                 source: PathLike, line: int) -> Example:
  """One Example of a question and its RIR; DataFormatError (file, line) if empty or malformed."""
  q, r = question.strip(), " ".join(rir.split())
  if not q:
    raise DataFormatError(*question_where)
  if not r:
    raise DataFormatError(*rir_where)
  return Example(
      question=q,
      sparql=_rir_to_sparql(r, rir_where[0], rir_where[1]) if with_sparql else None,
      rir=r,
      language=language,
      source=str(source),
      line=line)


def read_rir_pair(question_path: PathLike,
                  sparql_path: PathLike,
                  language: Optional[str] = None,
                  with_sparql: bool = False) -> list[Example]:
  """One Example per line of parallel question (`*.txt`) and RIR (`*.sparql`) files.

  Raises DataNotFoundError, DataFormatError (different line counts: names the shorter file and
  its first missing line; an empty line; with `with_sparql` malformed RIR).
  """
  language = language if language is not None else _language_from_name(question_path)
  return list(_read_rir_pair(str(question_path), str(sparql_path), language, with_sparql))


@_cached
def _read_translation_jsonl(path: PathLike, language: str,
                            with_sparql: bool) -> tuple[Example, ...]:
  examples = []
  for i, line in enumerate(read_lines(path), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataFormatError(path, i, f"bad JSON ({e.msg} at column {e.colno})") from e
    tr = record.get("translation") if isinstance(record, dict) else None
    if not isinstance(tr, dict) or not isinstance(tr.get("src"), str) or not isinstance(
        tr.get("tgt"), str):
      raise DataFormatError(path, i,
                            'expected {"translation": {"src": <question>, "tgt": <RIR query>}}')
    examples.append(
        _rir_example(
            tr["src"],
            tr["tgt"],
            language,
            with_sparql, (path, i, "empty question (`translation.src`)"),
            (path, i, "empty query (`translation.tgt`)"),
            source=path,
            line=i))
  return tuple(examples)


def read_translation_jsonl(path: PathLike,
                           language: Optional[str] = None,
                           with_sparql: bool = False) -> list[Example]:
  """One Example per `{"translation": {"src": question, "tgt": RIR}}` line (blanks skipped).

  Raises DataNotFoundError, DataFormatError (not JSON; `translation.src`/`tgt` missing or empty).
  """
  language = language if language is not None else _language_from_name(path)
  return list(_read_translation_jsonl(str(path), language, with_sparql))


# --- full release: dataset.json + splits/{split}.json -------------------------------------


@functools.lru_cache(maxsize=8)
def _load_json(path: str, size: int, mtime: int) -> Any:
  del size, mtime  # cache key only
  text = pathlib.Path(path).read_text(encoding="utf-8")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DataFormatError(path, e.lineno, f"bad JSON ({e.msg} at column {e.colno})") from e


def _load_json_file(path: pathlib.Path) -> Any:
  if not path.is_file():
    raise paths.not_found(path, "MCWQ file")
  st = path.stat()
  return _load_json(str(path), st.st_size, st.st_mtime_ns)


def _array_element_line(path: PathLike, key: Optional[str], index: int) -> int:
  """1-based line of element `index` of the JSON array (under `key`), for messages; 1 if unknown."""
  text = pathlib.Path(path).read_text(encoding="utf-8")
  pos = 0
  if key is not None:
    m = re.search(r'"%s"\s*:\s*\[' % re.escape(key), text)
    if m is None:
      return 1
    pos = m.end()
  else:
    pos = text.index("[") + 1
  decoder = json.JSONDecoder()
  ws = re.compile(r"[\s,]*")
  for _ in range(index):
    pos = ws.match(text, pos).end()
    try:
      _, pos = decoder.raw_decode(text, pos)
    except json.JSONDecodeError:
      return 1
  pos = ws.match(text, pos).end()
  return text.count("\n", 0, pos) + 1


def _question_field(language: str) -> str:
  return "questionPatternModEntities" + ("" if language == "en" else f"_{language}")


def read_release(data_dir: PathLike,
                 split: str,
                 part: str,
                 language: str,
                 with_rir: bool = True) -> list[Example]:
  """The `dataset.json` records `splits/{split}.json`'s `trainIdxs`/`devIdxs`/`testIdxs` list, in
  order.

  Question `questionPatternModEntities[_{lang}]`, query `sparqlPatternModEntities` (whitespace
  collapsed). Raises DataNotFoundError, DataFormatError (`SPLIT_FILE:LINE` for bad JSON or
  indices, `dataset.json:LINE` for a record without the fields).
  """
  if part not in PARTS:
    raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
  data_dir = pathlib.Path(data_dir)
  dataset_path = data_dir / "dataset.json"
  split_path = data_dir / "splits" / f"{split}.json"
  for p in (split_path, dataset_path):
    if not p.is_file():
      raise paths.not_found(p, "MCWQ file")
  return list(_read_release(str(dataset_path), str(split_path), part, language, with_rir))


@_cached
def _read_release(dataset_path: str, split_path: str, part: str, language: str,
                  with_rir: bool) -> tuple[Example, ...]:
  dataset_path, split_path = pathlib.Path(dataset_path), pathlib.Path(split_path)
  split_obj = _load_json_file(split_path)
  dataset = _load_json_file(dataset_path)
  if not isinstance(dataset, list):
    raise DataFormatError(dataset_path, 1, "expected a JSON array of records")
  key = f"{part}Idxs"
  if not isinstance(split_obj, dict) or not isinstance(split_obj.get(key), list):
    raise DataFormatError(split_path, 1, f"expected an object with an index list {key!r}")
  q_field = _question_field(language)
  examples = []
  for k, idx in enumerate(split_obj[key]):
    if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(dataset):
      raise DataFormatError(
          split_path, _array_element_line(split_path, key, k),
          f"{key}[{k}] = {idx!r} is not a valid index into {dataset_path} "
          f"({len(dataset)} records)")
    record = dataset[idx]
    if not isinstance(record, dict):
      raise DataFormatError(dataset_path, _array_element_line(dataset_path, None, idx),
                            f"record {idx} is not a JSON object")
    for field in (q_field, "sparqlPatternModEntities"):
      if not isinstance(record.get(field), str):
        raise DataFormatError(dataset_path, _array_element_line(dataset_path, None, idx),
                              f"record {idx} has no string field {field!r}")
    sparql = " ".join(record["sparqlPatternModEntities"].split())
    depth = record.get("recursionDepth")
    examples.append(
        Example(
            question=" ".join(record[q_field].split()),
            sparql=sparql,
            rir=_sparql_to_rir(sparql, dataset_path, idx + 1) if with_rir else None,
            language=language,
            recursionDepth=int(depth) if depth is not None else None,
            expectedResponse=record.get("expectedResponse"),
            source=str(dataset_path),
            line=idx + 1))
  return tuple(examples)


# ------------------------------------------------------------------------------------------
# What a data directory holds.


@dataclasses.dataclass(frozen=True)
class Contents:
  """The splits and languages of an MCWQ data directory (`discover`), published ones first.

  `split_languages`: {split: languages with a file of it} for splits with `official/` or
  `translations/` files (not those known only from `splits/{split}.json`); `ignored`: (path,
  reason) of data-like names unusable as task names (`dev.zh-CN.txt`); `data_dir` or None.
  """
  splits: tuple[str, ...]
  languages: tuple[str, ...]
  gold_languages: tuple[str, ...]
  split_languages: dict[str, tuple[str, ...]]
  ignored: tuple[tuple[str, str], ...] = ()
  data_dir: Optional[str] = None

  def languages_of(self, split: str) -> tuple[str, ...]:
    """The languages `split` has files in; the published four for a split without a listing
    (the full release's `splits/{split}.json`, or a published split the directory lacks)."""
    return self.split_languages.get(split) or LANGUAGES


def _ordered(published: Sequence[str], found: Any) -> tuple[str, ...]:
  return tuple(published) + tuple(sorted(set(found) - set(published)))


def _data_file_language(name: str, parts: Sequence[str]) -> Optional[str]:
  """`dev.fr.txt` -> "fr" (also `.sparql`, `.json`); "" for a code task names cannot take; None
  for a file that is no data file of `parts`."""
  bits = name.split(".")
  if len(bits) != 3 or bits[0] not in parts or bits[2] not in ("txt", "sparql", "json"):
    return None
  return bits[1] if LANGUAGE_CODE_RE.match(bits[1]) else ""


def discover(data_dir: Optional[PathLike] = None) -> Contents:
  """The `Contents` of an MCWQ directory (default `paths.data_dir()`) from its listings, no file
  read.

  Looks at `official/{split}/{part}.{lang}.txt`, `translations/{split}/{part}.{lang}.*`,
  `translations/gold/test.{lang}.*` and `splits/{split}.json`. The published splits and languages
  are always included, so a partial copy or a missing directory gives at least those.
  """
  root = paths.data_dir(data_dir, must_exist=False)
  found_splits: set[str] = set()
  found_gold: set[str] = set()
  split_languages: dict[str, set[str]] = {}
  ignored: list[tuple[str, str]] = []
  if not root.is_dir():
    return Contents(SPLITS, LANGUAGES, GOLD_LANGUAGES, {}, (), None)
  for layout in ("official", "translations"):
    base = root / layout
    if not base.is_dir():
      continue
    for d in sorted(base.iterdir()):
      if not d.is_dir():
        continue
      is_gold = layout == "translations" and d.name == GOLD_SPLIT
      langs = set()
      for f in sorted(d.iterdir()):
        lang = _data_file_language(f.name, ("test",) if is_gold else PARTS)
        if lang == "":
          ignored.append((str(f), "the language code is not 2-3 lowercase letters, so no task "
                          "name can be made of it"))
        elif lang is not None:
          langs.add(lang)
      if is_gold:
        found_gold |= langs
        continue
      if not langs:
        continue
      if not SPLIT_NAME_RE.match(d.name):
        ignored.append((str(d), "a split name must be letters, digits and underscores"))
        continue
      found_splits.add(d.name)
      split_languages.setdefault(d.name, set()).update(langs)
  splits_dir = root / "splits"
  if (root / "dataset.json").is_file() and splits_dir.is_dir():
    for f in sorted(splits_dir.glob("*.json")):
      if SPLIT_NAME_RE.match(f.stem):
        found_splits.add(f.stem)
      else:
        ignored.append((str(f), "a split name must be letters, digits and underscores"))
  all_languages = set().union(*split_languages.values()) if split_languages else set()
  return Contents(
      splits=_ordered(SPLITS, found_splits),
      languages=_ordered(LANGUAGES, all_languages),
      gold_languages=_ordered(GOLD_LANGUAGES, found_gold),
      split_languages={
          s: _ordered([l for l in LANGUAGES if l in langs], langs)
          for s, langs in sorted(split_languages.items())
      },
      ignored=tuple(ignored),
      data_dir=str(root))


# ------------------------------------------------------------------------------------------
# The one entry point.


def _check_args(split: str, part: str, language: str, data_dir: Optional[PathLike] = None) -> None:
  """Raises ValueError for a split/part/language that neither MCWQ nor `data_dir` has."""
  if part not in PARTS:
    raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
  known = split in SPLITS and language in LANGUAGES
  if split == GOLD_SPLIT:
    known = language in GOLD_LANGUAGES
  if known:
    if split == GOLD_SPLIT and part != "test":
      raise ValueError(f"the gold set has only part 'test'; got part={part!r}")
    return
  contents = discover(data_dir)
  where = f" (the published ones and those in {contents.data_dir})" if contents.data_dir else ""
  if split == GOLD_SPLIT:
    if part != "test" or language not in contents.gold_languages:
      raise ValueError(f"the gold set has only part 'test' in languages "
                       f"{contents.gold_languages}{where}; got part={part!r}, "
                       f"language={language!r}")
    return
  if split not in contents.splits:
    raise ValueError(f"unknown split {split!r}; expected one of "
                     f"{contents.splits + (GOLD_SPLIT,)}{where}")
  if language in contents.languages:
    return
  # A release's dataset.json may hold languages no listing shows (it is not read here).
  root = pathlib.Path(contents.data_dir or ".")
  if (LANGUAGE_CODE_RE.match(language) and (root / "dataset.json").is_file() and
      (root / "splits" / f"{split}.json").is_file()):
    return
  raise ValueError(f"unknown language {language!r}; expected one of {contents.languages}{where}")


def split_files(split: str,
                part: str,
                language: str,
                data_dir: Optional[PathLike] = None) -> tuple[str, tuple[pathlib.Path, ...]]:
  """(layout, files) of one split/part/language, preferring `official` (`official/...txt`), then
  `translations` (`.txt` + `.sparql`), `jsonl` (`.json`), `release` (`dataset.json` + `splits/`).

  Raises ValueError (unknown split/part/language), DataNotFoundError (names the official path
  and the fetch command).
  """
  _check_args(split, part, language, data_dir)
  root = paths.data_dir(data_dir) if data_dir is not None else paths.data_dir()
  if split == GOLD_SPLIT:
    txt = root / "translations" / "gold" / f"test.{language}.txt"
    rir_file = txt.with_suffix(".sparql")
    if txt.is_file() and rir_file.is_file():
      return "translations", (txt, rir_file)
    jsonl = txt.with_suffix(".json")
    if jsonl.is_file():
      return "jsonl", (jsonl,)
    raise paths.not_found(txt, "MCWQ gold test set", out_dir=root)
  official = root / "official" / split / f"{part}.{language}.txt"
  if official.is_file():
    return "official", (official,)
  txt = root / "translations" / split / f"{part}.{language}.txt"
  rir_file = txt.with_suffix(".sparql")
  if txt.is_file() and rir_file.is_file():
    return "translations", (txt, rir_file)
  if txt.with_suffix(".json").is_file():
    return "jsonl", (txt.with_suffix(".json"),)
  dataset = root / "dataset.json"
  split_json = root / "splits" / f"{split}.json"
  if dataset.is_file() and split_json.is_file():
    return "release", (dataset, split_json)
  raise paths.not_found(
      official, f"MCWQ {split}/{part}/{language} (neither {official}, nor {txt} + .sparql, nor "
      f"{dataset} + {split_json})",
      out_dir=root)


def read_split(split: str,
               part: str,
               language: str,
               data_dir: Optional[PathLike] = None) -> list[Example]:
  """One split/part/language from whichever layout exists, `question`, `sparql`, `rir` filled, file
  order (a fresh list of cached Examples); `split` "gold" is the human-translated test set.

  Raises ValueError (unknown names), DataNotFoundError, DataFormatError (`FILE:LINE: problem`).
  """
  layout, files = split_files(split, part, language, data_dir)
  if layout == "official":
    return read_official(files[0], language, with_rir=True)
  if layout == "translations":
    return read_rir_pair(files[0], files[1], language, with_sparql=True)
  if layout == "jsonl":
    return read_translation_jsonl(files[0], language, with_sparql=True)
  return read_release(files[0].parent, split, part, language, with_rir=True)


def available_parts(split: str,
                    language: str,
                    data_dir: Optional[PathLike] = None) -> tuple[str, ...]:
  """The parts (of PARTS) of `split`/`language` that exist under `data_dir`, in PARTS order."""
  out = []
  for part in PARTS if split != GOLD_SPLIT else ("test",):
    try:
      split_files(split, part, language, data_dir)
    except paths.DataNotFoundError:
      continue
    out.append(part)
  return tuple(out)


def iter_all(data_dir: Optional[PathLike] = None,
             parts: Sequence[str] = PARTS) -> Iterator[tuple[str, str, str, list[Example]]]:
  """Yields (split, part, language, examples) for every split of `discover` and its languages."""
  contents = discover(data_dir)
  for split in contents.splits:
    for part in parts:
      for language in contents.languages_of(split):
        try:
          examples = read_split(split, part, language, data_dir)
        except paths.DataNotFoundError:
          continue
        yield split, part, language, examples
