r"""Machine translation of MCWQ questions (MCWQ paper, §4.1).

  python -m preprocessing.translate --release OUT --lang he kn zh --backend google --api-key KEY
  python -m preprocessing.translate --release OUT --lang he --backend hf --model /path/to/opus-mt-en-he
  python -m preprocessing.translate --release OUT --lang he --backend file --file he.tsv
  python -m preprocessing.translate --release OUT --lang fr --backend hf --model DIR --keep-placeholders

Adds `questionPatternModEntities_{lang}` / `questionWithBrackets_{lang}` to a release of
`preprocessing.migrate`, and `official/*/{part}.{lang}.txt` for each fully translated part.
Backends: `FileBackend` (TSV or JSONL), `HFBackend` (Marian, NLLB, M2M100), `GoogleBackend`
(Cloud Translation v2), `KeepPlaceholdersBackend`; `Translator` does §4.1's "?" handling, checks
every placeholder M0…M9 and caches each translation as it arrives. A run always finishes;
texts without a usable translation go to `RELEASE/translation_problems.{lang}.jsonl` (fill in
`target`, pass it back with `--backend file`). Exit status 0 (complete), 3 (gaps; rerun), 2 (bad
input, naming file and line).
"""

from __future__ import annotations

import abc
import argparse
import collections
import dataclasses
import json
import logging
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable, Sequence

from tqdm import tqdm

from mcwq_t5x import console
from mcwq_t5x.data import readers
from mcwq_t5x.stores import transport
from mcwq_t5x.stores.jsonl_cache import JsonlCache, make_key

_log = logging.getLogger(__name__)

GOOGLE_URL = "https://translation.googleapis.com/language/translate/v2"
LANG_RE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
PLACEHOLDER_RE = re.compile(r"M[0-9]")
_PLACEHOLDER_SPLIT_RE = re.compile(r"(M[0-9])")
#: ISO 639-1 -> NLLB-200 language codes for the MCWQ languages (others: pass the NLLB code).
NLLB_CODES = {"en": "eng_Latn", "he": "heb_Hebr", "kn": "kan_Knda", "zh": "zho_Hans"}


class TranslationError(RuntimeError):
  """A backend request failed for good (refused, or still failing after its retries)."""


MISSING = "missing"
FAILED = "failed"
PLACEHOLDERS = "placeholders"
#: The kinds of `Problem`, in report order.
PROBLEM_KINDS = (MISSING, FAILED, PLACEHOLDERS)
FIELDS = ("questionPatternModEntities", "questionWithBrackets")
#: Exit status of the command line when some text has no usable translation.
EXIT_INCOMPLETE = 3


@dataclasses.dataclass(frozen=True)
class Problem:
  """A text without a usable translation.

  Attributes:
    kind: "missing" (the file backend has no entry), "failed" (the request was refused or failed
      after its retries, or was not sent after repeated failures) or "placeholders" (the
      translation's placeholders M0…M9 differ from the source's).
    language: the target language.
    source: the English text (without the "?" added for MT).
    detail: what happened (the backend's error, the placeholders of both sides).
    output: the unusable translation ("placeholders" only).
  """
  kind: str
  language: str
  source: str
  detail: str
  output: str | None = None


def check_language(code: str) -> str:
  """Returns a language code if it looks like one (`he`, `zh-CN`, `heb_Hebr`), else ValueError."""
  if not isinstance(code, str) or not LANG_RE.match(code):
    raise ValueError(f"bad language code {code!r}")
  return code


class Backend(abc.ABC):
  """A machine translation system."""

  name = "backend"
  #: Whether `Translator` keeps this backend's translations in its on-disk cache (False for the
  #: file backend: its file is already on disk, and a lookup costs nothing).
  cacheable = True

  @abc.abstractmethod
  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str | None]:
    """Translates each text; returns one translation per text, in order.

    None stands for a text the backend has no translation for (the file backend); the other
    texts are still translated.

    Raises:
      TranslationError: the request failed (refused, or failing after retries): no text of
        `texts` is translated.
    """


