"""Tests of the T5/mT5 Flax network (mcwq_t5x.engine.network).

Inputs are real MCWQ questions and RIR targets from ../shared, as byte-level
ids (byte + 3, as ByT5; 0 = PAD, 1 = EOS).
"""
import dataclasses
import functools

import flax
import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.engine import network
from mcwq_t5x.engine import remat
import tiny_engine

VOCAB = 259
CFG = tiny_engine.config(VOCAB, layers=2, emb_dim=32, mlp_dim=48, dropout_rate=0.1)


def _bytes(text, max_len):
  return [b + 3 for b in text.encode("utf-8")][:max_len - 1] + [1]


@pytest.fixture(scope="module")
def batch(mcwq_dir):
  base = mcwq_dir / "translations" / "mcd1"
  questions = (base / "dev.en.txt").read_text().splitlines()[:3]
  rirs = (base / "dev.en.sparql").read_text().splitlines()[:3]
  enc = np.zeros((3, 48), np.int32)
  tgt = np.zeros((3, 40), np.int32)
  for i, (q, r) in enumerate(zip(questions, rirs)):
    a = _bytes(q, 48 - 6 * i)  # different lengths -> padding
    b = _bytes(r, 40 - 7 * i)
    enc[i, :len(a)] = a
    tgt[i, :len(b)] = b
  dec = np.concatenate([np.zeros((3, 1), np.int32), tgt[:, :-1]], 1)
  return enc, dec, tgt


@pytest.fixture(scope="module")
def params(batch):
  enc, dec, tgt = batch
  init = jax.jit(network.Transformer(CFG).init, static_argnames=("enable_dropout",))
  return init(jax.random.PRNGKey(0), enc, dec, tgt, enable_dropout=False)


@functools.lru_cache(maxsize=None)
def _apply_fn(cfg):
  return jax.jit(
      network.Transformer(cfg).apply, static_argnames=("enable_dropout", "capture_intermediates"))


def _logits(cfg, params, enc, dec, tgt, **kw):
  return np.asarray(_apply_fn(cfg)({"params": params}, enc, dec, tgt, **kw))


def test_param_tree_names_shapes_and_logical_axes(params):
  flat = traverse_util.flatten_dict(nn.unbox(params["params"]), sep="/")
  specs = traverse_util.flatten_dict(nn.get_partition_spec(params)["params"], sep="/")
  e, j, m = CFG.emb_dim, CFG.num_heads * CFG.head_dim, CFG.mlp_dim
  expected = {
      "token_embedder/embedding": ((VOCAB, e), ("vocab", "embed")),
      "encoder/relpos_bias/rel_embedding": ((2, 32), ("heads", "relpos_buckets")),
      "decoder/relpos_bias/rel_embedding": ((2, 32), ("heads", "relpos_buckets")),
      "encoder/encoder_norm/scale": ((e,), ("embed",)),
      "decoder/decoder_norm/scale": ((e,), ("embed",)),
      "decoder/logits_dense/kernel": ((e, VOCAB), ("embed", "vocab")),
  }
  attn = {
      "query": ((e, j), ("embed", "joined_kv")),
      "key": ((e, j), ("embed", "joined_kv")),
      "value": ((e, j), ("embed", "joined_kv")),
      "out": ((j, e), ("joined_kv", "embed"))
  }
  mlp = {
      "wi_0": ((e, m), ("embed", "mlp")),
      "wi_1": ((e, m), ("embed", "mlp")),
      "wo": ((m, e), ("mlp", "embed"))
  }
  for i in range(2):
    for stack, attns, norms in (("encoder", ["attention"], ["pre_attention_layer_norm"]),
                                ("decoder", ["self_attention", "encoder_decoder_attention"], [
                                    "pre_self_attention_layer_norm",
                                    "pre_cross_attention_layer_norm"
                                ])):
      pre = f"{stack}/layers_{i}"
      for a in attns:
        for k, v in attn.items():
          expected[f"{pre}/{a}/{k}/kernel"] = v
      for k, v in mlp.items():
        expected[f"{pre}/mlp/{k}/kernel"] = v
      for n in norms + ["pre_mlp_layer_norm"]:
        expected[f"{pre}/{n}/scale"] = ((e,), ("embed",))
  assert sorted(flat) == sorted(expected)
  for name, (shape, axes) in expected.items():
    assert flat[name].shape == shape, name
    assert flat[name].dtype == jnp.float32, name
    assert tuple(specs[name]) == axes, name


