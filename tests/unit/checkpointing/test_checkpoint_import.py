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
import re
import shutil

from flax import traverse_util
import jax
import numpy as np
import pytest
import sentencepiece as spm

torch = pytest.importorskip(
    "torch")  # test requirement: parity against an independent implementation
transformers = pytest.importorskip("transformers")

from mcwq_t5x.checkpointing import checkpoint_import as ci
from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import t5x_checkpoint_writer
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
import local_http
import tiny_engine

VOCAB = 256  # model rows; the SentencePiece vocab is smaller (as in mT5)
SP_VOCAB = 160
NUM_EXAMPLES = 6
DECODE_LEN = 24


def _train_sentencepiece(lines, vocab_size):
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines),
      model_writer=proto,
      vocab_size=vocab_size,
      pad_id=0,
      eos_id=1,
      unk_id=2,
      bos_id=-1,
      model_type="unigram",
      character_coverage=1.0,
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
  batch = tiny_engine.feature_batch([sp.encode(questions[i]) + [1] for i in idx],
                                    [sp.encode(rirs[i]) + [1] for i in idx],
                                    weights_dtype=np.float32)
  assert (batch["encoder_input_tokens"] == 0).any() and (batch["decoder_target_tokens"]
                                                         == 0).any(), "batch must contain padding"
  return batch


def _generate(hf, batch, max_new_tokens=DECODE_LEN):
  enc = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)
  with torch.no_grad():
    return hf.generate(
        input_ids=enc,
        attention_mask=(enc > 0).long(),
        max_new_tokens=max_new_tokens,
        num_beams=1,
        do_sample=False,
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0).numpy()


