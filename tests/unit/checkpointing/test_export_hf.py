"""Export to Hugging Face (mcwq_t5x.checkpointing.export_hf).

transformers loads the exported folder with `MT5ForConditionalGeneration` /
`T5ForConditionalGeneration` and reproduces our teacher-forced logits (to 1e-4) and our greedy
decodes (`generate(num_beams=1)` vs `model.predict_batch`, token for token) on 32 real MCWQ
questions (mcd1 dev, 8 each in en/he/kn/zh, with their RIR targets) from ../shared, tokenised with
the project's small vocabulary (`mcwq_t5x.data.vocab`); its tokenizer encodes like that vocabulary;
import -> export -> import is the identity on params; bad input is a clear error.

Models: a tiny model trained for a few steps with the engine (`tiny_engine`, `trainer`,
`checkpoints`: an Orbax checkpoint plus the run's run.json, exported through the command line),
and a random model with mT5-small's layout (8+8 layers, d_model 512, 6 heads of 64, d_ff 1024,
gated GELU, untied output layer) but a 2048-row vocabulary instead of 250,112, so that it runs in
well under a minute. The full size takes minutes and about 11 GB on a CPU (the 32 x 64 x 250,112
float32 logits are 2 GB per side): set `MCWQ_TEST_FULL_MT5_SMALL=1`.
"""
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

from flax import traverse_util
import jax
import numpy as np
import pytest
import sentencepiece as spm

torch = pytest.importorskip(
    "torch")  # test requirement: parity against an independent implementation
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file

from mcwq_t5x.checkpointing import checkpoint_import as ci
from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import export_hf
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.checkpointing import t5x_checkpoint_writer
from mcwq_t5x.data import vocab as vocab_lib
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x import export_hf as export_hf_cli
import mains
import tiny_engine

LANGUAGES = ("en", "he", "kn", "zh")
PER_LANGUAGE = 8  # 32 questions
MAX_TARGET_LEN = 64
DECODE_LEN = 16
SMALL_VOCAB_ROWS = 2000  # the small vocabulary's size
EXPORTED_FILES = ("config.json", "model.safetensors", "generation_config.json", "spiece.model",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _model_config_file(path, config):
  """`config` as a `--model_config` JSON file (the T5Config fields, as run.json holds them)."""
  path.write_text(json.dumps(run_info.network_fields(config)))
  return path


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_vocab():
  """The project's small SentencePiece vocabulary (trained on first use, then cached)."""
  vocabulary = vocab_lib.get_vocabulary(vocab_lib.small_vocab_path())
  assert vocabulary.vocab_size == SMALL_VOCAB_ROWS
  return vocabulary


@pytest.fixture(scope="module")
def spm_path(small_vocab):
  return pathlib.Path(small_vocab.sentencepiece_model_file)


def _texts(mcwq_dir, suffix, language, start, count):
  path = mcwq_dir / "translations" / "mcd1" / f"dev.{language}.{suffix}"
  return path.read_text(encoding="utf-8").splitlines()[start:start + count]


@pytest.fixture(scope="module")
def mcwq_batch(mcwq_dir, small_vocab):
  """32 different mcd1 dev examples (8 per language) -> padded feature-converter batch."""
  questions, targets = [], []
  for i, language in enumerate(LANGUAGES):
    start = i * PER_LANGUAGE
    questions += _texts(mcwq_dir, "txt", language, start, PER_LANGUAGE)
    targets += _texts(mcwq_dir, "sparql", "en", start, PER_LANGUAGE)  # RIR, line-parallel
  batch = tiny_engine.feature_batch(
      [small_vocab.encode(q) + [1] for q in questions],
      [(small_vocab.encode(t) + [1])[:MAX_TARGET_LEN] for t in targets])
  enc, tgt = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
  assert enc.shape[0] == 32 and (enc == 0).any() and (tgt == 0).any()
  return batch


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def _flat(params):
  return {
      jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)
  }


