"""Attention masks: the masked logit in every float dtype, and masked rows stay finite."""

import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.engine import attention_masks


def test_mask_value_fits_every_dtype():
  assert float(attention_masks.mask_value(jnp.float16)) == -65504.0
  assert float(attention_masks.mask_value(jnp.float32)) == float(np.finfo(np.float32).min)
  assert attention_masks.mask_value(jnp.bfloat16).dtype == jnp.bfloat16
  # A row with every key masked (a padding query) stays finite: uniform weights, no NaN, and
  # masked keys get weight exactly 0 in the other rows, as with T5X's -1e10 in float32.
  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    logits = jnp.asarray([[[[3.0, -2.0, 7.0], [-60000.0, 1.0, 2.0], [1.0, 2.0, 3.0]]]], dtype)
    mask = jnp.asarray([[[[1, 1, 0], [0, 1, 1], [0, 0, 0]]]], dtype)
    masked = attention_masks.mask_logits(logits, mask)
    assert masked.dtype == dtype
    weights = np.asarray(jax.nn.softmax(masked).astype(jnp.float32))[0, 0]
    assert np.isfinite(weights).all(), dtype
    np.testing.assert_allclose(weights[2], [1 / 3] * 3, rtol=1e-2)
    assert weights[0, 2] == 0 and weights[1, 0] == 0
    np.testing.assert_allclose(weights[0, :2], jax.nn.softmax(jnp.asarray([3.0, -2.0])), rtol=1e-2)