def _build_hf(kind, tmp_path, batch):
  """Random HF model of `kind` ("mt5" or "t5_1_0"), saved under tmp_path.

  Weights are re-drawn at O(1) scale so that greedy outputs depend on the
  input, and the EOS output row is set to 1.1 x the row of a token the model
  emits often, so that some (not all) greedy decodes end with EOS.
  """
  torch.manual_seed(0 if kind == "mt5" else 1)
  hf = tiny_engine.hf_t5(
      kind,
      VOCAB,
      decoder_start_token_id=0,
      eos_token_id=1,
      pad_token_id=0,
      **({} if kind == "mt5" else {
          "relative_attention_max_distance": 24
      }))
  with torch.no_grad():  # O(1) activations, unlike HF's tiny init.
    for name, p in hf.named_parameters():
      if "layer_norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif "relative_attention_bias" in name or name == "shared.weight":
        p.copy_(torch.randn_like(p))
      else:  # Linear [out, in]
        p.copy_(torch.randn_like(p) / p.shape[1]**0.5)
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
  hf, path = _build_hf(request.param, tmp_path_factory.mktemp("hf"), mcwq_batch)
  config = ci.config_from_hf(path / "config.json")
  params = checkpoint_loaders.load_params(path, config).params
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
    theirs = hf(
        input_ids=enc,
        attention_mask=(enc > 0).long(),
        decoder_input_ids=torch.tensor(mcwq_batch["decoder_input_tokens"],
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
  perturbed = np.asarray(
      apply({"params": bad},
            mcwq_batch["encoder_input_tokens"],
            mcwq_batch["decoder_input_tokens"],
            mcwq_batch["decoder_target_tokens"],
            enable_dropout=False))
  assert np.abs(perturbed[valid] - theirs[valid]).max() > 1e-2


def test_greedy_matches_hf_generate(hf_model, mcwq_batch):
  _, hf, _, config, params = hf_model
  model = model_lib.EncoderDecoderModel(network.Transformer(config))
  ours = np.asarray(model.predict_batch(params, mcwq_batch, max_decode_length=DECODE_LEN))
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
  flat_opt = {"encoder": {"encoder_norm": {"scale": {"v": np.ones(config.emb_dim, np.float32)}}}}
  for reference in ("placeholder", "spec"):
    path = tmp_path / f"{kind}_{reference}" / "checkpoint_1000000"
    t5x_checkpoint_writer.save_t5x_checkpoint(
        params, path, step=1000000, reference=reference, optimizer_state=flat_opt)
    assert (path / "checkpoint").is_file()
    assert (path / "target.encoder.layers_0.attention.query.kernel").is_dir()
    assert checkpoint_paths.detect_format(path) == "t5x"
    loaded = checkpoint_loaders.load_params(path, config).params
    flat_a = jax.tree_util.tree_leaves_with_path(params)
    flat_b = dict(jax.tree_util.tree_leaves_with_path(loaded))
    assert len(flat_a) == len(flat_b)
    for key, value in flat_a:
      np.testing.assert_array_equal(flat_b[key], value)


def test_mismatch_names_the_parameter(hf_model, tmp_path):
  kind, _, path, config, params = hf_model
  wider = network.T5Config(**{**config.__dict__, "mlp_dim": 64})
  wi = "wi" if kind == "t5_1_0" else "wi_0"
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError, match=f"encoder/layers_0/mlp/{wi}/kernel"):
    checkpoint_loaders.load_params(path, wider)
  deeper = network.T5Config(**{**config.__dict__, "num_encoder_layers": 3})
  with pytest.raises(checkpoint_paths.CheckpointMismatchError, match="encoder.block.2"):
    checkpoint_loaders.load_params(path, deeper)
  # T5X native: a missing array is named.
  incomplete = jax.tree_util.tree_map(lambda x: x, params)
  del incomplete["decoder"]["decoder_norm"]
  t5x_path = t5x_checkpoint_writer.save_t5x_checkpoint(incomplete, tmp_path / "ckpt")
  with pytest.raises(checkpoint_paths.CheckpointMismatchError, match="decoder/decoder_norm/scale"):
    checkpoint_loaders.load_params(t5x_path, config)
  with pytest.raises(checkpoint_paths.NotACheckpointError, match="not a checkpoint"):
    checkpoint_loaders.load_params(tmp_path, config)


def _copy_hf(path, tmp_path, edit, **config_changes):
  """A copy of the HF folder `path` whose state dict is passed through `edit(dict)` and whose
  config.json gets `config_changes`."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  copy = tmp_path / f"edited_{path.name}"
  copy.mkdir()
  raw = json.loads((path / "config.json").read_text())
  (copy / "config.json").write_text(json.dumps({**raw, **config_changes}))
  state = load_file(str(path / "model.safetensors"))
  save_file(edit(dict(state)), str(copy / "model.safetensors"), metadata={"format": "pt"})
  return copy


def test_missing_hf_tensors_are_all_named(hf_model, tmp_path):
  """A folder without some tensors (an untied one without lm_head.weight too, which must not get
  shared.weight as its output layer): every missing tensor is named, nothing is substituted."""
  kind, _, path, config, params = hf_model
  drop = [
      "lm_head.weight" if kind == "mt5" else "decoder.final_layer_norm.weight",
      "encoder.block.1.layer.1.DenseReluDense.wo.weight"
  ]

  def remove(state):
    for key in drop:
      del state[key]
    return state

  # As transformers 4 / the published mT5 configs write it (transformers 5 writes true).
  edited = _copy_hf(path, tmp_path, remove, tie_word_embeddings=False)
  assert not config.logits_via_embedding or kind == "t5_1_0"
  with pytest.raises(checkpoint_paths.CheckpointMismatchError) as e:
    checkpoint_loaders.load_params(edited, config)
  message = str(e.value)
  assert "2 tensor(s) missing" in message
  for key in drop:
    assert key in message
  assert "encoder/layers_1/mlp/wo/kernel" in message
  if kind == "mt5":
    assert "decoder/logits_dense/kernel" in message


def test_tied_mt5_without_lm_head_loads_as_transformers_does(hf_model, tmp_path):
  """`tie_word_embeddings: true` and no lm_head.weight: transformers ties lm_head to shared
  (unscaled); the import does the same instead of failing."""
  kind, _, path, config, params = hf_model
  if kind != "mt5":  # the tied T5 1.0 layout has no output layer to store
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    assert "lm_head.weight" not in load_file(str(path / "model.safetensors"))
    assert "decoder" in params and "logits_dense" not in params["decoder"]
    return

  def remove(state):
    del state["lm_head.weight"]
    return state

  edited = _copy_hf(path, tmp_path, remove, tie_word_embeddings=True)
  loaded = checkpoint_loaders.load_params(edited, config).params
  np.testing.assert_array_equal(loaded["decoder"]["logits_dense"]["kernel"],
                                params["token_embedder"]["embedding"].T)
  hf = transformers.MT5ForConditionalGeneration.from_pretrained(str(edited))
  np.testing.assert_array_equal(hf.lm_head.weight.detach().numpy(),
                                params["token_embedder"]["embedding"])


def test_unexpected_or_inconsistent_hf_tensors_are_named(hf_model, tmp_path):
  kind, _, path, config, params = hf_model
  # A config with fewer layers than the checkpoint is an error (the extra blocks are not dropped).
  shallower = network.T5Config(**{**config.__dict__, "num_encoder_layers": 1})
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError,
      match=r"tensor\(s\) the model has no parameter for .*encoder\.block\.1\."):
    checkpoint_loaders.load_params(path, shallower)
  # Stored copies of the embedding must equal it; an unknown tensor is named.
  def add(state):
    state["encoder.embed_tokens.weight"] = state["shared.weight"].copy()
    state["decoder.embed_tokens.weight"] = state["shared.weight"] + 1.0
    state["encoder.block.0.layer.0.SelfAttention.extra.weight"] = np.zeros((2, 2), np.float32)
    if kind == "t5_1_0":  # tied: a stored lm_head that is not the embedding
      state["lm_head.weight"] = state["shared.weight"] * 2.0
    return state

  edited = _copy_hf(path, tmp_path, add)
  with pytest.raises(checkpoint_paths.CheckpointMismatchError) as e:
    checkpoint_loaders.load_params(edited, config)
  message = str(e.value)
  assert "encoder.block.0.layer.0.SelfAttention.extra.weight (shape (2, 2))" in message
  assert "decoder.embed_tokens.weight" in message
  assert "encoder.embed_tokens.weight" not in message  # an equal copy is fine
  assert ("lm_head.weight" in message) == (kind == "t5_1_0")

  # Equal copies (as torch .bin files store them) import unchanged.
  def add_equal(state):
    state["encoder.embed_tokens.weight"] = state["shared.weight"].copy()
    state["decoder.embed_tokens.weight"] = state["shared.weight"].copy()
    return state

  (tmp_path / "equal").mkdir()
  loaded = checkpoint_loaders.load_params(_copy_hf(path, tmp_path / "equal", add_equal),
                                          config).params
  np.testing.assert_array_equal(loaded["token_embedder"]["embedding"],
                                params["token_embedder"]["embedding"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_tensors_read_in_row_blocks_equal_the_whole_file(hf_model, tmp_path, monkeypatch, dtype):
  """With 100-byte row blocks (every tensor in several blocks, most ending in a short one), each
  parameter (placed as a float32 jax array) equals `safetensors`' own whole-file read, transposed
  and made float32; an embedding copy differing only in its last row is still named."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  _, _, path, config, params = hf_model
  edited = _copy_hf(
      path, tmp_path, lambda state: {
          k: v.astype(getattr(ml_dtypes, dtype, dtype)) for k, v in state.items()
      })
  monkeypatch.setattr(ci, "_BLOCK_BYTES", 100)
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  loaded = traverse_util.flatten_dict(
      checkpoint_loaders.load_params(edited, config, abstract).params, sep="/")
  state = load_file(str(edited / "model.safetensors"))
  for name, (key, transpose) in ci.hf_name_map(config).items():
    want = np.asarray(state[key], np.float32)
    np.testing.assert_array_equal(np.asarray(loaded[name]), want.T if transpose else want, name)
    assert loaded[name].dtype == np.float32

  def near_copy(state):
    state["encoder.embed_tokens.weight"] = state["shared.weight"].copy()
    state["encoder.embed_tokens.weight"][-1, -1] += 1
    return state

  (tmp_path / "near").mkdir()
  with pytest.raises(checkpoint_paths.CheckpointMismatchError, match="encoder.embed_tokens.weight"):
    checkpoint_loaders.load_params(_copy_hf(edited, tmp_path / "near", near_copy), config)


def test_hf_config_of_another_architecture_is_rejected(tmp_path):
  (tmp_path / "config.json").write_text(
      json.dumps({
          "model_type": "bart",
          "architectures": ["BartForConditionalGeneration"],
          "d_model": 16,
          "vocab_size": 64
      }))
  with pytest.raises(
      ValueError, match=r"model_type 'bart' \(BartForConditionalGeneration\) "
      r"is not a T5/mT5"):
    ci.config_from_hf(tmp_path)
  with pytest.raises(ValueError, match="model_type 'umt5'"):
    ci.config_from_hf({"model_type": "umt5", "d_model": 16})


def test_t5x_missing_chunk_is_an_error(hf_model, tmp_path):
  """A TensorStore array with a deleted chunk file is an error, not zeros in that block."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  kind, _, _, config, params = hf_model
  path = t5x_checkpoint_writer.save_t5x_checkpoint(params, tmp_path / "checkpoint_1")
  # Rewrite one array with 4 chunks, as T5X writes large arrays.
  name = "target.decoder.layers_1.mlp.wo.kernel"
  value = params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"]
  chunks = [(n + 1) // 2 for n in value.shape]
  ts.open({
      "driver": "zarr",
      "kvstore": {
          "driver": "file",
          "path": str(path / name)
      },
      "metadata": {
          "shape": list(value.shape),
          "dtype": "<f4",
          "chunks": chunks,
          "compressor": {
              "id": "gzip"
          }
      },
      "create": True,
      "delete_existing": True
  }).result().write(value).result()
  assert sorted(f.name for f in (path / name).iterdir()) == [".zarray", "0.0", "0.1", "1.0", "1.1"]
  loaded = checkpoint_loaders.load_params(path, config).params  # complete: loads unchanged
  np.testing.assert_array_equal(loaded["decoder"]["layers_1"]["mlp"]["wo"]["kernel"], value)
  (path / name / "1.0").unlink()
  with pytest.raises(
      ci.IncompleteCheckpointError,
      match=rf"array {name} is incomplete, a chunk file is missing.*1\.0"):
    ci.load_t5x_checkpoint(path, config)
  # Named as a checkpoint_<step> folder, the loader says so and names the array.
  with pytest.raises(
      checkpoints.UnreadableCheckpointError,
      match=rf"checkpoint_1 is unreadable.*array {name} is incomplete"):
    checkpoint_loaders.load_params(path, config)
  # A single-chunk array (our writer) without its chunk: named as well.
  path = t5x_checkpoint_writer.save_t5x_checkpoint(
      params, tmp_path / "checkpoint_2", reference="spec")
  single = "target.encoder.layers_0.attention.query.kernel"
  (path / single / "0").unlink() if (path / single / "0").exists() else (path / single /
                                                                         "0.0").unlink()
  with pytest.raises(ci.IncompleteCheckpointError, match=rf"array {single} is incomplete"):
    ci.load_t5x_checkpoint(path)


def test_t5x_array_shape_differs_from_recorded_metadata(hf_model, tmp_path):
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  _, _, _, config, params = hf_model
  path = t5x_checkpoint_writer.save_t5x_checkpoint(
      params, tmp_path / "checkpoint_1", reference="spec")
  name = "target.encoder.encoder_norm.scale"
  ts.open({
      "driver": "zarr",
      "kvstore": {
          "driver": "file",
          "path": str(path / name)
      },
      "metadata": {
          "shape": [3],
          "dtype": "<f4",
          "chunks": [3]
      },
      "create": True,
      "delete_existing": True
  }).result().write(np.ones(3, np.float32)).result()
  with pytest.raises(
      ci.IncompleteCheckpointError,
      match=rf"array {name} has shape \(3,\), the checkpoint recorded "
      rf"\({config.emb_dim},\)"):
    ci.load_t5x_checkpoint(path, config)


def test_arrays_with_a_fill_value_may_omit_chunks(tmp_path):
  """TensorStore's writer skips chunks equal to an explicit fill value: not an error."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  spec = {
      "driver": "zarr",
      "kvstore": {
          "driver": "file",
          "path": str(tmp_path / "a")
      },
      "metadata": {
          "shape": [4, 6],
          "dtype": "<f4",
          "chunks": [2, 3],
          "fill_value": 0
      }
  }
  value = np.zeros((4, 6), np.float32)
  value[0, 0] = 5.0
  ts.open({**spec, "create": True}).result().write(value).result()
  assert sorted(f.name for f in (tmp_path / "a").iterdir()) == [".zarray", "0.0"]
  read = ci._ts_read({"driver": "zarr", "kvstore": spec["kvstore"]}, "a", "target.a")
  np.testing.assert_array_equal(read, value)