def _assert_same_params(a, b):
  fa, fb = _flat(a), _flat(b)
  assert sorted(fa) == sorted(fb)
  for key, value in fa.items():
    assert fb[key].dtype == np.float32, key
    np.testing.assert_array_equal(fb[key], value, err_msg=key)


def _load_hf(out, config):
  cls = (
      transformers.T5ForConditionalGeneration
      if config.logits_via_embedding else transformers.MT5ForConditionalGeneration)
  hf, info = cls.from_pretrained(str(out), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  hf.eval()
  return hf


def _check_parity(hf, config, params, batch):
  """Asserts transformers reproduces our logits (1e-4) and greedy decodes; returns the max
  logit difference."""
  module = network.Transformer(config)
  enc, dec, tgt = (
      batch[k] for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"))
  ours = np.asarray(
      jax.jit(module.apply, static_argnames="enable_dropout")({
          "params": params
      },
                                                              enc,
                                                              dec,
                                                              tgt,
                                                              enable_dropout=False))
  input_ids = torch.tensor(enc, dtype=torch.long)
  attention_mask = (input_ids > 0).long()
  with torch.no_grad():
    theirs = hf(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=torch.tensor(dec, dtype=torch.long)).logits.numpy()
  valid = tgt > 0
  assert ours.shape == theirs.shape
  assert np.abs(theirs[valid]).max() > 1.0, "logits too small to be a useful test"
  diff = float(np.abs(ours[valid] - theirs[valid]).max())
  assert diff < 1e-4, (diff, np.abs(theirs[valid]).max())
  # Greedy: our cached decoding vs transformers' generate (start/EOS/pad ids from the exported
  # generation_config.json).
  predicted = np.asarray(
      model_lib.EncoderDecoderModel(module).predict_batch(
          params, {"encoder_input_tokens": enc}, max_decode_length=DECODE_LEN))
  with torch.no_grad():
    generated = hf.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=DECODE_LEN,
        num_beams=1,
        do_sample=False).numpy()
  assert (generated[:, 0] == 0).all()  # decoder start token
  padded = np.zeros_like(predicted)
  padded[:, :generated.shape[1] - 1] = generated[:, 1:]
  np.testing.assert_array_equal(predicted, padded)
  assert len({tuple(row) for row in predicted}) > 1, "decodes do not depend on the input"
  print(f"max |logit difference| {diff:.3g} (max |logit| {np.abs(theirs[valid]).max():.3g}); "
        f"{predicted.size} greedy tokens identical")
  return diff


def _random_params(config, seed):
  """Random params at the scales of T5X's initialisers (numpy: the init is not compiled)."""
  rng = np.random.default_rng(seed)
  params = {}
  for name, shape in ci.expected_param_shapes(config).items():
    normal = rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("/scale"):  # layer norms, init ones
      value = 1.0 + 0.1 * normal
    elif name.endswith("rel_embedding"):
      value = 0.3 * normal
    elif name == "token_embedder/embedding":  # N(0, 1)
      value = normal
    else:  # kernels [in, out]: variance 1/fan_in; queries 1/(fan_in * head_dim)
      value = normal / np.sqrt(shape[0])
      if name.endswith("query/kernel"):
        value /= np.sqrt(config.head_dim)
    params[name] = value.astype(np.float32)
  return jax.tree_util.tree_map(np.asarray, traverse_util.unflatten_dict(params, sep="/"))


# ------------------------------------------------------------------------------------------------
# A tiny model trained with the engine and saved as an Orbax checkpoint
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, mcwq_batch, small_vocab):
  """(config, params, MODEL_DIR): 8 training steps on the 32 examples, an Orbax checkpoint
  MODEL_DIR/checkpoint_8 and the run's run.json (target length `DECODE_LEN`)."""
  model = tiny_engine.tiny_model(0.0, vocab_size=SMALL_VOCAB_ROWS)
  partitioner = partitioning.Partitioner(num_partitions=1)
  lr = trainer_lib.create_learning_rate_schedule(0.01, "constant")
  trainer = trainer_lib.Trainer(model, partitioner, lr, seed=0)
  state = trainer.create_state({k: v.shape for k, v in mcwq_batch.items()})
  losses = []
  for _ in range(8):
    state, metrics = trainer.train_step(state, partitioner.make_global_batch(mcwq_batch))
    losses.append(float(metrics["loss"]) / float(metrics["num_tokens"]))
  assert losses[-1] < losses[0] - 0.5, losses
  model_dir = tmp_path_factory.mktemp("run")
  manager = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  manager.save(8, state, {"step": 8})
  manager.close()
  run_info.write(
      model_dir,
      model=model_lib.EncoderDecoderModel(model.module, small_vocab, small_vocab),
      feature_lengths={
          "inputs": 32,
          "targets": DECODE_LEN
      })
  return model.module.config, jax.device_get(state.params), model_dir


