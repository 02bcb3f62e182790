"""SentencePiece vocabularies for MCWQ: the mT5 model and a small offline one.

Real runs use the mT5 vocabulary (Xue et al., 2021; `gs://t5-data/vocabs/mc4.250000.100extra/
sentencepiece.model`, 250,100 pieces; T5X pads the embedding to 250,112) through `MCWQ_VOCAB` or
`path=`. The offline default is a small BPE model (Kudo & Richardson, 2018) trained here on the
`train` and `dev` questions and RIR queries (never `test` or gold), with T5's ids pad=0, eos=1,
unk=2, byte fallback, reproducible and cached in `paths.cache_dir()/spm/` (docs/data.md says why
BPE and why pieces span spaces). `get_vocabulary(path=None)` returns a
`seqio.SentencePieceVocabulary` that encodes the NFC form of its text (with `sentencepiece_only`
a `SentencePieceOnlyVocabulary`, the same ids without SeqIO or TensorFlow); a missing data directory
raises `DataNotFoundError`, an unreadable vocabulary file `VocabularyNotFoundError`. A model file
may be an object-store URL (`gs://...`, read through TensorStore: `paths.read_bytes`; SeqIO's
class loads a local copy of it in the cache folder). No gin here (gin files reach these functions
by dynamic registration).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import tempfile
import unicodedata
from typing import Any, Iterable, Optional, Sequence, TYPE_CHECKING, Union

from mcwq_t5x.data import paths
from mcwq_t5x.data import readers

if TYPE_CHECKING:  # annotations only: SeqIO is imported where a vocabulary is made
  import seqio

MT5_VOCAB_PATH = "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model"
VOCAB_ENV = "MCWQ_VOCAB"
T5_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
DEFAULT_VOCAB_SIZE = 2000
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
_FORMAT_VERSION = 3  # bump when the training recipe changes (invalidates caches)

PathLike = Union[str, os.PathLike]

# Always single pieces: entity placeholders and query variables (CFQ/MCWQ use M0..M9 and
# ?x0..?x9), both with the word-boundary marker "▁" (the usual case: "▁M0", one piece instead of
# "▁" + "M0", which shortens RIR targets) and without it (e.g.
# Chinese "M0的"). `lb`/`rb` are not forced (they occur inside words such as "album"); the
# trainer merges them with their neighbours ("▁ASK▁WHERE▁lb▁(", "▁)▁)▁rb").
_BARE_SYMBOLS = tuple(f"M{i}" for i in range(10)) + tuple(f"?x{i}" for i in range(10))
RIR_SYMBOLS = tuple("\u2581" + s for s in _BARE_SYMBOLS) + _BARE_SYMBOLS


@dataclasses.dataclass(frozen=True)
class SmallVocabConfig:
  """Parameters of the small offline SentencePiece model (all enter the cache key).

  `vocab_size` counts pad/eos/unk and 256 byte-fallback pieces; `parts` supply the training text
  (never "test"); `split_by_whitespace` False lets pieces span spaces.
  """
  vocab_size: int = DEFAULT_VOCAB_SIZE
  model_type: str = "bpe"
  seed: int = 0
  character_coverage: float = 1.0
  parts: tuple[str, ...] = ("train", "dev")
  user_defined_symbols: tuple[str, ...] = RIR_SYMBOLS
  split_by_whitespace: bool = False

  def __post_init__(self):
    if "test" in self.parts:
      raise ValueError("the vocabulary must not be trained on test data")
    if self.vocab_size < 300:
      raise ValueError(f"vocab_size={self.vocab_size} is too small (256 byte pieces + specials)")


def corpus_files(
    data_dir: Optional[PathLike] = None,
    parts: Sequence[str] = ("train", "dev")) -> list[pathlib.Path]:
  """The data files the small model is trained on (the cache key), sorted; DataNotFoundError if
  none."""
  files = set()
  root = paths.data_dir(data_dir) if data_dir is not None else paths.data_dir()
  contents = readers.discover(root)
  for split in contents.splits:
    for part in parts:
      for language in contents.languages_of(split):
        try:
          _, fs = readers.split_files(split, part, language, root)
        except paths.DataNotFoundError:
          continue
        files.update(fs)
  if not files:
    raise paths.not_found(root / "official", f"MCWQ {'/'.join(parts)} files", out_dir=root)
  return sorted(files)


def training_corpus(data_dir: Optional[PathLike] = None,
                    parts: Sequence[str] = ("train", "dev")) -> list[str]:
  """Questions of all languages, then RIR queries, deduplicated, in `readers.iter_all` order.

  Raises DataNotFoundError (no training text), DataFormatError.
  """
  questions, queries = {}, {}
  root = paths.data_dir(data_dir) if data_dir is not None else paths.data_dir()
  for _, _, _, examples in readers.iter_all(root, parts):
    for ex in examples:
      questions[ex.question] = None
      queries[ex.rir] = None
  if not questions:
    raise paths.not_found(root / "official", f"MCWQ {'/'.join(parts)} files", out_dir=root)
  return list(questions) + list(queries)


def train_sentencepiece(
    sentences: Sequence[str], model_path: PathLike,
    config: SmallVocabConfig = SmallVocabConfig()) -> pathlib.Path:
  """`model_path` (a Path; `.vocab` beside it), trained on `sentences` and written atomically.

  Same sentences and config give a byte-identical file (one thread, fixed seed).
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top

  model_path = pathlib.Path(model_path)
  model_path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=model_path.parent) as tmp:
    corpus = pathlib.Path(tmp) / "corpus.txt"
    corpus.write_text("".join(s.replace("\n", " ") + "\n" for s in sentences), encoding="utf-8")
    prefix = pathlib.Path(tmp) / "spm"
    spm.set_random_generator_seed(config.seed)
    _train_or_explain(
        spm,
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=config.vocab_size,
        model_type=config.model_type,
        character_coverage=config.character_coverage,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        byte_fallback=True,
        normalization_rule_name="identity",
        split_by_number=False,
        split_by_unicode_script=False,
        split_by_whitespace=config.split_by_whitespace,
        user_defined_symbols=list(config.user_defined_symbols),
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
        vocab_size_name=f"{config.vocab_size:,} pieces ({len(sentences):,} sentences)")
    # The trainer records the (random) temporary paths in the model; blank them so the
    # same input gives the same bytes.
    proto = sentencepiece_model_pb2.ModelProto.FromString(
        pathlib.Path(f"{prefix}.model").read_bytes())
    proto.trainer_spec.ClearField("input")
    proto.trainer_spec.model_prefix = "mcwq_spm"
    pathlib.Path(f"{prefix}.model").write_bytes(proto.SerializeToString(deterministic=True))
    os.replace(f"{prefix}.vocab", model_path.with_suffix(".vocab"))
    os.replace(f"{prefix}.model", model_path)  # last: the .model's presence means "done"
  return model_path