class FileBackend(Backend):
  """Pre-translated texts from a TSV (`source<TAB>translation`) or JSONL (`{"source", "target",
  "lang"}`, `lang` optional) file: human or earlier MT output.

  A null or empty `target` (or TSV translation) is no translation (the text counts as missing), so
  a filled-in `translation_problems.{lang}.jsonl` reads back. `translate` gives None for a text
  without an entry. ValueError `FILE:LINE: problem` for a malformed line.
  """

  name = "file"
  cacheable = False

  def __init__(self, path: str | os.PathLike, language: str | None = None):
    self.path = pathlib.Path(path)
    self.table: dict[tuple[str | None, str], str] = {}
    with self.path.open(encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        line = line.rstrip("\n")
        if not line.strip():
          continue
        if self.path.suffix in (".jsonl", ".json"):
          try:
            obj = json.loads(line)
            src, tgt, lang = obj["source"], obj["target"], obj.get("lang", language)
          except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path}:{n}: expected {{'source', 'target'}} JSON: {e}") from e
          if not isinstance(src, str) or not (tgt is None or isinstance(tgt, str)):
            raise ValueError(f"{self.path}:{n}: 'source' must be a string and 'target' a string "
                             "or null")
        else:
          parts = line.split("\t")
          if len(parts) != 2:
            raise ValueError(f"{self.path}:{n}: expected 'source<TAB>translation'")
          (src, tgt), lang = parts, language
        if tgt is not None and tgt.strip():
          self.table[(lang, src)] = tgt
    self.name = f"file:{self.path.name}"

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str | None]:
    out: list[str | None] = []
    for t in texts:
      bare = t.rstrip("?").rstrip()
      for key in ((target, t), (None, t), (target, bare), (None, bare)):
        if key in self.table:
          out.append(self.table[key])
          break
      else:
        out.append(None)
    return out


class HFBackend(Backend):
  """A local Hugging Face seq2seq translation model (Marian, NLLB, M2M100) given by path.

  Args:
    model_path: folder with the model and tokenizer (`save_pretrained` layout).
    batch_size: texts per generate call.
    max_new_tokens: generation length limit.
    num_beams: beam size.
  """

  def __init__(self,
               model_path: str | os.PathLike,
               batch_size: int = 16,
               max_new_tokens: int = 128,
               num_beams: int = 4):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_path))
    self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(model_path)).eval()
    self.batch_size = batch_size
    self.max_new_tokens = max_new_tokens
    self.num_beams = num_beams
    self.kind = self.model.config.model_type
    self.name = f"hf:{pathlib.Path(model_path).name}:{self.kind}"

  def _forced_bos(self, target: str) -> dict[str, Any]:
    if self.kind == "m2m_100":
      return {"forced_bos_token_id": self.tokenizer.get_lang_id(target)}
    if self.kind == "nllb" or "nllb" in type(self.tokenizer).__name__.lower():
      code = NLLB_CODES.get(target, target)
      return {"forced_bos_token_id": self.tokenizer.convert_tokens_to_ids(code)}
    return {}  # Marian: one model per language pair

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str]:
    out: list[str] = []
    if hasattr(self.tokenizer, "src_lang") and self.kind != "marian":
      self.tokenizer.src_lang = NLLB_CODES.get(source, source) if self.kind != "m2m_100" else source
    for i in range(0, len(texts), self.batch_size):
      batch = list(texts[i:i + self.batch_size])
      enc = self.tokenizer(batch, return_tensors="pt", padding=True, truncation=True)
      with self.torch.no_grad():
        gen = self.model.generate(
            **enc,
            max_new_tokens=self.max_new_tokens,
            num_beams=self.num_beams,
            **self._forced_bos(target))
      out.extend(self.tokenizer.batch_decode(gen, skip_special_tokens=True))
    return out


#: Reasons of a Google API 403 error that mean "too fast, retry with backoff" (Google Cloud
#: Translation v2 and the Google API error model: `error.errors[].reason`).
RETRYABLE_403_REASONS = ("rateLimitExceeded", "userRateLimitExceeded")


def google_error_reasons(body: bytes) -> list[str]:
  """The `error.errors[].reason` values of a Google API error body ([] when it has none)."""
  try:
    error = json.loads(body.decode("utf-8")).get("error")
  except (UnicodeDecodeError, ValueError, AttributeError):
    return []
  errors = error.get("errors") if isinstance(error, dict) else None
  if not isinstance(errors, list):
    return []
  return [e["reason"] for e in errors if isinstance(e, dict) and isinstance(e.get("reason"), str)]


def _rate_limited(response: transport.Response) -> str | None:
  """"HTTP 403 (rateLimitExceeded)" for a 403 that Google marks as retryable, else None."""
  if response.status != 403:
    return None
  reasons = [r for r in google_error_reasons(response.body) if r in RETRYABLE_403_REASONS]
  return f"HTTP 403 ({reasons[0]})" if reasons else None