def test_export_trained_tiny_run_loads_in_transformers(tiny_run, mcwq_batch, spm_path, tmp_path,
                                                       capsys):
  config, params, model_dir = tiny_run
  assert checkpoint_paths.detect_format(model_dir) == "orbax"
  out = tmp_path / "hf"
  # Model config, vocabulary and decoding length all come from MODEL_DIR/run.json.
  assert export_hf_cli.main(["--checkpoint", str(model_dir), "--out", str(out)]) == 0
  n_params = sum(int(np.prod(s)) for s in ci.expected_param_shapes(config).values())
  assert capsys.readouterr().out == (
      f"wrote {out}: MT5ForConditionalGeneration ({n_params:,} parameters), its tokenizer, "
      f"generation_config.json (greedy, up to {DECODE_LEN} new tokens)\n")
  assert sorted(p.name for p in out.iterdir()) == sorted(EXPORTED_FILES)
  assert (out / "spiece.model").read_bytes() == spm_path.read_bytes()
  cfg = json.loads((out / "config.json").read_text())
  assert cfg["model_type"] == "mt5" and cfg["tie_word_embeddings"] is False
  assert (cfg["d_model"], cfg["d_ff"], cfg["num_heads"], cfg["vocab_size"]) == (16, 32, 2, 2000)
  assert json.loads((out / "generation_config.json").read_text()) == {
      "decoder_start_token_id": 0,
      "eos_token_id": 1,
      "pad_token_id": 0,
      "max_new_tokens": DECODE_LEN,  # the run's feature_lengths['targets']
      "num_beams": 1,
      "do_sample": False
  }
  hf = _load_hf(out, config)
  _check_parity(hf, config, params, mcwq_batch)
  # Round trip: the export imports back to the checkpoint's params, bit for bit.
  _assert_same_params(checkpoint_loaders.load_params(model_dir, config).params, params)
  _assert_same_params(checkpoint_loaders.load_params(out, ci.config_from_hf(out)).params, params)


def _mt5_small_layout(vocab_size):
  config = network.get_config("mt5_small", vocab_size=vocab_size, dropout_rate=0.0)
  ref = network.CONFIGS["mt5_small"]
  assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim,
          config.num_encoder_layers, config.num_decoder_layers, config.mlp_activations,
          config.logits_via_embedding) == (512, 6, 64, 1024, 8, 8, ("gelu", "linear"), False)
  assert config == network.T5Config(**{
      **ref.__dict__, "vocab_size": vocab_size,
      "dropout_rate": 0.0
  })
  return config


@pytest.mark.parametrize("vocab_size", [
    2048,
    pytest.param(
        250112,
        marks=pytest.mark.skipif(
            not os.environ.get("MCWQ_TEST_FULL_MT5_SMALL"),
            reason="full mT5-small (300M params) takes minutes; set MCWQ_TEST_FULL_MT5_SMALL=1")),
])
def test_export_mt5_small_layout_matches_transformers(vocab_size, mcwq_batch, spm_path, tmp_path):
  config = _mt5_small_layout(vocab_size)
  params = _random_params(config, seed=3)
  out = export_hf.export_params(params, config, tmp_path / "hf", spm_path, max_new_tokens=64)
  hf = _load_hf(out, config)
  assert hf.config.d_model == 512 and hf.config.num_decoder_layers == 8
  assert hf.config.feed_forward_proj == "gated-gelu"
  _check_parity(hf, config, params, mcwq_batch)
  _assert_same_params(checkpoint_loaders.load_params(out, config).params, params)


