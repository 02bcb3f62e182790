r"""Machine translation of MCWQ questions (MCWQ paper, §4.1).

Backends (one interface, `Backend.translate(texts, target, source) -> list[str]`):

* `FileBackend`: pre-translated text, from a TSV (`source<TAB>translation`) or JSONL file
  (`{"source": …, "target": …, "lang": …}`; `lang` optional) — e.g. human or earlier MT output.
* `HFBackend`: a local Hugging Face seq2seq model given by path (Marian, NLLB, M2M100); NLLB and
  M2M get the target language as forced BOS token (codes in `NLLB_CODES` or given as is).
* `GoogleBackend`: Google Cloud Translation, REST API v2 (`POST …/language/translate/v2`,
  form fields q (repeated), target, source, format=text, key) through `requests`, with batching,
  a minimum interval between requests, and retries with exponential backoff on 429/5xx
  (honouring Retry-After). `url` can point at any server speaking that protocol.

`Translator` adds what §4.1 describes around the backend: "?" is appended before translating
(the questions have none; it makes MT treat them as questions) and stripped after; question
patterns and bracketed questions are translated separately; every placeholder M0…M9 of the
source must survive (a translation that loses or invents one is flagged and reported); every
translation is cached on disk as it arrives (append-only JSONL), so a killed run resumes without
re-translating.

Command line (adds `questionPatternModEntities_{lang}` / `questionWithBrackets_{lang}` to a
dataset.json written by `preprocessing.migrate` and the matching `official/*/{part}.{lang}.txt`):
  python -m preprocessing.translate --release OUT --lang he kn zh --backend google --api-key KEY
  python -m preprocessing.translate --release OUT --lang he --backend hf --model /path/to/opus-mt-en-he
  python -m preprocessing.translate --release OUT --lang he --backend file --file he.tsv
"""

from __future__ import annotations

import abc
import argparse
import collections
import json
import logging
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable, Sequence

from tqdm import tqdm

from mcwq_t5x import readers
from preprocessing import retry
from preprocessing.cache import JsonlCache, make_key

_log = logging.getLogger(__name__)

GOOGLE_URL = "https://translation.googleapis.com/language/translate/v2"
LANG_RE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
PLACEHOLDER_RE = re.compile(r"M[0-9]")
#: ISO 639-1 -> NLLB-200 language codes for the MCWQ languages (others: pass the NLLB code).
NLLB_CODES = {"en": "eng_Latn", "he": "heb_Hebr", "kn": "kan_Knda", "zh": "zho_Hans"}


class TranslationError(RuntimeError):
  """A backend failed for good (after retries) or a text has no pre-translation."""


def check_language(code: str) -> str:
  """Returns a language code if it looks like one (`he`, `zh-CN`, `heb_Hebr`), else ValueError."""
  if not isinstance(code, str) or not LANG_RE.match(code):
    raise ValueError(f"bad language code {code!r}")
  return code


class Backend(abc.ABC):
  """A machine translation system."""

  name = "backend"

  @abc.abstractmethod
  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str]:
    """Translates each text; returns one translation per text, in order.

    Raises:
      TranslationError: the backend failed.
    """


class FileBackend(Backend):
  """Pre-translated texts from a TSV or JSONL file (see module docstring).

  Raises:
    ValueError: `FILE:LINE: problem` for a malformed line.
  """

  name = "file"

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
        else:
          parts = line.split("\t")
          if len(parts) != 2:
            raise ValueError(f"{self.path}:{n}: expected 'source<TAB>translation'")
          (src, tgt), lang = parts, language
        self.table[(lang, src)] = tgt
    self.name = f"file:{self.path.name}"

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str]:
    out = []
    for t in texts:
      for key in ((target, t), (None, t), (target, t.rstrip("?").rstrip()), (None, t.rstrip("?").rstrip())):
        if key in self.table:
          out.append(self.table[key])
          break
      else:
        raise TranslationError(f"{self.path}: no {target} translation for {t!r}")
    return out


class HFBackend(Backend):
  """A local Hugging Face seq2seq translation model (Marian, NLLB, M2M100) given by path.

  Args:
    model_path: folder with the model and tokenizer (`save_pretrained` layout).
    batch_size: texts per generate call.
    max_new_tokens: generation length limit.
    num_beams: beam size.
  """

  def __init__(self, model_path: str | os.PathLike, batch_size: int = 16,
               max_new_tokens: int = 128, num_beams: int = 4):
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
        gen = self.model.generate(**enc, max_new_tokens=self.max_new_tokens,
                                  num_beams=self.num_beams, **self._forced_bos(target))
      out.extend(self.tokenizer.batch_decode(gen, skip_special_tokens=True))
    return out