class GoogleBackend(Backend):
  """Google Cloud Translation REST v2 (or a server speaking it at `url`).

  `translate` raises `TranslationError` for a refused request (an HTTP error that is not
  retried), after the last retry, for an attempt without a complete answer within `timeout_s`
  (not retried), when the server asks to wait longer than `max_retry_after_s`, and for a status
  200 whose body is not a v2 answer (not JSON, e.g. an HTML page, or JSON without
  `data.translations` of one `translatedText` per text); the message names the URL (and the head
  of the body).

  Args:
    api_key: sent as the `key` form field (never logged).
    url: the `translate/v2` endpoint.
    batch_size: texts per request (the API allows up to 128 `q` values).
    min_interval_s: minimum seconds between requests.
    max_retries: retries on 429, 5xx, a 403 with a reason in `RETRYABLE_403_REASONS`, and
      network errors.
    backoff_s: first backoff, doubled after each retry (Retry-After wins when it asks more).
    timeout_s: bound of one request attempt as a whole (connecting, sending, reading the whole
      answer), in seconds.
    max_retry_after_s: the longest Retry-After waited for, in seconds.
    sleep: injectable for tests.
    clock: the wall clock (POSIX seconds) an HTTP-date Retry-After is compared to; injectable.

  Attributes:
    transport: the `mcwq_t5x.stores.transport.Transport` (its settings are the arguments above).
    num_requests: HTTP request attempts sent (retries included).
  """

  name = "google-v2"

  def __init__(self,
               api_key: str,
               url: str = GOOGLE_URL,
               batch_size: int = 64,
               min_interval_s: float = 0.1,
               max_retries: int = 5,
               backoff_s: float = 1.0,
               timeout_s: float = 30.0,
               max_retry_after_s: float = transport.DEFAULT_MAX_RETRY_AFTER_S,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.time):
    self.api_key, self.url, self.batch_size = api_key, url, batch_size
    self.transport = transport.Transport(
        timeout_s=timeout_s,
        max_retries=max_retries,
        backoff_s=backoff_s,
        min_interval_s=min_interval_s,
        max_retry_after_s=max_retry_after_s,
        retryable=_rate_limited,
        sleep=sleep,
        clock=clock)

  @property
  def num_requests(self) -> int:
    return self.transport.num_requests

  def _post(self, texts: list[str], target: str, source: str) -> list[str]:
    form = {"q": texts, "target": target, "source": source, "format": "text", "key": self.api_key}
    try:
      response = self.transport.post(self.url, data=form)
    except (transport.TransportError, transport.RetryAfterTooLong) as e:
      raise TranslationError(str(e)) from e
    return self._translations(response.body, len(texts))

  def _translations(self, body: bytes, n: int) -> list[str]:
    """The `n` translations of a status-200 body (`data.translations[].translatedText`).

    Raises:
      TranslationError: the body is not JSON, has no `data.translations` list, or not `n`
        string `translatedText`s (names the URL and the head of the body).
    """
    try:
      obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
      raise TranslationError(f"{self.url}: HTTP 200 but the answer is not JSON ({e}); it begins "
                             f"{transport.body_head(body)}") from None
    data = obj.get("data") if isinstance(obj, dict) else None
    items = data.get("translations") if isinstance(data, dict) else None
    if not isinstance(items, list):
      raise TranslationError(f"{self.url}: HTTP 200 but the answer has no 'data.translations' "
                             f"list (not a Cloud Translation v2 answer); it begins "
                             f"{transport.body_head(body)}")
    if len(items) != n:
      raise TranslationError(f"{self.url}: {len(items)} translations for {n} texts")
    if not all(isinstance(it, dict) and isinstance(it.get("translatedText"), str) for it in items):
      raise TranslationError(f"{self.url}: HTTP 200 but a translation has no string "
                             f"'translatedText'; the answer begins {transport.body_head(body)}")
    return [it["translatedText"] for it in items]

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str]:
    out: list[str] = []
    for i in range(0, len(texts), self.batch_size):
      out.extend(self._post(list(texts[i:i + self.batch_size]), target, source))
    return out