# ------------------------------------------------------------------------------------------------
# Tokenizer files
# ------------------------------------------------------------------------------------------------
def test_export_tokenizer_encodes_like_the_vocabulary(mcwq_dir, small_vocab, spm_path, tmp_path):
  assert export_hf.write_tokenizer(tmp_path, spm_path, 0, SMALL_VOCAB_ROWS) == SMALL_VOCAB_ROWS
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id) == (1, 0, 2)
  texts = [t for language in LANGUAGES for t in _texts(mcwq_dir, "txt", language, 0, 100)]
  texts += _texts(mcwq_dir, "sparql", "en", 0, 100)
  texts += ["  two  spaces ", "M0的 ?x0", "emoji \U0001F600 and \u00e9"]  # edge cases
  for text in texts:
    ids = small_vocab.encode(text)
    assert tokenizer(text)["input_ids"] == ids + [1], text
    assert tokenizer.decode(ids + [1], skip_special_tokens=True) == small_vocab.decode(ids)


def test_export_tokenizer_unigram_with_sentinels(mcwq_dir, tmp_path):
  """A unigram model (as mT5's) with seqio extra ids: sentinels at seqio's ids."""
  lines = _texts(mcwq_dir, "txt", "en", 0, 300) + _texts(mcwq_dir, "sparql", "en", 0, 300)
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines),
      model_writer=proto,
      vocab_size=150,
      pad_id=0,
      eos_id=1,
      unk_id=2,
      bos_id=-1,
      model_type="unigram",
      minloglevel=2)
  model_file = tmp_path / "unigram.model"
  model_file.write_bytes(proto.getvalue())
  out = tmp_path / "tok"
  out.mkdir()
  assert export_hf.write_tokenizer(out, model_file, 5, 160) == 155
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  seqio_vocab = vocab_lib.get_vocabulary(str(model_file), extra_ids=5)
  assert seqio_vocab.vocab_size == len(tokenizer) == 155
  for text in lines[:50] + lines[-50:]:
    assert tokenizer(text)["input_ids"] == seqio_vocab.encode(text) + [1], text
  assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == 154
  assert tokenizer.convert_tokens_to_ids("<extra_id_4>") == 150
  assert seqio_vocab.decode([154]) == tokenizer.decode([154]) == "<extra_id_0>"
  with pytest.raises(ValueError, match="more than the model's 154 embedding rows"):
    export_hf.write_tokenizer(tmp_path / "tok", model_file, 5, 154)


# ------------------------------------------------------------------------------------------------
# Round trips
# ------------------------------------------------------------------------------------------------
def _hf_folder(kind, path):
  torch.manual_seed(0)
  tiny_engine.hf_t5(kind, 2048).save_pretrained(str(path))
  return path