def _train_or_explain(spm: Any, vocab_size_name: str, **kwargs: Any) -> None:
  """`spm.SentencePieceTrainer.train(**kwargs)`; a corpus too small for the vocabulary size (a
  small release, e.g. the migrated CFQ sample) raises ValueError saying what to do."""
  try:
    spm.SentencePieceTrainer.train(**kwargs)
  except RuntimeError as e:
    if "Vocabulary size too high" not in str(e):
      raise
    raise ValueError(
        f"the small offline vocabulary ({vocab_size_name}) cannot be trained on the text of "
        f"{paths.data_dir(must_exist=False)}: {e}. Point ${VOCAB_ENV} at a vocabulary trained on "
        f"more text, e.g. `python scripts/train_vocab.py --data-dir ../shared/mcwq --output "
        f"runs/mcwq_spm.model` then `export {VOCAB_ENV}=runs/mcwq_spm.model`") from None


def small_vocab_path(data_dir: Optional[PathLike] = None,
                     config: SmallVocabConfig = SmallVocabConfig(),
                     train_if_missing: bool = True) -> pathlib.Path:
  """`<cache_dir>/spm/mcwq_spm_<vocab_size>_<key>.model`, trained first if `train_if_missing`;
  DataNotFoundError without training data."""
  # why the key hashes config, format and every training file: another data copy or config
  # never reuses a model.
  h = hashlib.sha256()
  h.update(json.dumps([_FORMAT_VERSION, dataclasses.asdict(config)], sort_keys=True).encode())
  for f in corpus_files(data_dir, config.parts):
    h.update("/".join(f.parts[-3:]).encode())  # e.g. official/mcd1/dev.en.txt
    h.update(hashlib.sha256(f.read_bytes()).digest())
  path = paths.cache_dir() / "spm" / f"mcwq_spm_{config.vocab_size}_{h.hexdigest()[:16]}.model"
  if train_if_missing and not path.is_file():
    train_sentencepiece(training_corpus(data_dir, config.parts), path, config)
  return path