# ---------------------------------------------------------------------------
# Checkpoints that name data outside their folder.
# ---------------------------------------------------------------------------
def _tiny_params(seed=0):
  config = tiny_engine.config(vocab_size=32)
  rng = np.random.default_rng(seed)
  flat = {
      k: rng.standard_normal(s).astype(np.float32)
      for k, s in ci.expected_param_shapes(config).items()
  }
  return config, traverse_util.unflatten_dict(flat, sep="/")


def _retarget(folder, name, leaf):
  """Rewrites the msgpack of the T5X-native checkpoint `folder` so that array `name` is `leaf`."""
  from flax import serialization  # pylint: disable=g-import-not-at-top
  msgpack = folder / checkpoint_paths.T5X_MSGPACK_FILE
  tree = serialization.msgpack_restore(msgpack.read_bytes())
  node = tree["target"]
  *parents, last = name.split(".")[1:]
  for p in parents:
    node = node[p]
  node[last] = leaf
  msgpack.write_bytes(serialization.msgpack_serialize(tree))


class _Files(local_http.Handler):
  """Serves the files of `server.root` (a zarr array as TensorStore's http kvstore reads it)."""

  def do_GET(self):  # noqa: N802
    self.server.requests += 1
    f = self.server.root / self.path.lstrip("/")
    if f.is_file():
      self.answer(200, f.read_bytes(), "application/octet-stream")
    else:
      self.answer(404, b"")


