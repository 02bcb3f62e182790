"""A run knows what it is (MODEL_DIR/run.json + vocab/spm.model, `mcwq_t5x.checkpointing.run_info`), and
questions are normalised in one place for training, evaluation and inference
(`readers.normalize_question`).

The session's run of our engine (conftest.our_run: SMALL_MODEL, 300 steps on the 155 Hebrew gold
questions, trained once in a fresh process) is what the tests read, two of them with a fresh
`python -m mcwq_t5x.infer`.
"""
import hashlib
import json
import logging
import os
import shutil
import unicodedata

import numpy as np
import pytest
import seqio

from mcwq_t5x.checkpointing import export_hf
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.data import readers
from mcwq_t5x import infer as infer_lib
import mains
import scenarios

MODEL = "gin/mcwq_t5x/models/tiny.gin"
KN_DEV = "official/random_split/dev.kn.txt"


@pytest.fixture(scope="session")
def tiny_run(our_run):
  """MODEL_DIR of the session's run of `python -m mcwq_t5x.train` (conftest.our_run; the default
  vocabulary)."""
  return our_run


@pytest.fixture(scope="session")
def other_vocab(tiny_run, tmp_path_factory):
  """A SentencePiece model of the same size as the run's but other content (two pieces' scores
  changed): the size check passes, the identity check must not."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto.FromString(
      (tiny_run / run_info.VOCAB_COPY).read_bytes())
  proto.pieces[-1].score, proto.pieces[-2].score = proto.pieces[-2].score, proto.pieces[-1].score
  proto.pieces[-1].score -= 1.0
  path = tmp_path_factory.mktemp("other_vocab") / "other.model"
  path.write_bytes(proto.SerializeToString())
  return path


def _sha(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _infer(checkpoint, text, env):
  return mains.python_m(
      "mcwq_t5x.infer",
      f"--gin_file={MODEL}",
      "--gin_file=gin/mcwq_t5x/runs/infer.gin",
      f"--gin.CHECKPOINT_PATH='{checkpoint}'",
      "--gin.MAX_DECODE_LENGTH=8",
      *mains.gin_flags(mains.SMALL_MODEL),
      input=text,
      env=env,
      check=False)


# --- run.json ----------------------------------------------------------------------------------
def test_run_json_records_the_run(tiny_run):
  run = json.loads((tiny_run / "run.json").read_text())
  assert run["format"] == 1 and run["engine"] == "mcwq_t5x" and run["engine_version"]
  assert run["network"]["vocab_size"] == 2000 and run["network"]["emb_dim"] == 32
  assert run["network"]["num_encoder_layers"] == 1 and run["network"]["dtype"] == "float32"
  assert run["task"] == "mcwq_gold_he" and run["split"] == "test"
  assert run["feature_lengths"] == {"inputs": 40, "targets": 128}
  assert run["train_steps"] == scenarios.OUR_RUN_STEPS and run["batch_size"] == 8
  vocab = run["vocabulary"]
  assert vocab["copy"] == "vocab/spm.model" and vocab["extra_ids"] == 0
  copy = tiny_run / "vocab/spm.model"
  assert vocab["sha256"] == _sha(copy) and copy.read_bytes() == open(vocab["path"], "rb").read()
  assert run_info.network_config(run).emb_dim == 32


def test_check_vocabulary_in_process(tiny_run, other_vocab, caplog, tmp_path):
  same = seqio.SentencePieceVocabulary(str(tiny_run / "vocab/spm.model"))
  run_info.check_vocabulary(same, tiny_run / f"checkpoint_{scenarios.OUR_RUN_STEPS}",
                            "test")  # no error
  with pytest.raises(run_info.VocabularyMismatchError) as e:
    run_info.check_vocabulary(
        seqio.SentencePieceVocabulary(str(other_vocab)), tiny_run, "train (resuming)")
  msg = str(e.value)
  assert str(other_vocab) in msg and _sha(other_vocab) in msg
  assert str(tiny_run / "vocab/spm.model") in msg and _sha(tiny_run / "vocab/spm.model") in msg
  with pytest.raises(run_info.VocabularyMismatchError, match="extra_ids 5"):
    run_info.check_vocabulary(
        seqio.SentencePieceVocabulary(str(tiny_run / "vocab/spm.model"), extra_ids=5), tiny_run,
        "eval")
  # A checkpoint without run.json (not a run of ours): loads, with a warning.
  legacy = tmp_path / "legacy_run"
  legacy.mkdir()
  with caplog.at_level(logging.WARNING):
    run_info.check_vocabulary(same, legacy, "infer")
  assert "no run.json" in caplog.text


def test_infer_with_another_vocabulary_is_an_error(tiny_run, other_vocab, tmp_path):
  blocked = mains.without_packages(tmp_path / "site", "tensorflow", "seqio")
  out = _infer(tiny_run, "Did M0 direct M1\n", {"MCWQ_VOCAB": str(other_vocab), **blocked})
  assert out.returncode != 0
  assert "VocabularyMismatchError" in out.stderr
  for text in (str(other_vocab), _sha(other_vocab), str(tiny_run / "vocab/spm.model"),
               _sha(tiny_run / "vocab/spm.model")):
    assert text in out.stderr, (text, out.stderr[-3000:])
  assert out.stdout == ""


def test_infer_uses_the_recorded_vocabulary_and_normalises(tiny_run, tmp_path, mcwq_dir):
  # A data folder whose default vocabulary would differ (no kn/zh files, one English dev file):
  # with $MCWQ_VOCAB unset the run's recorded vocabulary is used. The input starts with a BOM,
  # has an empty and a whitespace-only line, and one Kannada question in NFC and in NFD form.
  data = tmp_path / "mcwq/official/random_split"
  data.mkdir(parents=True)
  lines = (mcwq_dir / "official/random_split/dev.en.txt").read_text().splitlines()[:30]
  (data / "dev.en.txt").write_text("\n".join(lines) + "\n")
  kn = readers.read_official(mcwq_dir / KN_DEV)[0].question
  nfd = unicodedata.normalize("NFD", kn)
  assert nfd != kn
  text = f"\ufeffDid M0 direct M1\n\n   \nDid M0 direct M1\n{kn}\n{nfd}\n"
  env = {"MCWQ_DATA_DIR": str(tmp_path / "mcwq"), "MCWQ_CACHE_DIR": str(tmp_path / "cache")}
  # Inference reads the vocabulary with SentencePiece alone: it runs without TensorFlow and SeqIO.
  env.update(mains.without_packages(tmp_path / "site", "tensorflow", "seqio"))
  out = _infer(tiny_run, text, dict(env, MCWQ_VOCAB=""))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "recorded in" in out.stderr
  assert not (tmp_path / "cache/spm").exists()  # no vocabulary trained from the other data
  got = out.stdout.split("\n")
  assert len(got) == 7 and got[-1] == ""
  assert got[1] == got[2] == ""
  assert got[0] == got[3]  # the BOM changed nothing
  assert got[4] == got[5]  # NFD and NFC: the same tokens, the same output
  assert out.stderr.count("is empty") == 2


# --- export reads run.json ---------------------------------------------------------------------
def test_export_reads_run_json(tiny_run, other_vocab, tmp_path):
  run_dir = tmp_path / "run"
  shutil.copytree(tiny_run, run_dir)
  (run_dir / "config.gin").unlink()  # nothing but run.json describes the model
  out = export_hf.export_checkpoint(run_dir, tmp_path / "hf")
  config = json.loads((out / "config.json").read_text())
  assert config["d_model"] == 32 and config["num_layers"] == 1 and config["vocab_size"] == 2000
  assert config["tie_word_embeddings"] is False
  assert (out / "spiece.model").read_bytes() == (run_dir / "vocab/spm.model").read_bytes()
  # The run's target feature length, recorded in run.json, is generate()'s default length.
  assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == 128
  # An explicit other vocabulary is an error naming both.
  with pytest.raises(ValueError) as e:
    export_hf.export_checkpoint(run_dir, tmp_path / "hf2", vocab=other_vocab)
  assert str(other_vocab) in str(e.value) and _sha(run_dir / "vocab/spm.model") in str(e.value)
  # The recorded vocabulary gone (copy deleted, recorded path changed): a clear error.
  run = json.loads((run_dir / "run.json").read_text())
  run["vocabulary"]["path"] = str(tmp_path / "gone.model")
  (run_dir / "run.json").write_text(json.dumps(run))
  (run_dir / "vocab/spm.model").unlink()
  with pytest.raises(ValueError, match="the run's vocabulary .* is not available"):
    export_hf.export_checkpoint(run_dir, tmp_path / "hf3")
  # A run folder without run.json: one line naming the flags to pass; with them it exports.
  bare = tmp_path / "bare"
  shutil.copytree(tiny_run, bare)
  (bare / "run.json").unlink()
  with pytest.raises(ValueError) as e:
    export_hf.export_checkpoint(bare, tmp_path / "hf4")
  assert "\n" not in str(e.value) and "no run.json at or up to 3 folders above it" in str(e.value)
  assert "pass --model_config" in str(e.value)
  assert ", --vocab" in str(e.value) and ", --max_new_tokens" in str(e.value)
  model_config = tmp_path / "model.json"
  model_config.write_text(json.dumps(json.loads((tiny_run / "run.json").read_text())["network"]))
  out = export_hf.export_checkpoint(
      bare,
      tmp_path / "hf4",
      model_config=str(model_config),
      vocab=bare / "vocab/spm.model",
      max_new_tokens=128)
  assert (out / "model.safetensors").read_bytes() == (tmp_path /
                                                      "hf/model.safetensors").read_bytes()


def test_a_run_in_a_bucket_gives_its_recorded_vocabulary(local_gcs, monkeypatch):
  """eval/infer on a run copied to a bucket (`gs://`, the stand-in on 127.0.0.1): run.json above a
  `checkpoint_<step>` is found there, and with MCWQ_VOCAB unset its vocabulary copy (checked by
  its SHA-256) becomes the vocabulary, by URL. Before, the URL was read as the local path "gs:/..."
  and no run.json was found: the run's vocabulary was not adopted and not checked."""
  model_dir = local_gcs.root / "runs" / "model"
  (model_dir / "checkpoint_3").mkdir(parents=True)
  (model_dir / "checkpoint_3" / "checkpoint").write_bytes(b"\x80")
  (model_dir / "vocab").mkdir()
  (model_dir / run_info.VOCAB_COPY).write_bytes(b"the run's model file")
  record = {
      "path": "/gone/spm.model",
      "sha256": hashlib.sha256(b"the run's model file").hexdigest(),
      "extra_ids": 0,
      "copy": run_info.VOCAB_COPY
  }
  (model_dir / run_info.RUN_JSON).write_text(json.dumps({"format": 1, "vocabulary": record}))
  # why setenv first: delenv of an unset variable records nothing, and the URL that
  # `adopt_recorded_vocabulary` puts into os.environ would outlive the test (later tests on the
  # worker then read their vocabulary from gs://runs/...)
  monkeypatch.setenv(run_info.VOCAB_ENV, "")
  monkeypatch.delenv(run_info.VOCAB_ENV)
  found = run_info.find("gs://runs/model/checkpoint_3")
  assert str(found) == "gs://runs/model/run.json"
  assert str(run_info.adopt_recorded_vocabulary(
      "gs://runs/model/checkpoint_3")) == "gs://runs/model/vocab/spm.model"
  assert os.environ[run_info.VOCAB_ENV] == "gs://runs/model/vocab/spm.model"