class KeepPlaceholdersBackend(Backend):
  """Wraps a backend so that the placeholders M0…M9 survive by construction.

  Each text is cut at its placeholders; the pieces between them that hold a letter or digit are
  translated by `inner` (each distinct piece once), and the placeholders are put back between the
  translated pieces in the source's order (pieces without one, such as the "?" `Translator`
  appends, are kept as they are). The sentence's word order around the placeholders stays the
  source's, so fluency suffers: this is for models that do not copy placeholders (small models,
  or the random-weight model of the worked example in docs/dataset_creation.md), where the alternative is a release
  in which most questions are "placeholders" problems. A piece's translation that itself holds a
  placeholder is kept, so `Translator`'s placeholder check still reports it.

  Args:
    inner: the backend that translates the pieces.
  """

  def __init__(self, inner: Backend):
    self.inner = inner
    self.name = f"{inner.name}+keep-placeholders"  # its own cache entries
    self.cacheable = inner.cacheable

  @staticmethod
  def pieces(text: str) -> list[str]:
    """`"Did M0 marry M1?"` -> `["Did ", "M0", " marry ", "M1", "?"]` (placeholders at odd
    positions)."""
    return _PLACEHOLDER_SPLIT_RE.split(text)

  @staticmethod
  def _needs_translation(piece: str) -> bool:
    return any(c.isalnum() for c in piece)

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str | None]:
    split = [self.pieces(t) for t in texts]
    todo = list(
        dict.fromkeys(
            p.strip() for pieces in split for p in pieces[0::2] if self._needs_translation(p)))
    got = self.inner.translate(todo, target, source) if todo else []
    if len(got) != len(todo):
      raise TranslationError(f"{self.inner.name}: {len(got)} translations for {len(todo)} texts")
    table = dict(zip(todo, got))
    out: list[str | None] = []
    for pieces in split:
      parts: list[str] = []
      for i, piece in enumerate(pieces):
        if i % 2 == 1 or not self._needs_translation(piece):
          parts.append(piece.strip())
          continue
        translation = table[piece.strip()]
        if translation is None:
          break
        parts.append(translation.strip())
      else:
        out.append(" ".join(" ".join(parts).split()).replace(" ?", "?"))
        continue
      out.append(None)
    return out


def placeholders(text: str) -> collections.Counter:
  """Multiset of placeholders M0…M9 in a text."""
  return collections.Counter(PLACEHOLDER_RE.findall(text))


