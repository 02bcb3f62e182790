"""TFDS builder `mcwq`: Multilingual Compositional Wikidata Questions (Cui et al., TACL 2022).

Configs `{split}_{language}` (16) and `gold_{he,kn,zh}` (test only). Features: `question`
(placeholders M0..M9), `sparql`, `rir` and `recursionDepth` (int32, -1 when unrecorded); splits
`train`, `validation` (MCWQ's `dev`) and `test`. Data from the TFDS manual dir, else
`paths.data_dir()`, else GitHub `coastalcph/seq2sparql` `mcwq/`. A dataset prepared from local
files records their SHA-256s (`source_fingerprint`, `metadata.json`) and is rebuilt, with a
warning, when those files change; downloaded data is not checked.

Usage:
  import mcwq_t5x.data.tfds_mcwq  # registers the builder
  ds = tfds.load("mcwq/mcd1_he", split="validation")
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import pathlib
from typing import Iterator, Optional

import numpy as np
import tensorflow_datasets as tfds

from mcwq_t5x.data import paths
from mcwq_t5x.data import readers

UPSTREAM_BASE_URL = "https://raw.githubusercontent.com/coastalcph/seq2sparql/HEAD/mcwq"

_CITATION = """\
@article{cui-etal-2022-multilingual,
  title={Compositional Generalization in Multilingual Semantic Parsing over Wikidata},
  author={Ruixiang Cui and Rahul Aralikatte and Heather Lent and Daniel Hershcovich},
  journal={Transactions of the Association for Computational Linguistics},
  year={2022},
  url={https://arxiv.org/abs/2108.03509}
}
"""

_DESCRIPTION = """\
MCWQ: questions in English, Hebrew, Kannada and Chinese with Wikidata SPARQL queries (entity
placeholders M0..M9), split by maximum compound divergence (mcd1..3) or randomly, migrated
from CFQ. Targets are also given in the reversible intermediate representation (RIR).
"""


def upstream_files(split: str, language: str) -> dict[str, tuple[str, ...]]:
  """{part: upstream paths under `mcwq/`} of one config: `official/...txt` for dev/test, a
  (`.txt`, `.sparql`) pair of `translations/...` for train and the gold set."""
  if split == readers.GOLD_SPLIT:
    return {
        "test":
            (f"translations/gold/test.{language}.txt", f"translations/gold/test.{language}.sparql")
    }
  return {
      "train": (f"translations/{split}/train.{language}.txt",
                f"translations/{split}/train.{language}.sparql"),
      "dev": (f"official/{split}/dev.{language}.txt",),
      "test": (f"official/{split}/test.{language}.txt",),
  }


@dataclasses.dataclass
class McwqConfig(tfds.core.BuilderConfig):
  """BuilderConfig for one MCWQ `split` ("mcd1".."mcd3", "random_split", "gold") and `language`."""
  split: str = "mcd1"
  language: str = "en"


def _configs() -> list[McwqConfig]:
  configs = []
  for split in readers.SPLITS:
    for language in readers.LANGUAGES:
      configs.append(
          McwqConfig(
              name=f"{split}_{language}",
              split=split,
              language=language,
              description=f"MCWQ {split}, {language} questions."))
  for language in readers.GOLD_LANGUAGES:
    configs.append(
        McwqConfig(
            name=f"gold_{language}",
            split=readers.GOLD_SPLIT,
            language=language,
            description=f"MCWQ human-translated gold test set, {language} (test only)."))
  return configs


def _has_data(root: Optional[pathlib.Path]) -> bool:
  return root is not None and root.is_dir() and any(
      (root / p).exists() for p in ("official", "translations", "dataset.json"))


def source_fingerprint(split: str, language: str, root: paths.PathLike) -> dict[str, object]:
  """{"source_dir", "files" (relative, sorted), "sha256"} of the local files one config is built
  from; "sha256" hashes each relative path and its bytes' SHA-256, so it is the same in any
  folder."""
  root = pathlib.Path(root).expanduser().absolute()
  files = set()
  for part in readers.available_parts(split, language, root):
    files.update(readers.split_files(split, part, language, root)[1])
  rel = sorted(str(pathlib.Path(f).absolute().relative_to(root)) for f in files)
  h = hashlib.sha256()
  for r in rel:
    h.update(r.encode() + b"\0")
    st = (root / r).stat()
    h.update(_file_sha256(str((root / r).resolve()), st.st_size, st.st_mtime_ns))
  return {"source_dir": str(root), "files": rel, "sha256": h.hexdigest()}


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> bytes:
  """SHA-256 of a file's bytes, cached on (path, size, mtime) within the process (`tfds.load`
  checks before preparing and again before reading)."""
  del size, mtime_ns  # cache key only
  return hashlib.sha256(pathlib.Path(path).read_bytes()).digest()


def generate_examples(
    split: str,
    part: str,
    language: str,
    data_dir: Optional[paths.PathLike] = None) -> Iterator[tuple[str, dict[str, object]]]:
  """Yields (f"{part}_{index:06d}", {"question", "sparql", "rir", "recursionDepth"}) of one
  split/part/language of a local copy (`readers.read_split`, whose errors pass through)."""
  yield from _to_features(readers.read_split(split, part, language, data_dir), part)


def _to_features(examples, part):
  for i, ex in enumerate(examples):
    yield f"{part}_{i:06d}", {
        "question": ex.question,
        "sparql": ex.sparql or "",
        "rir": ex.rir or "",
        "recursionDepth": -1 if ex.recursionDepth is None else ex.recursionDepth,
    }


class Mcwq(tfds.core.GeneratorBasedBuilder):
  """DatasetBuilder for MCWQ (registered as `mcwq`)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: 16 split x language configs + 3 gold configs."}
  BUILDER_CONFIGS = _configs()
  # Optional: the builder also reads $MCWQ_DATA_DIR or downloads the public files.
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  Optional. Place a copy of the MCWQ folder (the `mcwq/` folder of GitHub
  coastalcph/seq2sparql, with official/ and translations/, or the full release with
  dataset.json and splits/) in the manual dir. Without it the builder reads
  $MCWQ_DATA_DIR (default ../shared/mcwq) or downloads the public files.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=_DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "question": tfds.features.Text(),
            "sparql": tfds.features.Text(),
            "rir": tfds.features.Text(),
            "recursionDepth": tfds.features.Scalar(dtype=np.int32),
        }),
        supervised_keys=("question", "rir"),
        metadata=tfds.core.MetadataDict(),
        homepage="https://github.com/coastalcph/seq2sparql",
        citation=_CITATION,
    )

  @staticmethod
  def _local_source(manual: Optional[pathlib.Path]) -> Optional[tuple[pathlib.Path, bool]]:
    """(folder, is the manual dir) of the local data the builder reads, None to download."""
    if _has_data(manual):
      return manual, True
    try:
      local = paths.data_dir()
    except paths.DataNotFoundError:
      return None
    return (local, False) if _has_data(local) else None

  def _recorded_source(self) -> Optional[dict]:
    try:
      return dict(self.info.metadata.get("source") or {}) or None
    except (AttributeError, TypeError, ValueError, OSError):
      return None

  def _stale_source(self, manual: Optional[pathlib.Path]) -> Optional[str]:
    """Why the prepared dataset is out of date with the local files it would be built from now
    (a message naming the folders), or None (current, not prepared, or built from downloads)."""
    if not self.is_prepared():
      return None
    recorded = self._recorded_source()
    if manual is None and recorded and recorded.get("manual"):
      manual = pathlib.Path(recorded["source_dir"])
    source = self._local_source(manual)
    if source is None:
      return None
    cfg = self.builder_config
    now = source_fingerprint(cfg.split, cfg.language, source[0])
    if recorded is None:
      return (f"the prepared dataset {self.data_dir} records no source fingerprint (prepared "
              f"before the check existed); rebuilding it from {now['source_dir']}")
    if recorded.get("sha256") == now["sha256"]:
      return None
    return (f"the MCWQ files changed since {self.data_dir} was prepared from "
            f"{recorded.get('source_dir')} ({recorded.get('files')}, sha256 "
            f"{str(recorded.get('sha256'))[:16]}); rebuilding it from {now['source_dir']} "
            f"({now['files']}, sha256 {now['sha256'][:16]})")

  def download_and_prepare(self, *, download_dir=None, download_config=None, **kwargs):
    """As `tfds.core.DatasetBuilder.download_and_prepare`, but a dataset prepared from local files
    that have changed since is rebuilt (with a warning), not reused."""
    manual = None
    if download_config is not None and download_config.manual_dir:
      manual = pathlib.Path(str(download_config.manual_dir))
    stale = self._stale_source(manual)
    if stale is not None:
      logging.warning("mcwq/%s: %s", self.builder_config.name, stale)
      download_config = dataclasses.replace(
          download_config or tfds.download.DownloadConfig(),
          download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
    super().download_and_prepare(
        download_dir=download_dir, download_config=download_config, **kwargs)

  def as_dataset(self, *args, **kwargs):
    """As `tfds.core.DatasetBuilder.as_dataset`, but first rebuilds a dataset prepared from local
    files that have changed since (with a warning)."""
    if self._stale_source(None) is not None:
      recorded = self._recorded_source() or {}
      config = tfds.download.DownloadConfig(
          manual_dir=recorded["source_dir"] if recorded.get("manual") else None)
      self.download_and_prepare(download_config=config)
    return super().as_dataset(*args, **kwargs)

  def _split_generators(self, dl_manager):
    cfg = self.builder_config
    try:
      manual = pathlib.Path(str(dl_manager.manual_dir))
    except (AssertionError, ValueError, TypeError):
      manual = None
    source = self._local_source(manual)
    local = None if source is None else source[0]
    if local is not None:
      self.info.metadata["source"] = dict(
          source_fingerprint(cfg.split, cfg.language, local), manual=source[1])
      return {
          tfds_split: generate_examples(cfg.split, part, cfg.language, local)
          for tfds_split, part in readers.DATASET_SPLIT_TO_PART.items()
          if part in readers.available_parts(cfg.split, cfg.language, local)
      }
    self.info.metadata["source"] = {}  # downloaded: nothing local to compare with
    files = upstream_files(cfg.split, cfg.language)
    urls = {
        f"{part}{i}": f"{UPSTREAM_BASE_URL}/{p}" for part, ps in files.items()
        for i, p in enumerate(ps)
    }
    downloaded = dl_manager.download(urls)
    generators = {}
    for tfds_split, part in readers.DATASET_SPLIT_TO_PART.items():
      if part not in files:
        continue
      got = [downloaded[f"{part}{i}"] for i in range(len(files[part]))]
      generators[tfds_split] = self._generate_downloaded(got, part, cfg.language)
    return generators

  def _generate_downloaded(self, files, part: str, language: str):
    if len(files) == 1:
      examples = readers.read_official(files[0], language, with_rir=True)
    else:
      examples = readers.read_rir_pair(files[0], files[1], language, with_sparql=True)
    yield from _to_features(examples, part)

  def _generate_examples(self, *args, **kwargs):  # pragma: no cover - generators given above
    raise NotImplementedError