# --- normalisation (in process) ----------------------------------------------------------------
def test_normalize_question():
  assert readers.normalize_question("\ufeff  Did M0 direct M1 ") == "Did M0 direct M1"
  assert readers.normalize_question(" \t ") == ""
  kn = "\u0c95\u0cbf"  # Kannada KI: already NFC
  assert readers.normalize_question(unicodedata.normalize("NFD", "\u0cc0")) == "\u0cc0"
  assert readers.normalize_question(kn) == kn
  # Full-width Chinese punctuation is kept (NFC, not NFKC).
  assert readers.normalize_question("M0是谁？") == "M0是谁？"
  assert readers.Example("\ufeffe\u0301 ", None, None, "en").question == "\u00e9"


def test_bom_at_the_start_of_a_data_file(tmp_path, mcwq_dir):
  src = (mcwq_dir / "official/random_split/dev.en.txt").read_text().splitlines()[:3]
  path = tmp_path / "dev.en.txt"
  path.write_text("\ufeff" + "\n".join(src) + "\n", encoding="utf-8")
  got = readers.read_official(path, with_rir=True)
  assert [e.question for e in got] == [readers.split_official_line(l)[0] for l in src]
  assert readers.decode_lines("\ufeffa\nb\n".encode(), "<stdin>") == ["a", "b"]