NAME = "target.encoder.layers_0.attention.query.kernel"


def test_t5x_arrays_are_read_only_from_local_files_inside_the_folder(tmp_path, local_server):
  """An array spec naming another store (http, memory, an absolute gcs path) or a path outside
  the checkpoint (`..`, an absolute path, a symlink) is refused naming the msgpack file and the
  array; the http server is never contacted. Before the fix each of these loaded (exit 0)."""
  config, params = _tiny_params()
  other = t5x_checkpoint_writer.save_t5x_checkpoint(_tiny_params(1)[1], tmp_path / "other")
  server = local_server(_Files, root=other)
  good = t5x_checkpoint_writer.save_t5x_checkpoint(params, tmp_path / "good", reference="spec")
  np.testing.assert_array_equal(  # a genuine checkpoint still loads
      ci.load_t5x_checkpoint(good, config)["encoder"]["layers_0"]["attention"]["query"]["kernel"],
      params["encoder"]["layers_0"]["attention"]["query"]["kernel"])
  (good / "link").symlink_to(other / NAME)
  zarr = lambda kv: {"driver": "zarr", "kvstore": kv}  # noqa: E731
  bad = {
      "http": zarr({
          "driver": "http",
          "base_url": server.base,
          "path": "/" + NAME
      }),
      "http-url": zarr(f"{server.base}/{NAME}"),
      "memory": zarr({
          "driver": "memory",
          "path": NAME
      }),
      "dotdot": zarr({
          "driver": "file",
          "path": f"../../other/{NAME}"
      }),
      "absolute": zarr({
          "driver": "file",
          "path": str(other / NAME)
      }),
      "gcs-absolute": zarr({
          "driver": "gcs",
          "bucket": "b",
          "path": str(other / NAME)
      }),
      "symlink": zarr({
          "driver": "file",
          "path": "link"
      }),
      "placeholder": checkpoint_paths.T5X_PLACEHOLDER + f"../../other/{NAME}",
      "ocdbt-outside": zarr({
          "driver": "ocdbt",
          "base": str(other),
          "path": NAME
      }),
      "array-driver": {
          "driver": "array",
          "kvstore": {},
          "array": [1.0]
      },
  }
  for case, leaf in bad.items():
    folder = tmp_path / case / "checkpoint_2"
    shutil.copytree(good, folder, symlinks=True)
    _retarget(folder, NAME, leaf)
    with pytest.raises(checkpoint_paths.CheckpointOutsideFolderError) as e:
      ci.load_t5x_checkpoint(folder, config)
    assert str(e.value).startswith(f"{folder / 'checkpoint'}: array {NAME}"), (case, e.value)
    # In a MODEL_DIR the loader neither reads it nor falls back to the older checkpoint_1.
    shutil.copytree(good, folder.parent / "checkpoint_1", symlinks=True)
    with pytest.raises(checkpoint_paths.CheckpointOutsideFolderError, match=NAME):
      checkpoint_loaders.load_params(folder.parent, config)
  assert server.requests == 0