class Translator:
  """Backend + "?" handling + placeholder check + on-disk cache, as §4.1 describes around MT.

  `add_question_mark`: "?" appended before and stripped after translating (the questions have
  none; it makes MT treat them as questions). Every placeholder M0…M9 must survive: a translation
  that loses or invents one is `flagged` (cached, so not asked again, but never written).
  `cache_path`: JSONL appended per batch of `batch_size` (None: memory; unused for a backend that is
  not `cacheable`), so a killed run resumes. After `max_consecutive_failures` failed requests in a
  row the rest is not sent ("failed"; a rerun tries again). `failures`: {(language, source):
  Problem} of the latest call; `backend_calls` counts calls.
  """

  def __init__(self,
               backend: Backend,
               cache_path: str | os.PathLike | None = None,
               batch_size: int = 32,
               add_question_mark: bool = True,
               max_consecutive_failures: int = 3):
    self.backend = backend
    self.cache = JsonlCache(cache_path if backend.cacheable else None)
    self.batch_size = batch_size
    self.add_question_mark = add_question_mark
    self.max_consecutive_failures = max_consecutive_failures
    self.flagged: list[tuple[str, str, str]] = []
    self.failures: dict[tuple[str, str], Problem] = {}
    self.backend_calls = 0

  def _key(self, text: str, target: str, source: str) -> str:
    return make_key(self.backend.name, source, target, text)

  @staticmethod
  def _strip_q(text: str) -> str:
    text = text.strip()
    for q in ("?", "？", "؟"):
      if text.endswith(q):
        return text[:-len(q)].rstrip()
    return text

  def translate(self,
                texts: Sequence[str],
                target: str,
                source: str = "en",
                progress: bool = False) -> list[str | None]:
    """Translates texts (cached ones are not sent again); flags placeholder mismatches.

    A failed request (TranslationError) does not stop the run: the texts of that batch are
    recorded in `failures` and the next batch is sent, until `max_consecutive_failures` requests
    in a row have failed. Texts the backend has no translation for are recorded likewise.

    Returns:
      One translation per text, None for a text in `failures`. Translations whose placeholders
      differ from the source's are returned (and cached) and appended to `flagged`.

    Raises:
      ValueError: malformed language code.
    """
    check_language(target)
    check_language(source)
    todo = []
    for t in dict.fromkeys(texts):
      self.failures.pop((target, t), None)
      if self._key(t, target, source) not in self.cache:
        todo.append(t)
    bar = tqdm(
        total=len(todo), desc=f"translate {source}->{target}", unit="q", disable=not progress)
    failed_in_a_row, last_error = 0, ""
    for i in range(0, len(todo), self.batch_size):
      batch = todo[i:i + self.batch_size]
      if failed_in_a_row >= self.max_consecutive_failures:
        for t in batch:
          self.failures[(target, t)] = Problem(
              FAILED, target, t, f"not sent: the last {failed_in_a_row} requests failed "
              f"(last error: {last_error})")
        bar.update(len(batch))
        continue
      sent = [t + "?" if self.add_question_mark else t for t in batch]
      self.backend_calls += 1
      try:
        got = self.backend.translate(sent, target, source)
        if len(got) != len(batch):
          raise TranslationError(f"{self.backend.name}: {len(got)} translations for "
                                 f"{len(batch)} texts")
      except TranslationError as e:
        failed_in_a_row, last_error = failed_in_a_row + 1, str(e)
        _log.warning("%s", e)
        for t in batch:
          self.failures[(target, t)] = Problem(FAILED, target, t, str(e))
        bar.update(len(batch))
        continue
      failed_in_a_row = 0
      for src, tr in zip(batch, got):
        if tr is None:
          self.failures[(target,
                         src)] = Problem(MISSING, target, src,
                                         f"{self.backend.name} has no {target} translation")
          continue
        tr = self._strip_q(tr) if self.add_question_mark else tr
        self.cache.put(self._key(src, target, source), tr, source=src, target_lang=target)
      bar.update(len(batch))
    bar.close()
    out = [self.cache.get(self._key(t, target, source)) for t in texts]
    for src, tr in zip(texts, out):
      if tr is not None and placeholders(src) != placeholders(tr):
        self.flagged.append((src, target, tr))
    return out


def _problem_record(problem: Problem, uses: list[dict[str, Any]]) -> dict[str, Any]:
  """One line of a problem file: readable by `FileBackend` once `target` is filled in."""
  return {
      "lang": problem.language,
      "problem": problem.kind,
      "source": problem.source,
      "target": None,
      "output": problem.output,
      "detail": problem.detail,
      "uses": uses
  }