def test_params_of_another_shape_are_refused_with_their_name(params, batch):
  """A parameter whose shape is not the network's is refused at trace time, naming it (Flax's
  `ScopeParamShapeError`, from the shape check that replaces Flax's trace of the initializer)."""
  enc, dec, tgt = batch
  bad = jax.tree_util.tree_map(lambda x: x, nn.unbox(params["params"]))
  bad["decoder"]["logits_dense"]["kernel"] = jnp.zeros((CFG.emb_dim, VOCAB + 1))
  with pytest.raises(flax.errors.ScopeParamShapeError, match=r"kernel.*/decoder/logits_dense"):
    jax.eval_shape(
        functools.partial(network.Transformer(CFG).apply, enable_dropout=False), {"params": bad},
        enc, dec, tgt)


def test_t5_1_0_variant_has_single_wi_and_tied_logits(batch):
  enc, dec, tgt = batch
  cfg = dataclasses.replace(CFG, mlp_activations=("relu",), logits_via_embedding=True)
  # why: the initialisation traced, not compiled: its tree is what is checked; the logits below
  # hold for any values
  variables = jax.eval_shape(
      lambda r: network.Transformer(cfg).init(r, enc, dec, tgt, enable_dropout=False),
      jax.random.PRNGKey(0))
  flat = traverse_util.flatten_dict(nn.unbox(variables["params"]), sep="/")
  assert "encoder/layers_0/mlp/wi/kernel" in flat
  assert not any("wi_0" in k or "logits_dense" in k for k in flat)
  # Tied logits = final decoder state @ embedding.T / sqrt(emb_dim).
  rng = np.random.default_rng(0)
  p = jax.tree_util.tree_map(lambda s: (0.5 * rng.standard_normal(s.shape)).astype(s.dtype),
                             nn.unbox(variables["params"]))
  logits, state = _apply_fn(cfg)({
      "params": p
  },
                                 enc,
                                 dec,
                                 tgt,
                                 enable_dropout=False,
                                 capture_intermediates=True)
  normed = state["intermediates"]["decoder"]["decoder_norm"]["__call__"][0]
  expected = normed @ p["token_embedder"]["embedding"].T / np.sqrt(32)
  np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)


def test_preset_sizes_match_published_parameter_counts():
  # Counts of the Hugging Face / T5X checkpoints (google/mt5-small: 300M,
  # mt5-base: 582M, mt5-large: 1.23B, t5-base: 223M).
  counts = {
      name: sum(int(np.prod(s)) for s in checkpoint_import.expected_param_shapes(cfg).values())
      for name, cfg in network.CONFIGS.items()
  }
  assert counts["mt5_small"] == 300_176_768
  assert counts["mt5_base"] == 582_401_280
  assert counts["mt5_large"] == 1_229_581_312
  assert counts["t5_base"] == 222_903_552
  assert network.get_config("tiny", vocab_size=300).vocab_size == 300
  with pytest.raises(KeyError, match="unknown model config"):
    network.get_config("mt5_huge")
  with pytest.raises(ValueError, match="mlp_activations"):
    network.T5Config(mlp_activations=("swish",))


def test_relative_position_buckets():
  # Hand-computed from Raffel et al. (2020) / T5X's formula (32 buckets,
  # max distance 128): bidirectional = 16 buckets per direction, exact up to 8.
  rel = jnp.array([0, -1, 1, -7, -8, -16, -127, -500, 8, 16, 500])
  got = network.relative_position_bucket(rel, True, 32, 128)
  np.testing.assert_array_equal(got, [0, 1, 17, 7, 8, 10, 15, 15, 24, 26, 31])
  # Causal: future positions share bucket 0; exact up to 16.
  rel = jnp.array([5, 0, -5, -15, -16, -32, -64, -127, -1000])
  got = network.relative_position_bucket(rel, False, 32, 128)
  np.testing.assert_array_equal(got, [0, 0, 5, 15, 16, 21, 26, 31, 31])