# Defined on first use: SeqIO (and TensorFlow, slow to import) only where a vocabulary is made.
def _vocabulary_classes() -> tuple[type, type]:
  """(`NFCSentencePieceVocabulary`, `_CachedSentencePieceVocabulary`), defined on first use."""
  if all(name in globals() for name in _LAZY_CLASSES):
    return tuple(globals()[name] for name in _LAZY_CLASSES)
  import seqio  # pylint: disable=g-import-not-at-top

  class NFCSentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """A `seqio.SentencePieceVocabulary` whose `encode` / `encode_tf` take the Unicode NFC form
    first.

    Canonically equivalent spellings (NFD Kannada, say) get the same ids through a task,
    `mcwq_t5x.infer` or a user's `encode`; NFC text encodes as before. It adds no state, so it
    compares equal to a plain `seqio.SentencePieceVocabulary` of the file (T5X's vocabulary check).
    """

    def _encode(self, s):
      if isinstance(s, str) and not unicodedata.is_normalized(readers.NORMALIZATION_FORM, s):
        s = unicodedata.normalize(readers.NORMALIZATION_FORM, s)
      return super()._encode(s)

    def _encode_tf(self, s):
      import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
      return super()._encode_tf(tf_text.normalize_utf8(s, readers.NORMALIZATION_FORM))

  class _CachedSentencePieceVocabulary(NFCSentencePieceVocabulary):
    """A `NFCSentencePieceVocabulary` whose file may not exist until first use; an unreadable
    file is a one-line `VocabularyNotFoundError` naming it and what named it, not TensorFlow's
    error."""

    def _model_context(self):
      if self._model:
        return self._model
      model_file = self._sentencepiece_model_file
      if paths.is_url(model_file):  # why: SeqIO reads URLs with TensorFlow's file systems only
        local = seqio.SentencePieceVocabulary(
            _local_copy(model_file), self._extra_ids, self._normalizer_spec_overrides,
            self._reverse_extra_ids)
        self._model = local._model_context()  # pylint: disable=protected-access
        return self._model
      if not os.path.isfile(model_file):
        raise unreadable_vocabulary(model_file)
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      try:
        return super()._model_context()
      except tf.errors.OpError as e:  # e.g. a file that cannot be opened
        raise unreadable_vocabulary(model_file, e.message) from None

  # Module-level names, so that pickle finds the classes by reference.
  for cls in (NFCSentencePieceVocabulary, _CachedSentencePieceVocabulary):
    cls.__qualname__ = cls.__name__
    globals()[cls.__name__] = cls
  return NFCSentencePieceVocabulary, _CachedSentencePieceVocabulary


_LAZY_CLASSES = ("NFCSentencePieceVocabulary", "_CachedSentencePieceVocabulary")
Vocabulary = Union["seqio.SentencePieceVocabulary", "SentencePieceOnlyVocabulary"]


