"""Checkpoint import: parity with Hugging Face T5/mT5 and the T5X-native layout.

A tiny random `MT5ForConditionalGeneration` (gated GELU, untied output layer)
and a T5 1.0-style `T5ForConditionalGeneration` (ReLU, tied and scaled output
layer) are built with transformers on the CPU, saved with `save_pretrained`
(safetensors), imported, and compared on real MCWQ questions / RIR targets
from ../shared (tokenised with a SentencePiece model trained here on a few
hundred MCWQ lines): logits to 1e-4 (float32, padded batch) and greedy
decoding token for token against `generate(num_beams=1, do_sample=False)`.
"""
import io
import json

import jax
import numpy as np
import pytest
import sentencepiece as spm
import torch  # test requirement: parity against an independent implementation
import transformers

from mcwq_t5x import checkpoint_import as ci
from mcwq_t5x import model as model_lib
from mcwq_t5x import network


VOCAB = 256  # model rows; the SentencePiece vocab is smaller (as in mT5)
SP_VOCAB = 160
NUM_EXAMPLES = 6
DECODE_LEN = 24


def _train_sentencepiece(lines, vocab_size):
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=proto,
      vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      model_type="unigram", character_coverage=1.0,
      minloglevel=2)
  return spm.SentencePieceProcessor(model_proto=proto.getvalue())


@pytest.fixture(scope="module")
def mcwq_batch(mcwq_dir):
  """Padded batch of the first dev questions -> RIR targets (mcd1, en)."""
  base = mcwq_dir / "translations" / "mcd1"
  questions = (base / "dev.en.txt").read_text().splitlines()[:400]
  rirs = (base / "dev.en.sparql").read_text().splitlines()[:400]
  sp = _train_sentencepiece(questions + rirs, SP_VOCAB)
  # Mix short and long questions so that the batch has padding.
  idx = [0, 1, 2, 10, 25, 40][:NUM_EXAMPLES]
  inputs = [sp.encode(questions[i]) + [1] for i in idx]
  targets = [sp.encode(rirs[i]) + [1] for i in idx]
  in_len = max(map(len, inputs))
  tgt_len = max(map(len, targets))
  enc = np.zeros((len(idx), in_len), np.int32)
  tgt = np.zeros((len(idx), tgt_len), np.int32)
  for i, (a, b) in enumerate(zip(inputs, targets)):
    enc[i, :len(a)] = a
    tgt[i, :len(b)] = b
  dec = np.concatenate([np.zeros((len(idx), 1), np.int32), tgt[:, :-1]], 1)
  assert (enc == 0).any() and (tgt == 0).any(), "batch must contain padding"
  return dict(encoder_input_tokens=enc, decoder_input_tokens=dec,
              decoder_target_tokens=tgt,
              decoder_loss_weights=(tgt > 0).astype(np.float32))


def _generate(hf, batch, max_new_tokens=DECODE_LEN):
  enc = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)
  with torch.no_grad():
    return hf.generate(input_ids=enc, attention_mask=(enc > 0).long(),
                       max_new_tokens=max_new_tokens, num_beams=1,
                       do_sample=False, decoder_start_token_id=0,
                       eos_token_id=1, pad_token_id=0).numpy()


def _build_hf(kind, tmp_path, batch):
  """Random HF model of `kind` ("mt5" or "t5_1_0"), saved under tmp_path.

  Weights are re-drawn at O(1) scale so that greedy outputs depend on the
  input, and the EOS output row is set to 1.1 x the row of a token the model
  emits often, so that some (not all) greedy decodes end with EOS.
  """
  torch.manual_seed(0 if kind == "mt5" else 1)
  common = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
                decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
  if kind == "mt5":
    cfg = transformers.MT5Config(feed_forward_proj="gated-gelu",
                                 tie_word_embeddings=False, **common)
    hf = transformers.MT5ForConditionalGeneration(cfg)
    # A separate output layer (transformers re-ties it at construction).
    hf.lm_head.weight = torch.nn.Parameter(torch.empty(VOCAB, 32))
  else:
    cfg = transformers.T5Config(feed_forward_proj="relu",
                                tie_word_embeddings=True,
                                relative_attention_max_distance=24, **common)
    hf = transformers.T5ForConditionalGeneration(cfg)
  with torch.no_grad():  # O(1) activations, unlike HF's tiny init.
    for name, p in hf.named_parameters():
      if "layer_norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif "relative_attention_bias" in name or name == "shared.weight":
        p.copy_(torch.randn_like(p))
      else:  # Linear [out, in]
        p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    out = hf.lm_head.weight if kind == "mt5" else hf.shared.weight
    out[0] *= 0.1  # the tied model would otherwise copy its BOS/pad input.
    hf.eval()
    tokens = _generate(hf, batch)[:, 3:]
    counts = np.bincount(tokens.ravel(), minlength=VOCAB)
    counts[:2] = 0
    out[1] = 1.1 * out[int(np.argmax(counts))]
  hf.eval()
  path = tmp_path / kind
  hf.save_pretrained(str(path))
  return hf, path


@pytest.fixture(scope="module", params=["mt5", "t5_1_0"])
def hf_model(request, tmp_path_factory, mcwq_batch):
  hf, path = _build_hf(request.param, tmp_path_factory.mktemp("hf"),
                       mcwq_batch)
  config = ci.config_from_hf(path / "config.json")
  params = ci.load_pretrained(path, config)
  return request.param, hf, path, config, params