def test_encoder_bias_is_bidirectional_and_the_decoders_causal(params, batch):
  """Each stack reads its own relative position table with its own bucketing (T5: the encoder's
  buckets are bidirectional, the decoder's causal); a decoder bucketing its table
  bidirectionally passes the mask tests above, since the causal mask hides the future anyway."""
  calls = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, network.RelativePositionBiases):
      calls.append((context.module.scope.path[0],
                    args[2] if len(args) > 2 else kwargs.get("bidirectional", True)))
    return next_fun(*args, **kwargs)

  enc, dec, tgt = batch
  # why: traced, not run op by op: the calls are recorded as the network is traced
  with nn.intercept_methods(record):
    jax.eval_shape(
        lambda p: network.Transformer(CFG).apply({"params": p}, enc, dec, tgt, enable_dropout=False
                                                ), nn.unbox(params["params"]))
  # why a list, not a set: once per stack, shared by its layers (T5), not once per layer
  assert sorted(calls) == [("decoder", False), ("encoder", True)], calls


def test_decoder_is_causal_and_padding_is_ignored(params, batch):
  enc, dec, tgt = batch
  p = nn.unbox(params["params"])
  base = _logits(CFG, p, enc, dec, tgt, enable_dropout=False)
  # Changing decoder input 20 changes logits from 20 on, never before.
  dec2, tgt2 = dec.copy(), tgt.copy()
  dec2[:, 20] = 50
  tgt2[:, 19] = 50
  changed = _logits(CFG, p, enc, dec2, tgt2, enable_dropout=False)
  np.testing.assert_allclose(changed[0, :20], base[0, :20], atol=1e-5)
  assert np.abs(changed[0, 20:] - base[0, 20:]).max() > 1e-3
  # Extra padding on both sides does not change the valid logits.
  pad = lambda x, n: np.pad(x, ((0, 0), (0, n)))
  longer = _logits(CFG, p, pad(enc, 9), pad(dec, 5), pad(tgt, 5), enable_dropout=False)
  valid = tgt > 0
  np.testing.assert_allclose(longer[:, :40][valid], base[valid], atol=1e-5)
  # A different encoder input changes the output (cross-attention is used).
  other = _logits(CFG, p, enc[::-1], dec, tgt, enable_dropout=False)
  assert np.abs(other[0] - base[0]).max() > 1e-3


def test_cached_decoding_matches_teacher_forcing(params, batch):
  enc, dec, tgt = batch
  p = nn.unbox(params["params"])
  module = network.Transformer(CFG)
  full = _logits(CFG, p, enc, dec, tgt, enable_dropout=False)
  length = dec.shape[1]
  cache = jax.eval_shape(lambda: module.apply(
      {"params": p}, enc, dec, dec, decode=True, enable_dropout=False, mutable=["cache"])[1]["cache"
                                                                                            ])
  cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), cache)
  assert cache["decoder"]["layers_0"]["self_attention"]["cached_key"].shape \
      == (3, CFG.num_heads, CFG.head_dim, length)
  encoded = jax.jit(
      lambda e: module.apply({"params": p}, e, enable_dropout=False, method=module.encode))(
          enc)

  @jax.jit
  def step(cache, ids):
    logits, new = module.apply({
        "params": p,
        "cache": cache
    },
                               encoded,
                               enc,
                               ids,
                               ids,
                               enable_dropout=False,
                               decode=True,
                               max_decode_length=length,
                               mutable=["cache"],
                               method=module.decode)
    return logits[:, 0], new["cache"]

  steps = []
  for i in range(length):
    logits, cache = step(cache, dec[:, i:i + 1])
    steps.append(np.asarray(logits))
  steps = np.stack(steps, axis=1)
  valid = tgt > 0
  np.testing.assert_allclose(steps[valid], full[valid], atol=1e-4)
  with pytest.raises(ValueError, match="cache"):
    step(cache, dec[:, :2])