class GoogleBackend(Backend):
  """Google Cloud Translation REST v2 (or a server speaking it at `url`).

  Args:
    api_key: sent as the `key` form field (never logged).
    url: the `translate/v2` endpoint.
    batch_size: texts per request (the API allows up to 128 `q` values).
    min_interval_s: minimum seconds between requests.
    max_retries: retries on 429, 5xx and connection errors.
    backoff_s: first backoff, doubled after each retry (Retry-After wins when sent).
    timeout_s: request timeout.
    sleep: injectable for tests.
  """

  name = "google-v2"

  def __init__(self, api_key: str, url: str = GOOGLE_URL, batch_size: int = 64,
               min_interval_s: float = 0.1, max_retries: int = 5, backoff_s: float = 1.0,
               timeout_s: float = 30.0, sleep: Callable[[float], None] = time.sleep):
    import requests  # pylint: disable=g-import-not-at-top
    self.requests = requests
    self.api_key, self.url = api_key, url
    self.batch_size, self.min_interval_s = batch_size, min_interval_s
    self.max_retries, self.backoff_s, self.timeout_s = max_retries, backoff_s, timeout_s
    self._sleep = sleep
    self._last = 0.0
    self.num_requests = 0

  def _post(self, texts: list[str], target: str, source: str) -> list[str]:
    delay = self.backoff_s
    for attempt in range(self.max_retries + 1):
      self._last = retry.pace(self._last, self.min_interval_s, self._sleep)
      self.num_requests += 1
      retry_after = None
      try:
        r = self.requests.post(self.url, data={"q": texts, "target": target, "source": source,
                                               "format": "text", "key": self.api_key},
                               timeout=self.timeout_s)
        if r.status_code == 200:
          items = r.json()["data"]["translations"]
          if len(items) != len(texts):
            raise TranslationError(f"{self.url}: {len(items)} translations for {len(texts)} texts")
          return [it["translatedText"] for it in items]
        if r.status_code != 429 and r.status_code < 500:
          raise TranslationError(f"{self.url}: HTTP {r.status_code}: {r.text[:200]}")
        retry_after = r.headers.get("Retry-After")
        err = f"HTTP {r.status_code}"
      except (self.requests.ConnectionError, self.requests.Timeout) as e:
        err = str(e)
      if attempt == self.max_retries:
        raise TranslationError(f"{self.url}: giving up after {attempt + 1} attempts: {err}")
      wait_s = retry.retry_delay(delay, retry_after)
      _log.warning("%s: %s; retrying in %.1fs", self.url, err, wait_s)
      self._sleep(wait_s)
      delay *= 2
    raise AssertionError("unreachable")

  def translate(self, texts: Sequence[str], target: str, source: str = "en") -> list[str]:
    out: list[str] = []
    for i in range(0, len(texts), self.batch_size):
      out.extend(self._post(list(texts[i:i + self.batch_size]), target, source))
    return out


def placeholders(text: str) -> collections.Counter:
  """Multiset of placeholders M0…M9 in a text."""
  return collections.Counter(PLACEHOLDER_RE.findall(text))


class Translator:
  """Backend + "?" handling + placeholder check + on-disk cache (see module docstring).

  Args:
    backend: the MT system.
    cache_path: JSONL cache file (None = memory only).
    batch_size: texts sent to the backend at a time (each batch is cached before the next).
    add_question_mark: append "?" before and strip it after translating (§4.1).

  Attributes:
    flagged: [(source, target language, translation)] whose placeholders differ from the source.
    backend_calls: number of backend.translate calls made by this object.
  """

  def __init__(self, backend: Backend, cache_path: str | os.PathLike | None = None,
               batch_size: int = 32, add_question_mark: bool = True):
    self.backend = backend
    self.cache = JsonlCache(cache_path)
    self.batch_size = batch_size
    self.add_question_mark = add_question_mark
    self.flagged: list[tuple[str, str, str]] = []
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

  def translate(self, texts: Sequence[str], target: str, source: str = "en",
                progress: bool = False) -> list[str]:
    """Translates texts (cached ones are not sent again); flags placeholder mismatches.

    Raises:
      ValueError: malformed language code.
      TranslationError: from the backend.
    """
    check_language(target)
    check_language(source)
    todo = []
    for t in dict.fromkeys(texts):
      if self._key(t, target, source) not in self.cache:
        todo.append(t)
    bar = tqdm(total=len(todo), desc=f"translate {source}->{target}", unit="q", disable=not progress)
    for i in range(0, len(todo), self.batch_size):
      batch = todo[i:i + self.batch_size]
      sent = [t + "?" if self.add_question_mark else t for t in batch]
      self.backend_calls += 1
      got = self.backend.translate(sent, target, source)
      for src, tr in zip(batch, got):
        tr = self._strip_q(tr) if self.add_question_mark else tr
        self.cache.put(self._key(src, target, source), tr, source=src, target_lang=target)
      bar.update(len(batch))
    bar.close()
    out = [self.cache[self._key(t, target, source)] for t in texts]
    for src, tr in zip(texts, out):
      if placeholders(src) != placeholders(tr):
        self.flagged.append((src, target, tr))
    return out