def test_config_from_hf(hf_model):
  kind, _, path, config, _ = hf_model
  raw = json.loads((path / "config.json").read_text())
  assert config.emb_dim == raw["d_model"] == 32
  assert config.head_dim == 8 and config.num_heads == 4
  assert config.mlp_dim == 48 and config.vocab_size == VOCAB
  if kind == "mt5":
    assert config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding
    assert config.relative_attention_max_distance == 128
  else:
    assert config.mlp_activations == ("relu",)
    assert config.logits_via_embedding
    assert config.relative_attention_max_distance == 24


def test_logits_match_hf(hf_model, mcwq_batch):
  kind, hf, _, config, params = hf_model
  module = network.Transformer(config)
  apply = jax.jit(module.apply, static_argnames="enable_dropout")
  ours = apply({"params": params},
                      mcwq_batch["encoder_input_tokens"],
                      mcwq_batch["decoder_input_tokens"],
                      mcwq_batch["decoder_target_tokens"],
                      enable_dropout=False)
  enc = torch.tensor(mcwq_batch["encoder_input_tokens"], dtype=torch.long)
  with torch.no_grad():
    theirs = hf(input_ids=enc, attention_mask=(enc > 0).long(),
                decoder_input_ids=torch.tensor(
                    mcwq_batch["decoder_input_tokens"],
                    dtype=torch.long)).logits.numpy()
  valid = mcwq_batch["decoder_target_tokens"] > 0
  ours = np.asarray(ours)
  assert ours.shape == theirs.shape
  assert np.abs(theirs).max() > 1.0, "logits too small to be a useful test"
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4, rtol=0)
  # The weights were really used: a perturbed import no longer matches.
  bad = jax.tree_util.tree_map(lambda x: x, params)
  bad["decoder"]["layers_1"]["mlp"]["wo"]["kernel"] = (
      bad["decoder"]["layers_1"]["mlp"]["wo"]["kernel"] * 1.5)
  perturbed = np.asarray(apply(
      {"params": bad}, mcwq_batch["encoder_input_tokens"],
      mcwq_batch["decoder_input_tokens"], mcwq_batch["decoder_target_tokens"],
      enable_dropout=False))
  assert np.abs(perturbed[valid] - theirs[valid]).max() > 1e-2


def test_greedy_matches_hf_generate(hf_model, mcwq_batch):
  _, hf, _, config, params = hf_model
  model = model_lib.EncoderDecoderModel(network.Transformer(config))
  ours = np.asarray(model.predict_batch(params, mcwq_batch,
                                        max_decode_length=DECODE_LEN))
  theirs = _generate(hf, mcwq_batch)
  assert (theirs[:, 0] == 0).all()
  theirs = theirs[:, 1:]  # drop the decoder start token
  padded = np.zeros_like(ours)
  padded[:, :theirs.shape[1]] = theirs
  np.testing.assert_array_equal(ours, padded)
  # Some rows stop at EOS before the limit, some do not: both paths tested.
  ended = (ours == 1).any(axis=1)
  assert ended.any()
  assert (ours[:, -1] == 0).any()


def test_t5x_native_round_trip(hf_model, tmp_path):
  kind, _, _, config, params = hf_model
  flat_opt = {"encoder": {"encoder_norm": {"scale": {
      "v": np.ones(config.emb_dim, np.float32)}}}}
  for reference in ("placeholder", "spec"):
    path = tmp_path / f"{kind}_{reference}" / "checkpoint_1000000"
    ci.save_t5x_checkpoint(params, path, step=1000000, reference=reference,
                           optimizer_state=flat_opt)
    assert (path / "checkpoint").is_file()
    assert (path / "target.encoder.layers_0.attention.query.kernel").is_dir()
    assert ci.detect_format(path) == "t5x"
    loaded = ci.load_pretrained(path, config)
    flat_a = jax.tree_util.tree_leaves_with_path(params)
    flat_b = dict(jax.tree_util.tree_leaves_with_path(loaded))
    assert len(flat_a) == len(flat_b)
    for key, value in flat_a:
      np.testing.assert_array_equal(flat_b[key], value)


def test_mismatch_names_the_parameter(hf_model, tmp_path):
  kind, _, path, config, params = hf_model
  wider = network.T5Config(**{**config.__dict__, "mlp_dim": 64})
  wi = "wi" if kind == "t5_1_0" else "wi_0"
  with pytest.raises(ci.CheckpointMismatchError,
                     match=f"encoder/layers_0/mlp/{wi}/kernel"):
    ci.load_pretrained(path, wider)
  deeper = network.T5Config(**{**config.__dict__, "num_encoder_layers": 3})
  with pytest.raises(ci.CheckpointMismatchError, match="encoder.block.2"):
    ci.load_pretrained(path, deeper)
  # T5X native: a missing array is named.
  incomplete = jax.tree_util.tree_map(lambda x: x, params)
  del incomplete["decoder"]["decoder_norm"]
  t5x_path = ci.save_t5x_checkpoint(incomplete, tmp_path / "ckpt")
  with pytest.raises(ci.CheckpointMismatchError,
                     match="decoder/decoder_norm/scale"):
    ci.load_pretrained(t5x_path, config)
  with pytest.raises(ValueError, match="not a checkpoint"):
    ci.load_pretrained(tmp_path, config)