def translate_release(release_dir: str | os.PathLike,
                      languages: Sequence[str],
                      translator: Translator,
                      progress: bool = True,
                      overwrite: bool = False,
                      problems_dir: str | os.PathLike | None = None) -> dict[str, Any]:
  """Adds translations to `dataset.json` (+ `negatives.json`) of a release folder (§4.1).

  Question patterns and bracketed questions are translated (the distinct texts of both fields,
  each once). Texts without a usable translation ("missing", "failed", "placeholders": see
  `Problem`) are not written; everything else is. `official/{split}/{part}.{lang}.txt` is written
  next to the English file for each part whose questions are all translated (a stale file of an
  incomplete part is removed, so that the official files stay line-parallel).

  Args:
    release_dir: folder written by `preprocessing.migrate`.
    languages: target language codes.
    translator: the `Translator` (backend, cache).
    progress: show progress bars.
    overwrite: translate again what the release already has (else it is kept: a rerun only
      fills the gaps).
    problems_dir: where `translation_problems.{lang}.jsonl` go (default: the release folder).
      Each lists every problem text of that language, one JSON object a line (empty when the
      language is complete); fill in `target` and read it back with `FileBackend`.

  Returns:
    {"complete": bool, "languages": {lang: {"texts", "kept", "translated", "missing", "failed",
    "placeholders", "records", "records_complete"}}, "problem_examples": [first 5 per language],
    "problem_files": {lang: path}, "official_written": [paths], "official_incomplete":
    {path: lines without translation}, "backend_calls": n}. Counts of texts are of distinct
    texts; "kept" were already in the release.

  Raises:
    FileNotFoundError: no dataset.json in `release_dir`.
    ValueError: a release file that is not a JSON array of records (names file and line), or a
      malformed language code.
  """
  root = pathlib.Path(release_dir)
  problems_root = pathlib.Path(problems_dir) if problems_dir is not None else root
  if not (root / "dataset.json").is_file():
    raise FileNotFoundError(f"{root / 'dataset.json'}: no such file (a folder written by "
                            "`python -m preprocessing.migrate --out DIR` is expected)")
  for lang in languages:
    check_language(lang)
  files = [p for p in (root / "dataset.json", root / "negatives.json") if p.exists()]
  data: dict[pathlib.Path, list[dict[str, Any]]] = {}
  for p in files:
    try:
      recs = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
      raise ValueError(f"{p}:{e.lineno}: bad JSON ({e.msg})") from None
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
      raise ValueError(f"{p}:1: expected a JSON array of records")
    data[p] = recs
  report: dict[str, Any] = {
      "complete": True,
      "languages": {},
      "problem_examples": [],
      "problem_files": {},
      "official_written": [],
      "official_incomplete": {}
  }
  for lang in languages:
    uses: dict[str, list[dict[str, Any]]] = {}  # text -> where it is needed
    kept: set[str] = set()
    for p, recs in data.items():
      for i, r in enumerate(recs):
        for field in FIELDS:
          text = r.get(field)
          if not isinstance(text, str) or not text:
            continue
          if overwrite:
            r.pop(f"{field}_{lang}", None)
          if isinstance(r.get(f"{field}_{lang}"), str):
            kept.add(text)
          else:
            uses.setdefault(text, []).append({"file": p.name, "index": i, "field": field})
    texts = list(uses)
    translations = translator.translate(texts, lang, progress=progress) if texts else []
    problems: list[Problem] = []
    for text, tr in zip(texts, translations):
      if tr is None:
        problems.append(
            translator.failures.get((lang, text), Problem(FAILED, lang, text, "no translation")))
      elif placeholders(text) != placeholders(tr):
        problems.append(
            Problem(
                PLACEHOLDERS, lang, text, f"placeholders {sorted(placeholders(text).elements())} "
                f"became {sorted(placeholders(tr).elements())}", tr))
      else:
        for use in uses[text]:
          data[root / use["file"]][use["index"]][f"{use['field']}_{lang}"] = tr
    kinds = collections.Counter(pr.kind for pr in problems)
    n_records = sum(len(recs) for recs in data.values())
    records_complete = sum(1 for recs in data.values() for r in recs if all(
        isinstance(r.get(f"{f}_{lang}"), str) for f in FIELDS
        if isinstance(r.get(f), str) and r.get(f)))
    report["languages"][lang] = {
        "texts": len(texts) + len(kept - set(texts)),
        "kept": len(kept - set(texts)),
        "translated": len(texts) - len(problems),
        **{
            k: kinds[k] for k in PROBLEM_KINDS
        }, "records": n_records,
        "records_complete": records_complete
    }
    report["complete"] = report["complete"] and not problems
    report["problem_examples"].extend(dataclasses.asdict(pr) for pr in problems[:5])
    problems_root.mkdir(parents=True, exist_ok=True)
    problem_file = problems_root / f"translation_problems.{lang}.jsonl"
    tmp = problem_file.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
      for pr in problems:
        f.write(json.dumps(_problem_record(pr, uses[pr.source]), ensure_ascii=False) + "\n")
    os.replace(tmp, problem_file)
    report["problem_files"][lang] = str(problem_file)
  for p, recs in data.items():
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(recs, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, p)
  dataset = data.get(root / "dataset.json", [])
  for split_file in sorted((root / "splits").glob("*.json")):
    sp = json.loads(split_file.read_text(encoding="utf-8"))
    for part in ("train", "dev", "test"):
      idxs = sp.get(f"{part}Idxs", [])
      if not idxs:
        continue
      d = root / "official" / split_file.stem
      d.mkdir(parents=True, exist_ok=True)
      for lang in languages:
        path = d / f"{part}.{lang}.txt"
        field = f"questionPatternModEntities_{lang}"
        gaps = sum(1 for k in idxs if not isinstance(dataset[k].get(field), str))
        if gaps:
          report["official_incomplete"][str(path)] = gaps
          path.unlink(missing_ok=True)
          continue
        with open(path, "w", encoding="utf-8") as f:
          for k in idxs:
            f.write(
                readers.format_official_line(dataset[k][field], dataset[k]
                                             ["sparqlPatternModEntities"]) + "\n")
        report["official_written"].append(str(path))
  report["backend_calls"] = translator.backend_calls
  return report