def test_t5x_checkpoint_in_a_bucket_is_read_only_from_its_folder(tmp_path, local_gcs, local_server):
  """A T5X-native checkpoint in a bucket of the stand-in (`gs://`, as mT5's under gs://t5-data/):
  both reference styles and a T5X `gcs` spec that names another bucket load every parameter from
  the folder given (the other bucket is never asked). An array naming another store (http,
  memory) or leaving the folder (`..`, the bucket's root, ocdbt) is refused naming the msgpack
  object and the array, and nothing outside the folder is read. A Hugging Face folder in a bucket
  is refused naming it. Before, every `gs://` path was read as the local folder `gs:/...`."""
  config, params = _tiny_params()
  bucket = local_gcs.root / "models"
  other = t5x_checkpoint_writer.save_t5x_checkpoint(_tiny_params(1)[1], bucket / "other")
  http = local_server(_Files, root=other)
  for reference in ("placeholder", "spec"):
    t5x_checkpoint_writer.save_t5x_checkpoint(
        params, bucket / reference / "checkpoint_3", reference=reference, step=3)
  shutil.copytree(bucket / "spec", bucket / "named-bucket")
  _retarget(bucket / "named-bucket" / "checkpoint_3", NAME, {
      "driver": "zarr",
      "kvstore": {
          "driver": "gcs",
          "bucket": "elsewhere",
          "path": NAME
      }
  })
  expected = traverse_util.flatten_dict(params, sep="/")
  for case in ("placeholder", "spec", "named-bucket"):
    url = f"gs://models/{case}/checkpoint_3"
    assert checkpoint_paths.locate(url) == ("t5x", checkpoint_paths.as_path(url))
    loaded = checkpoint_loaders.load_params(url, config)
    assert (loaded.step, str(loaded.directory)) == (3, f"gs://models/{case}")
    got = traverse_util.flatten_dict(loaded.params, sep="/")
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
      np.testing.assert_array_equal(got[name], value)
  assert not [p for p in local_gcs.seen if "elsewhere" in p or "other" in p]
  zarr = lambda kv: {"driver": "zarr", "kvstore": kv}  # noqa: E731
  bad = {
      "http": zarr({
          "driver": "http",
          "base_url": http.base,
          "path": "/" + NAME
      }),
      "memory": zarr({
          "driver": "memory",
          "path": NAME
      }),
      "dotdot": zarr({
          "driver": "gcs",
          "bucket": "models",
          "path": f"../../other/{NAME}"
      }),
      "bucket-root": zarr({
          "driver": "file",
          "path": f"/other/{NAME}"
      }),
      "placeholder-dotdot": checkpoint_paths.T5X_PLACEHOLDER + f"../../other/{NAME}",
      "ocdbt-outside": zarr({
          "driver": "ocdbt",
          "base": "../../other",
          "path": NAME
      }),
  }
  for case, leaf in bad.items():
    folder = bucket / case / "checkpoint_3"
    shutil.copytree(bucket / "spec" / "checkpoint_3", folder)
    _retarget(folder, NAME, leaf)
    with pytest.raises(checkpoint_paths.CheckpointOutsideFolderError) as e:
      checkpoint_loaders.load_params(f"gs://models/{case}/checkpoint_3", config)
    assert str(
        e.value).startswith(f"gs://models/{case}/checkpoint_3/checkpoint: array {NAME}"), (case,
                                                                                           e.value)
  assert http.requests == 0
  assert not [p for p in local_gcs.seen if "other" in p], local_gcs.seen
  (bucket / "hf").mkdir()
  (bucket / "hf" / "config.json").write_text("{}")
  (bucket / "hf" / "model.safetensors").write_bytes(b"")  # refused before it is read
  with pytest.raises(
      checkpoint_paths.UnreadableCheckpointFileError,
      match=r"^gs://models/hf: a Hugging Face folder is read from local files only"):
    checkpoint_loaders.load_params("gs://models/hf", config)


