"""Tests of mcwq_t5x.data.vocab (small offline SentencePiece model, vocabulary selection)."""
import hashlib
import pickle
import random
import re
import shutil
import unicodedata

import numpy as np
import pytest
import seqio
import sentencepiece as spm

from mcwq_t5x.data import readers
from mcwq_t5x.data import vocab
import local_http
import mains


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  """A private cache dir for the module (the default small model is trained into it once)."""
  d = tmp_path_factory.mktemp("mcwq_cache")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("MCWQ_CACHE_DIR", str(d))
    mp.delenv("MCWQ_VOCAB", raising=False)
    mp.delenv("MCWQ_DATA_DIR", raising=False)
    vocab.clear_vocabulary_cache()  # a vocabulary cached by another module points elsewhere
    yield d
  vocab.clear_vocabulary_cache()


@pytest.fixture(scope="module")
def small_model(cache_dir):
  return vocab.small_vocab_path()


def _small_corpus(mcwq_dir):
  en = readers.read_split("mcd1", "dev", "en", mcwq_dir)[:300]
  zh = readers.read_split("mcd1", "dev", "zh", mcwq_dir)[:300]
  return [e.question for e in en + zh] + [e.rir for e in en]


def test_training_is_reproducible(tmp_path, mcwq_dir):
  corpus = _small_corpus(mcwq_dir)
  config = vocab.SmallVocabConfig(vocab_size=700)
  a = vocab.train_sentencepiece(corpus, tmp_path / "a" / "x.model", config)
  b = vocab.train_sentencepiece(corpus, tmp_path / "b" / "y.model", config)
  assert hashlib.md5(a.read_bytes()).hexdigest() == hashlib.md5(b.read_bytes()).hexdigest()
  c = vocab.train_sentencepiece(
      corpus, tmp_path / "c.model",
      vocab.SmallVocabConfig(vocab_size=700, seed=1, model_type="unigram"))
  assert c.read_bytes() != a.read_bytes()
  sp = spm.SentencePieceProcessor(model_file=str(a))
  assert (sp.get_piece_size(), sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (700, 0, 1, 2,
                                                                                       -1)


def test_config_rejects_test_data():
  with pytest.raises(ValueError, match="test data"):
    vocab.SmallVocabConfig(parts=("dev", "test"))


def test_training_corpus_uses_no_test_data(mcwq_dir):
  corpus = vocab.training_corpus(mcwq_dir)
  expected_q, expected_r = {}, {}
  for split in readers.SPLITS:
    for lang in readers.LANGUAGES:
      for e in readers.read_split(split, "dev", lang, mcwq_dir):
        expected_q[e.question] = None
        expected_r[e.rir] = None
  assert corpus == list(expected_q) + list(expected_r)
  dev_rirs = set(expected_r)
  test_only = [
      e.rir for e in readers.read_split("mcd1", "test", "en", mcwq_dir) if e.rir not in dev_rirs
  ]
  assert test_only and not set(test_only) & set(corpus)


def test_cache_key_and_reuse(cache_dir, small_model, mcwq_dir):
  assert small_model.parent == cache_dir / "spm"
  assert small_model.name.startswith("mcwq_spm_2000_")
  mtime = small_model.stat().st_mtime_ns
  again = vocab.small_vocab_path(mcwq_dir)
  assert again == small_model and again.stat().st_mtime_ns == mtime  # not retrained
  other = vocab.small_vocab_path(
      mcwq_dir, vocab.SmallVocabConfig(vocab_size=1500), train_if_missing=False)
  assert other != small_model and not other.exists()


def test_small_vocabulary_tokenises_all_scripts_and_rir(small_model, mcwq_dir):
  v = vocab.get_vocabulary()
  assert isinstance(v, seqio.SentencePieceVocabulary)
  assert v is vocab.get_vocabulary()  # one shared instance
  assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (2000, 0, 1, 2)
  assert v.sentencepiece_model_file == str(small_model)
  sp = v.tokenizer
  for lang in readers.LANGUAGES:
    for e in readers.read_split("mcd2", "test", lang, mcwq_dir)[:200]:
      ids = v.encode(e.question)
      assert v.decode(ids) == e.question
      assert v.unk_id not in ids
  rir = readers.read_split("mcd1", "dev", "en", mcwq_dir)[0].rir
  pieces = sp.encode(rir, out_type=str)
  assert v.decode(v.encode(rir)) == rir
  for piece in ("▁M0", "▁M1", "▁?x0"):  # placeholders and variables: always single pieces
    assert piece in pieces, piece
  assert "▁" not in pieces  # no bare word-boundary piece before placeholders/variables
  # Pieces span spaces (split_by_whitespace=False): RIR's brackets merge with their neighbours,
  # e.g. "▁)▁)▁.▁(" and "▁(▁wdt:P57", so a query has far fewer pieces than words (25 for 57 here).
  assert "▁)▁)▁.▁(" in pieces and any("wdt:P57" in p and "▁(" in p for p in pieces), pieces
  assert len(pieces) < len(rir.split()) * 0.7


def test_vocabulary_from_env_and_path(small_model, monkeypatch):
  monkeypatch.setenv("MCWQ_VOCAB", str(small_model))
  v = vocab.get_vocabulary()
  assert v == seqio.SentencePieceVocabulary(str(small_model))  # what T5X's check compares
  assert type(v) is vocab._CachedSentencePieceVocabulary  # pylint: disable=unidiomatic-typecheck
  assert v.sentencepiece_model_file == str(small_model)
  assert v.encode("ASK WHERE") == vocab.get_vocabulary(small_model).encode("ASK WHERE")
  # The paper files' vocabulary is the same variable's file (the tasks read it too) ...
  assert vocab.mt5_vocabulary() is v
  # ... and without the variable they say what to set instead of silently disagreeing.
  monkeypatch.delenv("MCWQ_VOCAB")
  with pytest.raises(ValueError, match=r"MCWQ_VOCAB=gs://t5-data/vocabs/mc4.250000.100extra"):
    vocab.mt5_vocabulary()


def test_task_and_model_vocabularies_pass_t5x_check(small_model, monkeypatch, tmp_path):
  """T5X compares the model's and the task's vocabulary with `!=` (seqio: same class state). The
  default small vocabulary and a vocabulary named by MCWQ_VOCAB (as for mT5's model file) both
  equal a plain `seqio.SentencePieceVocabulary` of the same file, which T5X's files bind."""
  default = vocab.get_vocabulary()
  assert default == seqio.SentencePieceVocabulary(str(small_model))
  assert not default != seqio.SentencePieceVocabulary(str(small_model))
  assert default != seqio.SentencePieceVocabulary(str(small_model), extra_ids=100)
  copy = tmp_path / "sentencepiece.model"  # stands in for the mT5 model file
  copy.write_bytes(small_model.read_bytes())
  monkeypatch.setenv("MCWQ_VOCAB", str(copy))
  assert vocab.mt5_vocabulary() == seqio.SentencePieceVocabulary(str(copy))


def test_default_vocabulary_without_data_fails_on_use(monkeypatch, tmp_path):
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path / "no_data"))
  monkeypatch.setenv("MCWQ_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.delenv("MCWQ_VOCAB", raising=False)
  v = vocab.get_vocabulary()  # registering tasks needs no data ...
  from mcwq_t5x.data import paths  # pylint: disable=g-import-not-at-top
  with pytest.raises(paths.DataNotFoundError, match="train_vocab.py"):
    v.encode("ASK")  # ... using the vocabulary does


def test_train_vocab_script(tmp_path, mcwq_dir, capsys, small_model):
  module = mains.load_script("train_vocab")
  assert module.main([]) == 0  # cache hit
  out = capsys.readouterr().out
  assert f"model: {small_model}" in out
  assert "pieces: 2000  pad=0 eos=1 unk=2 bos=-1" in out
  assert hashlib.md5(small_model.read_bytes()).hexdigest() in out


def test_encode_gives_nfc_and_nfd_text_the_same_ids(small_model, mcwq_dir):
  """A library user's `get_vocabulary().encode()` (and `encode_tf`, what the tasks call) puts the
  text in NFC first, as the tasks and `infer` do with questions: the 6,163 Kannada random_split
  dev questions typed in decomposed NFD form (5,231 of them differ from NFC then) get the ids of
  the published NFC text, with the small vocabulary and with one named by path."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  questions = [e.question for e in readers.read_split("random_split", "dev", "kn", mcwq_dir)]
  nfd = [unicodedata.normalize("NFD", q) for q in questions]
  assert len(questions) == 6163 and sum(a != b for a, b in zip(questions, nfd)) == 5231
  for v in (vocab.get_vocabulary(), vocab.get_vocabulary(small_model)):
    assert [v.encode(q) for q in nfd] == [v.encode(q) for q in questions]
    assert v.encode_tf(tf.constant(nfd)).to_list() == v.encode_tf(tf.constant(questions)).to_list()
    assert v.decode(v.encode(nfd[0])) == questions[0]
  # Pickled (gin deep-copies its arguments) it is still the same vocabulary, normalising alike.
  copy = pickle.loads(pickle.dumps(vocab.get_vocabulary()))
  assert copy == vocab.get_vocabulary() and copy.encode(nfd[0]) == copy.encode(questions[0])


def test_missing_vocabulary_file_is_one_line(tmp_path):
  """MCWQ_VOCAB naming a file that is not there (docs/splits.md followed without its vocabulary
  command): the commands stop at once with one line naming the variable and the path."""
  message = ("MCWQ_VOCAB=runs/mcwq_spm.model: this SentencePiece model does not exist; create it "
             "(`python scripts/train_vocab.py --output runs/mcwq_spm.model` trains the small "
             "offline vocabulary there) or unset MCWQ_VOCAB (the small offline vocabulary)")
  env = {"MCWQ_VOCAB": "runs/mcwq_spm.model"}
  train = mains.python_m(
      "mcwq_t5x.train",
      "--gin_file=gin/mcwq_t5x/tiny_random_split_en.gin",
      env=env,
      check=False,
      cwd=tmp_path)
  assert train.returncode == 1 and "Traceback" not in train.stderr
  assert train.stderr.splitlines()[-1] == f"VocabularyNotFoundError: {message}"
  inspect = mains.python_m(
      "mcwq_t5x.inspect_task", "mcwq_mcd1_en", env=env, check=False, cwd=tmp_path)
  assert inspect.returncode == 1 and inspect.stderr.strip() == f"VocabularyNotFoundError: {message}"


def test_unreadable_remote_vocabulary_is_one_line(monkeypatch, local_gcs):
  """A `gs://` vocabulary that cannot be read (offline: the object store's address is a closed
  port on 127.0.0.1; no such object in the stand-in): one line naming MCWQ_VOCAB, the store's
  error and what to do, not a transport error's traceback."""
  path = "gs://mcwq-t5x-no-such-bucket/sentencepiece.model"
  monkeypatch.setenv("MCWQ_VOCAB", path)
  for problem, sentencepiece_only in (("no such object", True), ("ABORTED: ", False)):
    if problem.startswith("ABORTED"):
      monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{local_http.free_port()}")
    vocab.clear_vocabulary_cache()
    with pytest.raises(vocab.VocabularyNotFoundError) as e:
      vocab.get_vocabulary(sentencepiece_only=sentencepiece_only).encode("ASK")
    message = str(e.value)
    assert message.startswith(
        f"MCWQ_VOCAB={path}: this SentencePiece model cannot be read ({problem}"), message
    assert "\n" not in message and message.endswith(
        f"copy it to this machine (e.g. `gsutil cp {path} runs/`) and point MCWQ_VOCAB at the copy")
  assert [p.partition("&")[0] for p in local_gcs.seen
         ] == ["/storage/v1/b/mcwq-t5x-no-such-bucket/o/sentencepiece.model?alt=media"]
  vocab.clear_vocabulary_cache()


def test_vocabulary_in_a_bucket(small_model, local_gcs, monkeypatch, mcwq_dir):
  """MCWQ_VOCAB = 'gs://...' (mT5's is gs://t5-data/vocabs/...; here the small model in the
  stand-in's bucket): the SeqIO class (tasks, T5X) and the SentencePiece-only one (infer, no
  TensorFlow) give the local file's ids and strings, with and without sentinels, in Python and in
  TensorFlow, and keep the URL as their file. Before, the SentencePiece-only class refused URLs
  and the SeqIO class read them through TensorFlow's GCS client, which no variable points at
  another address (so a `gs://` vocabulary could not be tested, nor read without TensorFlow)."""
  (local_gcs.root / "vocabs" / "mcwq").mkdir(parents=True)
  shutil.copy(small_model, local_gcs.root / "vocabs" / "mcwq" / "spm.model")
  url = "gs://vocabs/mcwq/spm.model"
  monkeypatch.setenv("MCWQ_VOCAB", url)
  vocab.clear_vocabulary_cache()
  sentences = [
      t for e in readers.read_split("mcd1", "dev", "kn", mcwq_dir)[:200]
      for t in (e.question, unicodedata.normalize("NFD", e.question), e.rir)
  ]
  for extra_ids in (0, 100):
    local = vocab.get_vocabulary(small_model, extra_ids)
    remote = vocab.get_vocabulary(None if extra_ids == 0 else url, extra_ids)
    only = vocab.get_vocabulary(url, extra_ids, sentencepiece_only=True)
    assert type(remote) is vocab._CachedSentencePieceVocabulary  # pylint: disable=unidiomatic-typecheck
    assert type(only) is vocab.SentencePieceOnlyVocabulary  # pylint: disable=unidiomatic-typecheck
    assert remote.sentencepiece_model_file == only.sentencepiece_model_file == url
    ids = [local.encode(t) for t in sentences]
    assert [remote.encode(t) for t in sentences] == ids == [only.encode(t) for t in sentences]
    assert remote.encode_tf(sentences[0]).numpy().tolist() == ids[0]
    assert (remote.vocab_size, only.vocab_size) == (local.vocab_size, local.vocab_size)
    assert remote.decode(ids[2]) == only.decode(ids[2]) == local.decode(ids[2])
  assert {p.partition("&")[0] for p in local_gcs.seen
         } == {"/storage/v1/b/vocabs/o/mcwq%2Fspm.model?alt=media"}
  vocab.clear_vocabulary_cache()


def test_sentencepiece_only_vocabulary_gives_seqio_ids_and_strings(small_model, mcwq_dir, tmp_path):
  """`sentencepiece_only` (the infer main's, without SeqIO or TensorFlow) encodes and decodes as
  the SeqIO class of the same file: the first 500 mcd1 dev questions of each of the 4 languages,
  in NFC and NFD, and their RIR; rows of random ids with EOS inside and ids past the vocabulary (UNK); and with
  T5-base's 100 appended sentinels, whose first is the highest id."""
  sentences = [
      t for lang in readers.LANGUAGES
      for e in readers.read_split("mcd1", "dev", lang, mcwq_dir)[:500]
      for t in (e.question, unicodedata.normalize("NFD", e.question), e.rir)
  ]
  for extra_ids in (0, 100):
    seqio_vocab = vocab.get_vocabulary(small_model, extra_ids)
    ours = vocab.get_vocabulary(small_model, extra_ids, sentencepiece_only=True)
    assert type(ours) is vocab.SentencePieceOnlyVocabulary  # pylint: disable=unidiomatic-typecheck
    assert (ours.vocab_size, ours.pad_id, ours.eos_id, ours.unk_id,
            ours.extra_ids) == (2000 + extra_ids, 0, 1, 2, extra_ids)
    assert ours.sentencepiece_model_file == seqio_vocab.sentencepiece_model_file
    ids = [seqio_vocab.encode(t) for t in sentences]
    assert [ours.encode(t) for t in sentences] == ids
    rng = random.Random(extra_ids)
    rows = [[rng.randrange(2000 + extra_ids + 50)
             for _ in range(rng.randrange(40))]
            for _ in range(1000)]
    for row in rows[::3]:  # EOS inside: decoding stops there
      row.insert(rng.randrange(len(row) + 1), 1)
    rows += ids[:300]
    assert sum(1 in r[:-1] for r in rows) > 200 and sum(
        max(r, default=0) >= 2000 for r in rows) > 200
    texts = [seqio_vocab.decode(r) for r in rows]
    assert [ours.decode(r) for r in rows] == texts
    assert [ours.decode(np.asarray(r, np.int32)) for r in rows] == texts  # rows of a decode batch
  assert ours.decode([2099]) == "<extra_id_0>" and ours.decode([2000]) == "<extra_id_99>"
  copy = pickle.loads(pickle.dumps(ours))  # gin deep-copies its arguments
  assert copy == ours and copy.encode(sentences[1]) == ours.encode(sentences[0])
  # An object-store URL too (read through TensorStore, not TensorFlow): test_vocabulary_in_a_bucket.
  remote = vocab.get_vocabulary("gs://mcwq-t5x-no-such-bucket/spm.model", sentencepiece_only=True)
  assert type(remote) is vocab.SentencePieceOnlyVocabulary  # pylint: disable=unidiomatic-typecheck
  for bad, problem in ((tmp_path / "absent.model", "does not exist"), (tmp_path / "bad.model",
                                                                       "cannot be read (")):
    if bad.name == "bad.model":
      bad.write_bytes(b"not a model")
    for extra_ids in (0, 5):
      with pytest.raises(
          vocab.VocabularyNotFoundError,
          match=f"^the SentencePiece model {bad} {re.escape(problem)}"):
        vocab.get_vocabulary(bad, extra_ids, sentencepiece_only=True).encode("ASK")