def summary(report: dict[str, Any]) -> str:
  """A human-readable account of an incomplete `translate_release` report (for stderr)."""
  lines = []
  for lang, c in report["languages"].items():
    bad = sum(c[k] for k in PROBLEM_KINDS)
    if not bad:
      continue
    lines.append(
        f"{lang}: {bad} of {c['texts']} texts have no usable translation (" +
        ", ".join(f"{c[k]} {k}" for k in PROBLEM_KINDS) + f"); {c['kept'] + c['translated']} "
        f"done, {c['records_complete']} of {c['records']} records complete; every one is listed "
        f"in {report['problem_files'][lang]}")
  for ex in report["problem_examples"]:
    lines.append(f"  {ex['language']} {ex['kind']}: {ex['source']!r}: {ex['detail']}")
  for path, gaps in report["official_incomplete"].items():
    lines.append(f"not written: {path} ({gaps} questions untranslated)")
  lines.append("the release is incomplete; rerun to fill the gaps (what is done is kept), e.g. "
               "with --backend file --file on a problem file whose 'target' fields are filled in")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """Command line `python -m preprocessing.translate` (module docstring); returns the exit status."""
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  ap = argparse.ArgumentParser(
      prog="python -m preprocessing.translate",
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--release", required=True, help="folder written by preprocessing.migrate")
  ap.add_argument("--lang", nargs="+", required=True, help="target language codes")
  ap.add_argument("--backend", choices=("file", "hf", "google"), required=True)
  ap.add_argument("--file", help="file backend: TSV or JSONL of translations")
  ap.add_argument("--model", help="hf backend: model folder")
  ap.add_argument("--max-new-tokens", type=int, default=128, help="hf backend: generation limit")
  ap.add_argument("--num-beams", type=int, default=4, help="hf backend: beam size")
  ap.add_argument(
      "--keep-placeholders",
      action="store_true",
      help="translate the text between the placeholders M0..M9 piece by piece and put the "
      "placeholders back in the source's order (for models that do not copy them; less fluent)")
  ap.add_argument(
      "--api-key",
      default=os.environ.get("GOOGLE_TRANSLATE_API_KEY"),
      help="google backend: API key (default $GOOGLE_TRANSLATE_API_KEY)")
  ap.add_argument("--url", default=GOOGLE_URL, help="google backend: REST v2 endpoint")
  ap.add_argument("--rate", type=float, default=0.1, help="google: min seconds between requests")
  ap.add_argument("--batch-size", type=int, default=32)
  ap.add_argument(
      "--cache", help="translation cache JSONL (default RELEASE/cache/translations.jsonl)")
  ap.add_argument(
      "--overwrite",
      action="store_true",
      help="translate again what the release already has (default: keep it)")
  ap.add_argument(
      "--problems-dir", help="where translation_problems.{lang}.jsonl go (default RELEASE)")
  ap.add_argument("--quiet", action="store_true")
  args = ap.parse_args(argv)
  for lang in args.lang:
    try:
      check_language(lang)
    except ValueError as e:
      ap.error(str(e))
  if args.backend == "file":
    if not args.file:
      ap.error("--backend file needs --file")
    try:
      backend: Backend = FileBackend(args.file)
    except (OSError, ValueError) as e:
      console.print_error(e)
      return 2
  elif args.backend == "hf":
    if not args.model:
      ap.error("--backend hf needs --model")
    backend = HFBackend(
        args.model,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams)
  else:
    if not args.api_key:
      ap.error("--backend google needs --api-key or $GOOGLE_TRANSLATE_API_KEY")
    backend = GoogleBackend(args.api_key, url=args.url, min_interval_s=args.rate)
  if args.keep_placeholders:
    backend = KeepPlaceholdersBackend(backend)
  cache = args.cache or os.path.join(args.release, "cache", "translations.jsonl")
  tr = Translator(backend, cache, batch_size=args.batch_size)
  try:
    report = translate_release(
        args.release,
        args.lang,
        tr,
        progress=not args.quiet,
        overwrite=args.overwrite,
        problems_dir=args.problems_dir)
  except (OSError, ValueError) as e:
    console.print_error(e)
    return 2
  print(json.dumps(report, indent=1, ensure_ascii=False))
  if not report["complete"]:
    print(summary(report), file=sys.stderr)
    return EXIT_INCOMPLETE
  return 0


if __name__ == "__main__":
  sys.exit(main())