def test_hf_shards_are_read_only_from_inside_the_folder(tmp_path):
  """`model.safetensors.index.json` entries naming `../other/...`, an absolute path or a symlink
  out of the folder are refused naming the index and the entry; a hub snapshot's links into its
  repository's blobs/ load."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  hf = tiny_engine.hf_t5("mt5", 32)
  hf.save_pretrained(str(tmp_path / "hf"))
  config = ci.config_from_hf(tmp_path / "hf")
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  (tmp_path / "other").mkdir()
  save_file(state, str(tmp_path / "other" / "model.safetensors"))
  for case, entry in (("dotdot", "../other/model.safetensors"), ("passwd", "/etc/passwd"),
                      ("symlink", "link.safetensors")):
    folder = tmp_path / case
    folder.mkdir()
    shutil.copy(tmp_path / "hf" / "config.json", folder)
    (folder / "link.safetensors").symlink_to(tmp_path / "other" / "model.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"shared.weight": entry}}))
    with pytest.raises(
        checkpoint_paths.CheckpointOutsideFolderError,
        match=rf"^{re.escape(str(index))}: entry '{re.escape(entry)}' resolves to"):
      checkpoint_loaders.load_params(folder, config)
  # The Hugging Face hub cache: snapshots/<revision>/model.safetensors -> ../../blobs/<hash>.
  repo = tmp_path / "models--tiny"
  (repo / "blobs").mkdir(parents=True)
  snapshot = repo / "snapshots" / "abc"
  snapshot.mkdir(parents=True)
  shutil.copy(tmp_path / "hf" / "model.safetensors", repo / "blobs" / "123")
  shutil.copy(tmp_path / "hf" / "config.json", snapshot)
  (snapshot / "model.safetensors").symlink_to("../../blobs/123")
  loaded = checkpoint_loaders.load_params(snapshot, config).params
  np.testing.assert_array_equal(loaded["token_embedder"]["embedding"], state["shared.weight"])


def test_malformed_hf_weights_are_one_error_naming_the_file(tmp_path):
  """A malformed safetensors file, index or pickle: UnreadableCheckpointFileError naming it."""
  hf = tiny_engine.hf_t5("mt5", 32)
  hf.save_pretrained(str(tmp_path / "hf"))
  config = ci.config_from_hf(tmp_path / "hf")
  cases = {
      "model.safetensors": b"not a safetensors file",
      "model.safetensors.index.json": b"{\"weight_map\": [1]}",
      "pytorch_model.bin": b"\x80\x04not a pickle"
  }
  for name, data in cases.items():
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(tmp_path / "hf" / "config.json", folder)
    (folder / name).write_bytes(data)
    with pytest.raises(
        checkpoint_paths.UnreadableCheckpointFileError,
        match=rf"^{re.escape(str(folder / name))}: cannot read") as e:
      checkpoint_loaders.load_params(folder, config)
    assert "\n" not in str(e.value)