class SentencePieceOnlyVocabulary:
  """The Python half of `NFCSentencePieceVocabulary` (`encode`, `decode`, the special ids and
  `vocab_size`) on the `sentencepiece` package alone, for decoding without SeqIO or TensorFlow
  (`mcwq_t5x.infer`; importing them costs 0.65 GiB and 4 s, and the GPU image has neither).

  The same ids and strings as the SeqIO class of the same local file and `extra_ids` for text
  and int ids (sentinels appended as SeqIO appends them: `▁<extra_id_N>`, the highest N first,
  which needs `protobuf`; tests compare both on MCWQ's questions and queries). It has no
  `encode_tf`/`decode_tf`: a SeqIO task cannot use it. The model file (local, or an object-store
  URL) is read on first use: a missing or unreadable one raises `VocabularyNotFoundError` naming
  it.
  """

  def __init__(self, sentencepiece_model_file: str, extra_ids: int = 0):
    self._sentencepiece_model_file = sentencepiece_model_file
    self._extra_ids = extra_ids or 0  # why: seqio's None means 0
    self._tokenizer = None

  def __getstate__(self):  # why: gin deep-copies its arguments; the processor is reloaded
    return {**self.__dict__, "_tokenizer": None}

  def __eq__(self, other):
    return (isinstance(other, SentencePieceOnlyVocabulary) and
            self.__getstate__() == other.__getstate__())

  def __hash__(self):
    return hash((self._sentencepiece_model_file, self._extra_ids))

  def _model_context(self) -> Any:
    """The loaded `sentencepiece.SentencePieceProcessor`."""
    if self._tokenizer is None:
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top
      model_file = self._sentencepiece_model_file
      data = _read_model(model_file)
      tokenizer = spm.SentencePieceProcessor()
      try:
        tokenizer.LoadFromSerializedProto(_with_extra_ids(data, self._extra_ids))
      except (OSError, RuntimeError) as e:  # why: a corrupt file is RuntimeError("... parse")
        raise unreadable_vocabulary(model_file, str(e)) from None
      self._tokenizer = tokenizer
    return self._tokenizer

  tokenizer = property(_model_context)
  sentencepiece_model_file = property(lambda self: self._sentencepiece_model_file)
  extra_ids = property(lambda self: self._extra_ids)
  pad_id = property(lambda self: PAD_ID)  # why: seqio's fixed pad id, whatever the model says
  eos_id = property(lambda self: self.tokenizer.eos_id())
  unk_id = property(lambda self: self.tokenizer.unk_id())
  vocab_size = property(lambda self: self.tokenizer.GetPieceSize())

  def encode(self, s: str) -> list[int]:
    """The ids of the NFC form of `s`, without EOS."""
    if isinstance(s, str) and not unicodedata.is_normalized(readers.NORMALIZATION_FORM, s):
      s = unicodedata.normalize(readers.NORMALIZATION_FORM, s)
    return self.tokenizer.EncodeAsIds(s)

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids` up to the first EOS; ids past the vocabulary read as UNK (seqio's rule)."""
    size, unk, eos = self.vocab_size, self.unk_id, self.eos_id
    ids = [unk if i >= size else i for i in ids]
    if eos in ids:
      ids = ids[:ids.index(eos) + 1]
    return self.tokenizer.DecodeIds([int(i) for i in ids])


def _read_model(model_file: str) -> bytes:
  """The bytes of a model file, local or an object-store URL (`paths.read_bytes`);
  VocabularyNotFoundError naming it (and what named it) when it cannot be read."""
  if not paths.is_url(model_file) and not os.path.isfile(model_file):
    raise unreadable_vocabulary(model_file)
  try:
    return paths.read_bytes(model_file)
  except OSError as e:  # why: the reason without the path, which the message names already
    raise unreadable_vocabulary(model_file, str(e).removeprefix(f"{model_file}: ")) from None


def _local_copy(model_file: str) -> str:
  """A local copy of the object-store model file `model_file`:
  `paths.cache_dir()/object_store/<16 hex of its SHA-256>/<its name>`, written whole (for SeqIO,
  whose loader reads through TensorFlow's file systems); VocabularyNotFoundError as
  `_read_model`."""
  data = _read_model(model_file)
  digest = hashlib.sha256(data).hexdigest()[:16]
  path = paths.cache_dir() / "object_store" / digest / model_file.rstrip("/").rsplit("/", 1)[-1]
  if not path.is_file():
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)  # why: another process may read the copy meanwhile
  return str(path)


def _with_extra_ids(data: bytes, extra_ids: int) -> bytes:
  """The serialised SentencePiece model `data` with `extra_ids` user-defined pieces
  `▁<extra_id_N>` appended, N descending (seqio's `reverse_extra_ids`: the first sentinel gets
  the highest id). With extra ids, RuntimeError for bytes that are not a model or no usable
  `protobuf`."""
  if not extra_ids:
    return data
  try:
    from google.protobuf import message  # pylint: disable=g-import-not-at-top
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  except Exception as e:  # why: ImportError, or protobuf's VersionError (a runtime too old)
    raise RuntimeError(f"appending {extra_ids} extra ids needs the protobuf package: {e}") from None
  try:
    proto = sentencepiece_model_pb2.ModelProto.FromString(data)
  except message.DecodeError as e:
    raise RuntimeError(f"not a SentencePiece model ({e})") from None
  piece = sentencepiece_model_pb2.ModelProto.SentencePiece
  for i in reversed(range(extra_ids)):
    proto.pieces.add(piece=f"\u2581<extra_id_{i}>", score=0.0, type=piece.USER_DEFINED)
  return proto.SerializeToString()


def __getattr__(name: str) -> Any:
  """The vocabulary classes on first access (PEP 562; see `_vocabulary_classes`)."""
  if name in _LAZY_CLASSES:
    _vocabulary_classes()
    return globals()[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class VocabularyNotFoundError(paths.DataNotFoundError):
  """A SentencePiece model file cannot be read; the message (one line) names the file and the
  variable that named it."""


def unreadable_vocabulary(model_file: str, reason: str = "") -> VocabularyNotFoundError:
  """A `VocabularyNotFoundError` (to raise) whose one-line message names `model_file`, `$MCWQ_VOCAB`
  when it holds that path, the first line of `reason` (empty: a missing local file), what to do."""
  reason = reason.strip().splitlines()[0] if reason.strip() else ""
  problem = f"cannot be read ({reason})" if reason else "does not exist"
  if os.environ.get(VOCAB_ENV) == model_file:
    if "://" in model_file:
      fix = (f"copy it to this machine (e.g. `gsutil cp {model_file} runs/`) and point "
             f"{VOCAB_ENV} at the copy")
    else:
      fix = (f"create it (`python scripts/train_vocab.py --output {model_file}` trains the small "
             f"offline vocabulary there) or unset {VOCAB_ENV} (the small offline vocabulary)")
    return VocabularyNotFoundError(
        f"{VOCAB_ENV}={model_file}: this SentencePiece model {problem}; {fix}")
  if pathlib.Path(model_file).parent.parent == paths.cache_dir(create=False):
    return VocabularyNotFoundError(
        f"the small MCWQ SentencePiece model {model_file} {problem}: there was no MCWQ train/dev "
        f"text under {paths.data_dir(must_exist=False)} to train it from (the data folder: "
        f"${paths.DATA_DIR_ENV}, else ../shared/mcwq; `python scripts/train_vocab.py` trains it)")
  return VocabularyNotFoundError(f"the SentencePiece model {model_file} {problem}")


def check_vocabulary_variable() -> None:
  """VocabularyNotFoundError at once when `$MCWQ_VOCAB` names a missing local file (gs:// fails
  later)."""
  path = os.environ.get(VOCAB_ENV)
  if path and "://" not in path and not os.path.isfile(path):
    raise unreadable_vocabulary(path)


@functools.lru_cache(maxsize=None)
def _vocabulary(path: Optional[str], extra_ids: int, cache_dir: str, data_dir: str,
                sentencepiece_only: bool) -> Vocabulary:
  del cache_dir, data_dir  # cache keys only: another cache/data folder is another model file
  if path is None:
    extra_ids = 0  # why: the small model's pieces are fixed (its cache key ignores extra_ids)
    try:
      path = str(small_vocab_path())
    except paths.DataNotFoundError:
      # No data to train (or to key) the small model: tasks still register; using the
      # vocabulary raises DataNotFoundError.
      path = str(paths.cache_dir(create=False) / "spm" / "mcwq_spm_untrained.model")
  if sentencepiece_only:
    return SentencePieceOnlyVocabulary(path, extra_ids)
  _, cached_class = _vocabulary_classes()  # why: a clear error for a missing file, same ids
  return cached_class(path, extra_ids=extra_ids)


def get_vocabulary(path: Optional[PathLike] = None,
                   extra_ids: int = 0,
                   sentencepiece_only: bool = False) -> Vocabulary:
  """The `NFCSentencePieceVocabulary` for inputs and targets, one per path and kind (`VOCABULARY =
  @vocab.get_vocabulary()`).

  `path` default `$MCWQ_VOCAB`, else the small model (trained on first use); `extra_ids`:
  sentinels appended (0 for mT5's, which has its 100). `sentencepiece_only` (gin/mcwq_t5x/runs/
  infer.gin): a `SentencePieceOnlyVocabulary` instead, without SeqIO and TensorFlow (a local
  file or an object-store URL).
  """
  if path is None:
    path = os.environ.get(VOCAB_ENV) or None
  return _vocabulary(None if path is None else str(path), extra_ids,
                     os.environ.get(paths.CACHE_DIR_ENV, ""),
                     os.environ.get(paths.DATA_DIR_ENV, ""), sentencepiece_only)


def clear_vocabulary_cache() -> None:
  """Forgets the shared instances of `get_vocabulary` (tests that switch data or cache folders)."""
  _vocabulary.cache_clear()


def mt5_vocabulary(sentencepiece_only: bool = False) -> Vocabulary:
  """The mT5 vocabulary (250,100 pieces incl. 100 sentinels; pad 0, eos 1, unk 2) from
  `$MCWQ_VOCAB`, the variable the SeqIO tasks read (`VOCABULARY = @vocab.mt5_vocabulary()` in the
  paper files); `sentencepiece_only` as `get_vocabulary`'s.

  ValueError when unset (the tasks would use the small vocabulary); the message says what to set.
  """
  path = os.environ.get(VOCAB_ENV)
  if not path:
    raise ValueError(
        f"the paper experiments use the mT5 SentencePiece model, and the MCWQ SeqIO tasks read "
        f"their vocabulary from ${VOCAB_ENV}, which is unset (so they would use the small offline "
        f"vocabulary). Set {VOCAB_ENV}={MT5_VOCAB_PATH} (or a local copy of that file) before "
        f"running; for the small offline vocabulary bind VOCABULARY = @vocab.get_vocabulary() "
        f"and network.T5Config.vocab_size = {DEFAULT_VOCAB_SIZE}")
  return get_vocabulary(path, sentencepiece_only=sentencepiece_only)


def t5_vocabulary(sentencepiece_only: bool = False) -> Vocabulary:
  """The English T5.1.1 vocabulary (`cc_all.32000.100extra`, 32,100 pieces; 32,128 embedding rows)
  of the paper's T5-base runs, from `$MCWQ_VOCAB` (`sentencepiece_only` as `get_vocabulary`'s);
  ValueError when unset."""
  path = os.environ.get(VOCAB_ENV)
  if not path:
    raise ValueError(f"the T5-base experiments use the T5.1.1 SentencePiece model, and the MCWQ "
                     f"SeqIO tasks read their vocabulary from ${VOCAB_ENV}, which is unset. Set "
                     f"{VOCAB_ENV}={T5_VOCAB_PATH} (or a local copy of that file) before running")
  return get_vocabulary(path, sentencepiece_only=sentencepiece_only)