def translate_release(release_dir: str | os.PathLike, languages: Sequence[str],
                      translator: Translator, progress: bool = True) -> dict[str, Any]:
  """Adds translations to `dataset.json` (+ `negatives.json`) of a release folder.

  Question patterns and bracketed questions are translated separately (§4.1). Official files
  `official/{split}/{part}.{lang}.txt` are written next to the English ones.

  Returns:
    {"translated": {lang: n}, "flagged": {lang: n}, "flagged_examples": [...], "backend_calls": n}.
  """
  root = pathlib.Path(release_dir)
  report: dict[str, Any] = {"translated": {}, "flagged": {}, "flagged_examples": []}
  files = [p for p in (root / "dataset.json", root / "negatives.json") if p.exists()]
  data = {p: json.loads(p.read_text(encoding="utf-8")) for p in files}
  for lang in languages:
    before = len(translator.flagged)
    for p, recs in data.items():
      for field in ("questionPatternModEntities", "questionWithBrackets"):
        idx = [i for i, r in enumerate(recs) if r.get(field)]
        trs = translator.translate([recs[i][field] for i in idx], lang, progress=progress)
        for i, tr in zip(idx, trs):
          recs[i][f"{field}_{lang}"] = tr
    new = translator.flagged[before:]
    report["translated"][lang] = sum(len(r) for r in data.values())
    report["flagged"][lang] = len({s for s, _, _ in new if PLACEHOLDER_RE.search(s)})
    report["flagged_examples"].extend(new[:5])
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
        with open(d / f"{part}.{lang}.txt", "w", encoding="utf-8") as f:
          for k in idxs:
            f.write(readers.format_official_line(
                dataset[k][f"questionPatternModEntities_{lang}"],
                dataset[k]["sparqlPatternModEntities"]) + "\n")
  report["backend_calls"] = translator.backend_calls
  return report


def main(argv: Sequence[str] | None = None) -> int:
  """Command line `python -m preprocessing.translate` (module docstring); returns the exit status."""
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  ap = argparse.ArgumentParser(prog="python -m preprocessing.translate", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--release", required=True, help="folder written by preprocessing.migrate")
  ap.add_argument("--lang", nargs="+", required=True, help="target language codes")
  ap.add_argument("--backend", choices=("file", "hf", "google"), required=True)
  ap.add_argument("--file", help="file backend: TSV or JSONL of translations")
  ap.add_argument("--model", help="hf backend: model folder")
  ap.add_argument("--api-key", default=os.environ.get("GOOGLE_TRANSLATE_API_KEY"),
                  help="google backend: API key (default $GOOGLE_TRANSLATE_API_KEY)")
  ap.add_argument("--url", default=GOOGLE_URL, help="google backend: REST v2 endpoint")
  ap.add_argument("--rate", type=float, default=0.1, help="google: min seconds between requests")
  ap.add_argument("--batch-size", type=int, default=32)
  ap.add_argument("--cache", help="translation cache JSONL (default RELEASE/cache/translations.jsonl)")
  ap.add_argument("--quiet", action="store_true")
  args = ap.parse_args(argv)
  for lang in args.lang:
    check_language(lang)
  if args.backend == "file":
    if not args.file:
      ap.error("--backend file needs --file")
    backend: Backend = FileBackend(args.file)
  elif args.backend == "hf":
    if not args.model:
      ap.error("--backend hf needs --model")
    backend = HFBackend(args.model, batch_size=args.batch_size)
  else:
    if not args.api_key:
      ap.error("--backend google needs --api-key or $GOOGLE_TRANSLATE_API_KEY")
    backend = GoogleBackend(args.api_key, url=args.url, min_interval_s=args.rate)
  cache = args.cache or os.path.join(args.release, "cache", "translations.jsonl")
  tr = Translator(backend, cache, batch_size=args.batch_size)
  report = translate_release(args.release, args.lang, tr, progress=not args.quiet)
  print(json.dumps(report, indent=1, ensure_ascii=False))
  return 0


if __name__ == "__main__":
  sys.exit(main())
