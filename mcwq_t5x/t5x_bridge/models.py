"""T5X's `EncoderDecoderModel` on our engine: the real T5X's trainer, partitioner, checkpoints,
evaluators and decoding functions, with `engine.network.Transformer` as the module and the output
layer fused with its loss (`engine.losses.fused_loss`: no [batch, length, vocab] logits).

`EncoderDecoderModel` subclasses `t5x.models.EncoderDecoderModel` (T5X's `t5x/models.py`) and keeps
its constructor, feature converter, `predict_batch_with_aux` and decoding (`t5x.decoding.beam_search`
/ `temperature_sample` call the module's `decode` with `decode=True`, the flax `cache` collection
and `max_decode_length`, as T5X's `t5x/examples/t5/network.py`; neither network takes `prefill`,
so T5X decodes both without prompt prefilling). What changes:

* `loss_fn` (training and, through T5X's `eval_fn`, evaluation): T5X's
  `compute_weighted_cross_entropy` (label smoothing, z-loss, `loss_normalizing_factor` and its
  special values) and T5X's metrics (`compute_base_metrics`), computed from the statistics of the
  fused loss;
* `score_batch`: T5X's per-row sum of target log-probabilities times `decoder_loss_weights`;
* `get_initial_variables`: T5X's `{'params', 'params_axes'}` (its partitioner and optimizers read
  the logical axes from `params_axes`), of our network's parameters, which have T5X's names,
  shapes and logical axes (a public T5X mT5/T5.1.1 checkpoint restores unchanged);
* `remat_policy` ("none", "minimal", "full"; `engine.network.T5Config`): the module's layers
  rematerialised in the backward pass.

`transformer(config)` is our network of T5X's `t5x.examples.t5.network.T5Config` (the gin files
keep binding `network.T5Config`). Source: T5X 0.0.0 (github.com/google-research/t5x, 2026).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

from clu import metrics as clu_metrics
import flax.core
import flax.linen as nn
from flax.linen import partitioning as flax_partitioning
import jax
import jax.numpy as jnp
from t5x import decoding as t5x_decoding
from t5x import losses as t5x_losses
from t5x import models as t5x_models

from mcwq_t5x.engine import losses
from mcwq_t5x.engine import network

Array = jax.Array
PyTree = Any

# The fields of T5X's `t5x.examples.t5.network.T5Config`; the rest of ours (32 relative-position
# buckets, max distance 128, RMS-norm epsilon 1e-6) are the values T5X's network hard-codes.
T5X_CONFIG_FIELDS = ("vocab_size", "dtype", "emb_dim", "num_heads", "num_encoder_layers",
                     "num_decoder_layers", "head_dim", "mlp_dim", "mlp_activations", "dropout_rate",
                     "logits_via_embedding", "float32_attention_logits")


def network_config(config: Any, **overrides: Any) -> network.T5Config:
  """Our `network.T5Config` of T5X's `T5Config` (`T5X_CONFIG_FIELDS`, T5X's defaults where
  `config` lacks one), with `overrides` (e.g. `remat_policy`). ValueError: a bad value (ours)."""
  fields = {name: getattr(config, name) for name in T5X_CONFIG_FIELDS if hasattr(config, name)}
  # why: T5X's default, where ours (True) differs; its mT5/T5.1.1 gin files leave it unset
  fields.setdefault("float32_attention_logits", False)
  return network.T5Config(**{**fields, **overrides})


def transformer(config: Any) -> network.Transformer:
  """Our network with the hyper-parameters of T5X's `t5x.examples.t5.network.T5Config` `config`
  (or of our `network.T5Config`, as it is)."""
  if not isinstance(config, network.T5Config):
    config = network_config(config)
  return network.Transformer(config)


def _params_axes(boxed_params: PyTree) -> PyTree:
  """T5X's `params_axes` tree of Flax-boxed params: `<name>_axes` -> `AxisMetadata(names)` for
  each parameter `<name>` (what T5X's `param_with_axes` records)."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(boxed_params))
  axes = {}
  for path, leaf in flat.items():
    if not isinstance(leaf, nn.LogicallyPartitioned):
      raise ValueError(f"parameter {'/'.join(path)} has no logical axis names")
    axes[path[:-1] + (f"{path[-1]}_axes",)] = flax_partitioning.AxisMetadata(names=leaf.names)
  return flax.traverse_util.unflatten_dict(axes)


class EncoderDecoderModel(t5x_models.EncoderDecoderModel):
  """T5X's `EncoderDecoderModel` (module docstring) over `module`, an `engine.network.Transformer`
  (`transformer` makes one of T5X's `T5Config`).

  T5X's arguments, as `t5x.models.EncoderDecoderModel`; and `remat_policy`: None keeps the
  module's, else "none" / "minimal" / "full" replaces it (`network.T5Config.remat_policy`);
  `loss_chunk_tokens`: tokens whose logits the loss and scores hold at once
  (`losses.OutputLayer.chunk_tokens`). TypeError: `module` is not our network (T5X's own
  `network.Transformer` runs with `t5x.models.EncoderDecoderModel`); ValueError: an unknown
  policy, `label_smoothing` outside [0, 1), `loss_chunk_tokens` < 1.
  """

  def __init__(self,
               module: network.Transformer,
               input_vocabulary: Any,
               output_vocabulary: Any,
               optimizer_def: Any,
               decode_fn: t5x_models.DecodeFnCallable = t5x_decoding.beam_search,
               feature_converter_cls: Any = None,
               label_smoothing: float = 0.0,
               z_loss: float = 0.0,
               loss_normalizing_factor: Union[None, float, int, str,
                                              t5x_losses.SpecialLossNormalizingFactor] = None,
               default_decoder_params: Optional[t5x_models.DecoderParams] = None,
               remat_policy: Optional[str] = None,
               loss_chunk_tokens: int = losses.DEFAULT_CHUNK_TOKENS):
    if not isinstance(module, network.Transformer):
      raise TypeError(
          f"mcwq_t5x.t5x_bridge.models.EncoderDecoderModel: module must be "
          f"mcwq_t5x.engine.network.Transformer (gin: @t5x_bridge.transformer()), got "
          f"{type(module).__module__}.{type(module).__name__}; T5X's own network runs with "
          f"t5x.models.EncoderDecoderModel (gin/recipes/t5x_own_model.gin)")
    if remat_policy is not None and remat_policy != module.config.remat_policy:
      module = network.Transformer(dataclasses.replace(module.config, remat_policy=remat_policy))
    super().__init__(
        module=module,
        input_vocabulary=input_vocabulary,
        output_vocabulary=output_vocabulary,
        optimizer_def=optimizer_def,
        decode_fn=decode_fn,
        feature_converter_cls=feature_converter_cls,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        loss_normalizing_factor=loss_normalizing_factor,
        default_decoder_params=default_decoder_params)
    config = module.config
    tied = bool(config.logits_via_embedding)
    self.output_layer = losses.OutputLayer(
        transposed=tied,
        divisor=float(network.logits_divisor(config)) if tied else None,
        label_smoothing=float(label_smoothing),
        z_loss=float(z_loss),
        chunk_tokens=int(loss_chunk_tokens))

  @property
  def remat_policy(self) -> str:
    """The module's `remat_policy`."""
    return self.module.config.remat_policy

  # ------------------------------------------------------------------------
  # Initialisation.
  # ------------------------------------------------------------------------
  def get_initial_variables(
      self,
      rng: Array,
      input_shapes: Mapping[str, Any],
      input_types: Optional[Mapping[str, Any]] = None) -> flax.core.FrozenDict:
    """T5X's `{'params': float32 arrays, 'params_axes': AxisMetadata}` of the module (T5X's
    `get_initial_variables`, shapes and types as there)."""
    variables = flax.core.unfreeze(super().get_initial_variables(rng, input_shapes, input_types))
    boxed = variables.pop("params")
    return flax.core.freeze({
        **variables, "params": nn.unbox(boxed),
        "params_axes": _params_axes(boxed)
    })

  # ------------------------------------------------------------------------
  # Loss and scores.
  # ------------------------------------------------------------------------
  def _output_layer_input(self,
                          params: PyTree,
                          batch: Mapping[str, Array],
                          dropout_rng: Optional[Array] = None,
                          mutable: Any = False) -> Any:
    """The teacher-forced output layer's input [batch, length, emb_dim] (`config.dtype`), as
    T5X's `_compute_logits` computes the logits (and, with `mutable`, the mutated variables)."""
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    return self.module.apply({"params": params},
                             batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"],
                             batch["decoder_target_tokens"],
                             encoder_segment_ids=batch.get("encoder_segment_ids", None),
                             decoder_segment_ids=batch.get("decoder_segment_ids", None),
                             encoder_positions=batch.get("encoder_positions", None),
                             decoder_positions=batch.get("decoder_positions", None),
                             decode=False,
                             enable_dropout=rngs is not None,
                             rngs=rngs,
                             mutable=mutable,
                             output_logits=False)

  def _output_kernel(self, params: PyTree) -> Array:
    return network.output_kernel(self.module.config, params)

  def loss_fn(self, params: PyTree, batch: Mapping[str, Array],
              dropout_rng: Optional[Array]) -> tuple[Array, t5x_models.MetricsMap]:
    """T5X's `BaseTransformerModel.loss_fn`: (float32 loss, T5X's metrics), the loss and metrics
    of `compute_weighted_cross_entropy` and `compute_base_metrics`, without the logits."""
    hidden = self._output_layer_input(params, batch, dropout_rng)
    targets = batch["decoder_target_tokens"]
    factor, weights = t5x_losses.get_loss_normalizing_factor_and_weights(
        self._loss_normalizing_factor, batch)
    # why ones: T5X's loss without weights sums every position, padding included
    token_weights = (
        jnp.ones(targets.shape, jnp.float32) if weights is None else jnp.asarray(
            weights, jnp.float32))
    loss, stats = losses.fused_loss(hidden, self._output_kernel(params), targets, token_weights,
                                    self.output_layer)
    terms = losses.token_losses(stats, targets, self.output_layer, self.module.config.vocab_size)
    z_loss = jnp.sum(terms.z_loss * token_weights)
    if factor is not None:
      loss = loss / factor
      z_loss = z_loss / factor
    segment_ids = {
        k[:-len("_segment_ids")]: v for k, v in batch.items() if k.endswith("_segment_ids")
    }
    if not segment_ids:
      segment_ids = {
          k: v != 0
          for k, v in batch.items()
          if k in ("encoder_input_tokens", "decoder_target_tokens")
      }
    metrics = t5x_models.compute_base_metrics(
        # why a zero placeholder: T5X reads the logits only for the accuracy, replaced below
        logits=jnp.zeros(targets.shape + (1,), jnp.float32),
        targets=targets,
        mask=weights,
        loss=loss,
        z_loss=z_loss,
        segment_ids=segment_ids)
    # clu's `Accuracy.from_model_output`, of the fused loss's argmax (jnp.argmax's first maximum)
    accuracy = clu_metrics.Average.from_model_output(values=terms.correct, mask=weights)
    metrics["accuracy"] = clu_metrics.Accuracy(**vars(accuracy))
    return loss, metrics

  def score_batch(self,
                  params: PyTree,
                  batch: Mapping[str, Array],
                  return_intermediates: bool = False) -> Any:
    """float32 [batch]: each row's sum of target log-probabilities times `decoder_loss_weights`
    (T5X's `score_batch`: no z-loss, no label smoothing); with `return_intermediates`, also
    the module's sown intermediates plus `decoder`'s `target_tokens`, `loss_weights` and
    `token_scores` (singleton tuples, as T5X)."""
    weights = batch["decoder_loss_weights"]
    targets = batch["decoder_target_tokens"]
    if return_intermediates:
      hidden, mutated = self._output_layer_input(params, batch, mutable=["intermediates"])
      intermediates = flax.core.unfreeze(mutated.get("intermediates", {}))
    else:
      hidden = self._output_layer_input(params, batch)
    stats = losses.token_statistics(hidden, self._output_kernel(params), targets, self.output_layer)
    token_scores = (stats.target_logit - stats.log_z) * weights
    if not return_intermediates:
      return token_scores.sum(-1)
    decoder = intermediates.setdefault("decoder", {})
    decoder["target_tokens"] = (targets,)
    decoder["loss_weights"] = (weights,)
    decoder["token_scores"] = (token_scores,)
    return token_scores.sum(-1), intermediates


__all__ = ["EncoderDecoderModel", "T5X_CONFIG_FIELDS", "network_config", "transformer"]