def test_precomputed_cross_attention_kv(params, batch):
  """`cross_kv` from `cross_attention_kv` gives the logits of projecting `encoded` each time."""
  enc, dec, tgt = batch
  p = nn.unbox(params["params"])
  module = network.Transformer(CFG)
  # why: each step jitted (a few programs), not run op by op
  encoded = jax.jit(
      lambda q: module.apply({"params": q}, enc, enable_dropout=False, method=module.encode))(
          p)
  cross_kv = jax.jit(lambda q, x: network.cross_attention_kv(CFG, q, x))(p, encoded)
  assert len(cross_kv) == CFG.num_decoder_layers
  assert cross_kv[0][0].shape == (enc.shape[0], CFG.num_heads, CFG.head_dim, enc.shape[1])
  decode = jax.jit(lambda q, kw: module.apply(
      {"params": q}, encoded, enc, dec, tgt, enable_dropout=False, method=module.decode, **kw))
  np.testing.assert_allclose(decode(p, {"cross_kv": cross_kv}), decode(p, {}), atol=1e-5)
  with pytest.raises(ValueError, match="precomputed_kv"):  # why: traced: the check is Python's
    jax.eval_shape(lambda: network.MultiHeadDotProductAttention(CFG.num_heads, CFG.head_dim).init(
        jax.random.PRNGKey(0),
        jnp.ones((2, 1, 8)),
        jnp.ones((2, 3, 8)),
        decode=True,
        precomputed_kv=cross_kv[0]))


def test_dropout_and_bfloat16(params, batch):
  enc, dec, tgt = batch
  p = nn.unbox(params["params"])
  base = _logits(CFG, p, enc, dec, tgt, enable_dropout=False)
  apply = _apply_fn(CFG)
  d1 = apply({"params": p},
             enc,
             dec,
             tgt,
             enable_dropout=True,
             rngs={"dropout": jax.random.PRNGKey(1)})
  d2 = apply({"params": p},
             enc,
             dec,
             tgt,
             enable_dropout=True,
             rngs={"dropout": jax.random.PRNGKey(2)})
  assert np.abs(np.asarray(d1) - base).max() > 1e-3
  assert np.abs(np.asarray(d1) - np.asarray(d2)).max() > 1e-3
  bf16 = _logits(dataclasses.replace(CFG, dtype="bfloat16"), p, enc, dec, tgt, enable_dropout=False)
  assert bf16.dtype == np.float32
  valid = tgt > 0
  scale = np.abs(base[valid]).max()
  assert np.abs(bf16[valid] - base[valid]).max() < 0.1 * scale
  assert np.abs(bf16[valid] - base[valid]).max() > 0  # really ran in bf16


def test_sharded_apply_matches_single_device(params, batch):
  """Logical constraints shard activations on a 4x2 mesh; results unchanged."""
  enc, dec, tgt = batch
  enc, dec, tgt = (np.concatenate([x, x[:1]], 0) for x in (enc, dec, tgt))
  p = nn.unbox(params["params"])
  base = _logits(CFG, p, enc, dec, tgt, enable_dropout=False)
  devices = np.array(jax.devices()[:8]).reshape(4, 2)
  mesh = jax.sharding.Mesh(devices, ("data", "model"))
  rules = (("batch", "data"), ("heads", "model"), ("mlp", "model"), ("vocab", "model"),
           ("joined_kv", "model"), ("kv", None), ("embed", None), ("length",
                                                                   None), ("relpos_buckets", None))
  module = network.Transformer(CFG)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    out = jax.jit(lambda p_, a, b, c: module.apply({"params": p_}, a, b, c, enable_dropout=False))(
        p, enc, dec, tgt)
  np.testing.assert_allclose(np.asarray(out), base, atol=1e-5)


@pytest.mark.parametrize("dtype,float32_logits", [("float16", True), ("float16", False),
                                                  ("bfloat16", True)])