def test_nfd_and_nfc_kannada_tokenise_identically(tiny_run, tmp_path, mcwq_dir):
  """Through the SeqIO task (the training/evaluation path) and `infer.encode_questions` (the
  inference path): the Kannada dev questions in NFD form (and after a BOM) give the NFC tokens."""
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  vocab = seqio.SentencePieceVocabulary(str(tiny_run / "vocab/spm.model"))
  lines = (mcwq_dir / KN_DEV).read_text(encoding="utf-8").splitlines()[:40]
  nfd_lines = [unicodedata.normalize("NFD", l) for l in lines]
  registered = []
  for name, text in (("nfc", lines), ("nfd", nfd_lines)):
    folder = tmp_path / name / "official/random_split"
    folder.mkdir(parents=True)
    bom = "\ufeff" if name == "nfd" else ""
    (folder / "dev.kn.txt").write_text(bom + "\n".join(text) + "\n", encoding="utf-8")
    registered += tasks.mcwq.register_mcwq_tasks(
        vocabulary=vocab, suffix=f"_norm_{name}", data_dir=str(tmp_path / name))

  def inputs(suffix):
    task = seqio.get_mixture_or_task(f"mcwq_random_split_kn_norm_{suffix}")
    ds = task.get_dataset(None, split="validation", shuffle=False)
    return [list(ex["inputs"]) for ex in ds.as_numpy_iterator()]

  nfc, nfd = inputs("nfc"), inputs("nfd")
  for registered_name in registered:  # the worker's later tests see the registries as before
    for registry in (seqio.TaskRegistry, seqio.MixtureRegistry):
      if registered_name in registry.names():
        registry.remove(registered_name)
  assert len(nfc) == 40 and nfc == nfd
  # Without the normalisation most of them would differ.
  questions = [readers.split_official_line(l)[0] for l in lines]
  raw_nfd = [unicodedata.normalize("NFD", q) for q in questions]
  assert sum(vocab.encode(a) != vocab.encode(b) for a, b in zip(questions, raw_nfd)) > 20
  np.testing.assert_array_equal(
      infer_lib.encode_questions(questions, vocab, 40),
      infer_lib.encode_questions(["\ufeff" + q for q in raw_nfd], vocab, 40))