@pytest.mark.parametrize("kind", ["mt5", "t5_1_0"])
def test_export_import_round_trip_is_identity(kind, spm_path, tmp_path, capsys):
  original = _hf_folder(kind, tmp_path / "original")
  capsys.readouterr()  # transformers' progress bar
  config = ci.config_from_hf(original)
  assert config.logits_via_embedding == (kind == "t5_1_0")
  params = checkpoint_loaders.load_params(original, config).params
  out = tmp_path / "exported"
  # transformers' own folder gives no decoding length: the one flag it lacks is named.
  assert export_hf_cli.main(
      ["--checkpoint", str(original), "--out",
       str(out), "--vocab",
       str(spm_path)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  assert "the Hugging Face folder has no max_new_tokens in generation_config.json" in err, err
  assert "--max_new_tokens" in err and "--vocab" not in err and "--model_config" not in err, err
  assert export_hf_cli.main([
      "--checkpoint",
      str(original), "--out",
      str(out), "--vocab",
      str(spm_path), "--max_new_tokens", "48"
  ]) == 0
  assert ci.config_from_hf(out) == config
  _assert_same_params(checkpoint_loaders.load_params(out, config).params, params)
  # The exported tensors are the original ones, and nothing else.
  before, after = load_file(str(original / "model.safetensors")), load_file(
      str(out / "model.safetensors"))
  assert sorted(after) == sorted(key for key, _ in ci.hf_name_map(config).values())
  assert ("lm_head.weight" in after) == (kind == "mt5")
  for key, value in after.items():
    np.testing.assert_array_equal(value, before[key], err_msg=key)
  # Exporting the export again (vocabulary, decoding length now from its own files) changes
  # nothing.
  again = export_hf.export_checkpoint(out, tmp_path / "again")
  for name in EXPORTED_FILES:
    assert (again / name).read_bytes() == (out / name).read_bytes(), name
  assert json.loads((again / "generation_config.json").read_text())["max_new_tokens"] == 48
  hf = _load_hf(out, config)
  assert type(hf).__name__ == ("MT5ForConditionalGeneration"
                               if kind == "mt5" else "T5ForConditionalGeneration")


def test_export_t5x_native_checkpoint_needs_the_flags(tiny_run, spm_path, tmp_path, capsys):
  """A checkpoint without run.json (T5X's layout, no run folder around it): without the flags one
  line names all three; with them (a JSON model config) it exports the checkpoint's params."""
  config, params, _ = tiny_run
  ckpt = t5x_checkpoint_writer.save_t5x_checkpoint(
      params, tmp_path / "t5x" / "checkpoint_8", step=8)
  out = tmp_path / "hf"
  assert export_hf_cli.main(["--checkpoint", str(tmp_path / "t5x"), "--out", str(out)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "no run.json at or up to 3 folders above it" in err, err
  for flag in ("--model_config", "--vocab", "--max_new_tokens"):
    assert f"pass {flag}" in err or f", {flag}" in err, (flag, err)
  assert not out.exists()
  model_config = _model_config_file(tmp_path / "model.json", config)
  assert export_hf_cli.main([
      "--checkpoint",
      str(tmp_path / "t5x"), "--out",
      str(out), "--model_config",
      str(model_config), "--vocab",
      str(spm_path), "--max_new_tokens",
      str(DECODE_LEN)
  ]) == 0
  assert capsys.readouterr().out.startswith(f"wrote {out}: MT5ForConditionalGeneration (")
  _assert_same_params(checkpoint_loaders.load_params(out, config).params, params)
  _assert_same_params(checkpoint_loaders.load_params(ckpt, config).params, params)
  assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == DECODE_LEN
  # A preset name works the same way; its shapes are not these params'.
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError, match=r"token_embedder/embedding has shape"):
    export_hf.export_checkpoint(
        ckpt, tmp_path / "hf2", model_config="tiny", vocab=spm_path, max_new_tokens=8)
  with pytest.raises(ValueError, match="'mt5_tiny': neither a preset of network.CONFIGS"):
    export_hf.export_checkpoint(
        ckpt, tmp_path / "hf2", model_config="mt5_tiny", vocab=spm_path, max_new_tokens=8)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
def test_export_rejects_another_architecture(tiny_run, spm_path, tmp_path, capsys):
  bart = transformers.BartForConditionalGeneration(
      transformers.BartConfig(
          vocab_size=64,
          d_model=16,
          encoder_layers=1,
          decoder_layers=1,
          encoder_attention_heads=2,
          decoder_attention_heads=2,
          encoder_ffn_dim=32,
          decoder_ffn_dim=32))
  bart.save_pretrained(str(tmp_path / "bart"))
  assert export_hf_cli.main([
      "--checkpoint",
      str(tmp_path / "bart"), "--out",
      str(tmp_path / "o"), "--vocab",
      str(spm_path)
  ]) == 1
  err = capsys.readouterr().err
  assert "model_type 'bart'" in err and "not a T5/mT5" in err, err
  assert not (tmp_path / "o").exists()
  # An Orbax checkpoint whose params are not the configured model's: every mismatch named.
  config, _, model_dir = tiny_run
  wider = _model_config_file(tmp_path / "wider.json",
                             network.T5Config(**{
                                 **config.__dict__, "emb_dim": 32
                             }))
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError,
      match=r"token_embedder/embedding has shape \(2000, 16\), the model expects "
      r"\(2000, 32\)"):
    export_hf.export_checkpoint(model_dir, tmp_path / "o", model_config=str(wider))
  with pytest.raises(checkpoint_paths.NotACheckpointError, match="not a checkpoint"):
    export_hf.export_checkpoint(tmp_path, tmp_path / "o", vocab=spm_path)
  assert not (tmp_path / "o").exists()


def test_export_missing_or_wrong_vocabulary(tiny_run, spm_path, tmp_path, capsys):
  config, params, _ = tiny_run
  ckpt = t5x_checkpoint_writer.save_t5x_checkpoint(
      params, tmp_path / "ckpt" / "checkpoint_8", step=8)
  model_config = _model_config_file(tmp_path / "model.json", config)
  out = tmp_path / "out"
  assert export_hf_cli.main([
      "--checkpoint",
      str(ckpt), "--out",
      str(out), "--model_config",
      str(model_config), "--max_new_tokens", "8"
  ]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.rstrip().endswith(
      "pass --vocab (the SentencePiece model the checkpoint was trained with)"), err
  flags = dict(model_config=str(model_config), max_new_tokens=8)
  with pytest.raises(ValueError, match="--vocab .*missing.model: no such file"):
    export_hf.export_checkpoint(ckpt, out, vocab=tmp_path / "missing.model", **flags)
  not_spm = tmp_path / "not_spm.model"
  not_spm.write_text("hello")
  with pytest.raises(ValueError, match="not_spm.model: not a SentencePiece model"):
    export_hf.export_checkpoint(ckpt, out, vocab=not_spm, **flags)
  # A vocabulary bigger than the model's embedding (the 2000-piece one for a 64-row model).
  small_model = tiny_engine.tiny_model(0.0)
  small_params = _random_params(small_model.module.config, seed=0)
  with pytest.raises(ValueError, match="2000 ids, more than the model's 64 embedding rows"):
    export_hf.export_params(
        small_params, small_model.module.config, out, spm_path, max_new_tokens=8)
  assert not out.exists()
  assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no partial folder left


def test_export_output_folder_checks(tiny_run, spm_path, tmp_path):
  config, params, model_dir = tiny_run
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("x")
  with pytest.raises(ValueError, match="exists and is not empty.*--overwrite"):
    export_hf.export_params(params, config, out, spm_path, max_new_tokens=8)
  assert (out / "keep.txt").is_file()
  with pytest.raises(ValueError, match="max_new_tokens 0: expected a positive integer"):
    export_hf.export_params(params, config, out, spm_path, max_new_tokens=0, overwrite=True)
  assert (out / "keep.txt").is_file()
  (out / "keep.txt").unlink()
  export_hf.export_params(params, config, out, spm_path, max_new_tokens=8, overwrite=True)
  assert sorted(p.name for p in out.iterdir()) == sorted(EXPORTED_FILES)
  export_hf.export_params(params, config, out, spm_path, max_new_tokens=9, overwrite=True)
  assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == 9
  step_dir = checkpoint_paths.locate(model_dir)[1]
  with pytest.raises(ValueError, match="must not be, contain or lie inside the checkpoint"):
    export_hf.export_checkpoint(model_dir, step_dir / "hf", vocab=spm_path)
  with pytest.raises(ValueError, match="must not be, contain or lie inside the checkpoint"):
    export_hf.export_checkpoint(model_dir, model_dir, vocab=spm_path, overwrite=True)
  assert (model_dir / "run.json").is_file()
  with pytest.raises(ValueError, match="feed_forward_proj"):
    export_hf.hf_config(network.T5Config(mlp_activations=("gelu", "gelu")))


def test_export_generate_without_arguments_decodes_like_infer(tiny_run, mcwq_dir, small_vocab,
                                                              tmp_path):
  """generation_config.json carries the run's decoding length: a plain `generate(**batch)` (no
  max_length) gives what `mcwq_t5x.infer` gives at the run's target length, not transformers'
  20-token default; the folder and files have ordinary modes."""
  from mcwq_t5x import infer as infer_lib  # pylint: disable=g-import-not-at-top
  _, _, model_dir = tiny_run
  out, length = tmp_path / "hf", 40  # beyond transformers' default of 20
  old_umask = os.umask(0o022)
  try:
    assert export_hf_cli.main(
        ["--checkpoint",
         str(model_dir), "--max_new_tokens",
         str(length), "--out",
         str(out)]) == 0
  finally:
    os.umask(old_umask)
  assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == length
  assert oct(out.stat().st_mode & 0o777) == oct(0o755)
  assert {
      p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()
  } == {
      name: oct(0o644) for name in EXPORTED_FILES
  }
  questions = _texts(mcwq_dir, "txt", "en", 0, 4)
  ours = infer_lib.infer(
      questions,
      model=tiny_engine.tiny_model(0.0, vocab_size=SMALL_VOCAB_ROWS),
      checkpoint_path=str(model_dir),
      vocabulary=small_vocab,
      max_decode_length=length)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  hf = transformers.MT5ForConditionalGeneration.from_pretrained(str(out)).eval()
  batch = tokenizer(questions, return_tensors="pt", padding=True)
  with torch.no_grad():
    generated = hf.generate(**batch)
  assert max(len(small_vocab.encode(p)) for p in ours) > 20  # would be cut at 20 by default
  # Same tokens (decoded with one vocabulary: an 8-step model emits byte pieces, which the two
  # tokenizers render differently when they form no valid UTF-8).
  assert [small_vocab.decode(row[1:]) for row in generated.tolist()] == ours


def test_overwrite_replaces_only_a_previous_export(tiny_run, spm_path, tmp_path):
  """`--overwrite --out <another run's MODEL_DIR>` (or a previous export with a file added) is
  refused naming what is there, exit 1, nothing changed (the run is not deleted)."""
  _, _, model_dir = tiny_run
  other_run = tmp_path / "other_run"
  shutil.copytree(model_dir, other_run)
  before = sorted(str(p.relative_to(other_run)) for p in other_run.rglob("*"))
  out = mains.python_m(
      "mcwq_t5x.export_hf",
      "--checkpoint",
      str(model_dir),
      "--vocab",
      str(spm_path),
      "--overwrite",
      "--out",
      str(other_run),
      check=False)
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"ValueError: {other_run}: --overwrite replaces only a previous "
                         "export"), last
  assert "checkpoint_8/" in last and "run.json" in last and "nothing was changed" in last, last
  assert sorted(str(p.relative_to(other_run)) for p in other_run.rglob("*")) == before
  assert not list(tmp_path.glob(".other_run.tmp-*"))


def test_export_removes_only_the_temporary_folders_of_dead_exports(tiny_run, spm_path, tmp_path):
  """A `kill -9`ed export leaves `.<out>.tmp-<host>-<pid>-*`: the next export to that --out
  removes it when that process is gone, and keeps a live process's and foreign folders."""
  config, params, _ = tiny_run
  out = tmp_path / "hf"
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  host = socket.gethostname()
  stale = tmp_path / f".hf.tmp-{host}-{dead.pid}-abc"
  live = tmp_path / f".hf.tmp-{host}-{os.getppid()}-def"  # why: the test's parent process lives
  foreign = [
      tmp_path / ".hf.tmp-xyz", tmp_path / f".hf.tmp-otherhost-{dead.pid}-x",
      tmp_path / f".hf2.tmp-{host}-{dead.pid}-x"
  ]
  for folder in [stale, live, *foreign]:
    folder.mkdir()
  export_hf.export_params(params, config, out, spm_path, max_new_tokens=8)
  assert not stale.exists() and live.is_dir() and all(f.is_dir() for f in foreign)
  assert sorted(p.name for p in out.iterdir()) == sorted(EXPORTED_FILES)