def test_half_precision_padded_batch_has_finite_loss_and_logits(params, batch, dtype,
                                                                float32_logits):
  """In float16 a -1e10 mask bias overflows to -inf, which would give NaN logits at padding
  queries (all keys masked) and a NaN loss at step 0: the bias must fit the dtype."""
  from mcwq_t5x.engine import model as model_lib  # pylint: disable=g-import-not-at-top
  enc, dec, tgt = batch
  assert (enc == 0).any() and (tgt == 0).any()  # the batch is padded
  p = nn.unbox(params["params"])
  base = _logits(CFG, p, enc, dec, tgt, enable_dropout=False)
  cfg = dataclasses.replace(CFG, dtype=dtype, float32_attention_logits=float32_logits)
  half = _logits(cfg, p, enc, dec, tgt, enable_dropout=False)
  assert np.isfinite(half).all()  # padded positions included
  valid = tgt > 0
  err = np.abs(half[valid] - base[valid]).max()
  assert 0 < err < 0.05 * np.abs(base[valid]).max(), err
  full_batch = {
      "encoder_input_tokens": enc,
      "decoder_input_tokens": dec,
      "decoder_target_tokens": tgt,
      "decoder_loss_weights": valid.astype(np.float32)
  }
  model = model_lib.EncoderDecoderModel(network.Transformer(cfg), z_loss=0.0)
  loss, grads = jax.jit(jax.value_and_grad(lambda q: model.loss_fn(q, full_batch, None)[0]))(p)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))
  # The float32 loss from the float32 logits: mean token cross-entropy.
  log_z = np.log(np.exp(base - base.max(-1, keepdims=True)).sum(-1)) + base.max(-1)
  token_ce = log_z - np.take_along_axis(base, tgt[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(loss), token_ce[valid].mean(), rtol=1e-2)
  if dtype == "float16" and float32_logits:
    # Cached decoding builds its own masks (cache positions not yet written are masked).
    tokens, aux = model.predict_batch_with_aux(p, full_batch, max_decode_length=12)
    assert np.isfinite(np.asarray(aux["scores"])).all()
    assert np.asarray(tokens).shape == (3, 12)


def _scatter_adds(jaxpr):
  """(dtype, shape) of the operand of every scatter-add in `jaxpr` and its sub-jaxprs."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scatter-add":
      aval = eqn.invars[0].aval
      found.append((str(aval.dtype), tuple(aval.shape)))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += _scatter_adds(inner)
  return found


def test_bfloat16_gradient_scatters_only_into_the_embedding_in_float32(params, batch):
  """The training gradient's scatter-adds are the token embedding's (the encoder's and the decoder's
  inputs), accumulated in float32; the
  relative position tables' gradients are contractions (T5X's one-hot). A scatter-add in bfloat16,
  or of q * k positions into 32 rows, runs as a compare-and-swap loop on XLA:GPU: mT5-small's
  training step took 6.9 s on an H200 with them, 0.071 s without (docs/benchmarks.md)."""
  enc, dec, tgt = batch
  cfg = dataclasses.replace(CFG, dtype="bfloat16")
  model = network.Transformer(cfg)

  def loss(p):
    logits = model.apply({"params": p}, enc, dec, tgt, enable_dropout=False)
    return jnp.sum(logits.astype(jnp.float32)**2)

  jaxpr = jax.make_jaxpr(jax.grad(loss))(nn.unbox(params["params"])).jaxpr
  assert _scatter_adds(jaxpr) == [("float32", (VOCAB, CFG.emb_dim))] * 2
  # The contraction gives the table's entries themselves: bucket b of head h is table[h, b].
  table = nn.unbox(params["params"])["decoder"]["relpos_bias"]["rel_embedding"]
  bias = network.RelativePositionBiases(32, 128, CFG.num_heads,
                                        jnp.bfloat16).apply({"params": {
                                            "rel_embedding": table
                                        }}, 5, 7, False)
  rel = (jnp.arange(7)[None, :] - jnp.arange(5)[:, None])
  buckets = np.asarray(network.relative_position_bucket(rel, False, 32, 128))
  expected = np.asarray(jnp.asarray(table, jnp.bfloat16))[:, buckets]
  np.testing.assert_array_equal(np.asarray(bias[0]), expected)


def _remat_loss(cfg):
  """Mean cross-entropy of `Transformer(cfg)` with dropout on (jitted value and gradient)."""

  def loss(p, enc, dec, tgt, rng):
    logits = network.Transformer(cfg).apply({"params": p},
                                            enc,
                                            dec,
                                            tgt,
                                            enable_dropout=True,
                                            rngs={"dropout": rng})
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, tgt[..., None], -1) * (tgt[..., None] > 0))

  return jax.jit(jax.value_and_grad(loss))


@pytest.mark.parametrize("policy,conditional", [("minimal", True), ("full", True), ("full", False)])
def test_rematerialised_layers_give_the_same_loss_and_gradients(params, batch, policy, conditional,
                                                                monkeypatch):
  """`remat_policy`: the same parameter tree, and the same loss and gradients (dropout on, one
  rng) as keeping every activation, each layer recomputed in its own conditional (XLA:CPU) or
  behind `jax.checkpoint`'s optimisation barrier (`conditional=False`, as on GPU and TPU)."""
  monkeypatch.setattr(remat, "recompute_in_conditional", lambda: conditional)
  enc, dec, tgt = batch
  cfg = dataclasses.replace(CFG, remat_policy=policy)
  init = jax.jit(network.Transformer(cfg).init, static_argnames=("enable_dropout",))
  remat_params = jax.eval_shape(lambda: init(jax.random.PRNGKey(0), enc, dec, tgt))
  assert jax.tree_util.tree_structure(remat_params) == jax.tree_util.tree_structure(params)
  p = nn.unbox(params["params"])
  rng = jax.random.PRNGKey(3)
  loss, grads = _remat_loss(cfg)(p, enc, dec, tgt, rng)
  ref_loss, ref_grads = _remat_loss(CFG)(p, enc, dec, tgt, rng)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  for (path, g), r in zip(flat, jax.tree_util.tree_leaves(ref_grads)):
    r = np.asarray(r, np.float64)
    error = np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
    assert error <= 1e-5, (jax.tree_util.keystr(path), error)
  layers = CFG.num_encoder_layers + CFG.num_decoder_layers
  lowered = _remat_loss(cfg).lower(p, enc, dec, tgt, rng)
  reference = _remat_loss(CFG).lower(p, enc, dec, tgt, rng)
  if not conditional:
    assert lowered.as_text().count("stablehlo.optimization_barrier") == layers
    assert "optimization_barrier" not in reference.as_text()
    return
  # On XLA:CPU each layer's backward pass is one conditional, kept by the compiler (a barrier is
  # not), and the step's buffers shrink.
  compiled, reference = lowered.compile(), reference.compile()
  assert compiled.as_text().count(" conditional(") == layers
  assert " conditional(" not in reference.as_text()
  assert (compiled.memory_analysis().temp_size_in_bytes
          < reference.memory_analysis().temp_size_in_bytes)


def test_unknown_remat_policy_is_refused():
  with pytest.raises(ValueError, match="remat_policy: unknown policy 'some'"):
    dataclasses.replace(CFG, remat_policy="some")


def test_encoder_output_dropout_is_element_wise_as_t5xs(params, batch):
  """T5X's encoder drops its output element by element (`nn.Dropout` without `broadcast_dims`,
  t5x/examples/t5/network.py `Encoder`), where every other dropout shares one mask along the
  length: at rate 0.5 some feature of a row is zero at some positions and not at others."""
  enc, _, _ = batch
  cfg = dataclasses.replace(CFG, dropout_rate=0.5)
  module = network.Transformer(cfg)
  encoded = np.asarray(
      jax.jit(lambda p, e: module.apply({"params": p},
                                        e,
                                        enable_dropout=True,
                                        rngs={"dropout": jax.random.PRNGKey(3)},
                                        method=module.encode))(nn.unbox(params["params"]), enc))
  zero = encoded[:, :30] == 0  # positions every row has
  assert zero.mean() == pytest.approx(0.5, abs=0.1)
  assert (zero.any(axis=1) & ~zero.all(axis=1)).any()
