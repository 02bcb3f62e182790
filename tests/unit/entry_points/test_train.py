"""Units of the training main that need no data: the periodic training-eval loss covers every row
of the split (the last, short batch is padded with rows that carry no loss weight); a SIGTERM seen
by the preemption watch; the errors of a lost process told from a process's own."""
import os
import signal

import jax
import numpy as np
import optax

from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import preemption
from mcwq_t5x.engine import process_watch
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x import train as train_lib
import tiny_engine


def test_loss_over_split_scores_every_row_once():
  partitioner = partitioning.Partitioner(devices=jax.devices()[:2])
  model = tiny_engine.tiny_model(0.0)
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  state = tr.create_state(tiny_engine.SHAPES)
  rows = tiny_engine.synthetic_batch(0, batch=11)  # 11 rows: batches of 4, 4 and 3 (+1 padding)
  chunked = train_lib.loss_over_split(tr, state, rows, 4, partitioner)
  whole = train_lib.loss_over_split(tr, state, {k: v[:10] for k, v in rows.items()}, 10, partitioner)
  last = train_lib.loss_over_split(tr, state, {k: v[10:] for k, v in rows.items()}, 2, partitioner)
  n_whole = float(rows["decoder_loss_weights"][:10].sum())
  n_last = float(rows["decoder_loss_weights"][10:].sum())
  expected = (whole["loss"] * n_whole + last["loss"] * n_last) / (n_whole + n_last)
  np.testing.assert_allclose(chunked["loss"], expected, rtol=1e-5)
  # A batch larger than the split still gives a loss (it is one padded batch).
  single = train_lib.loss_over_split(tr, state, rows, 16, partitioner)
  np.testing.assert_allclose(single["loss"], chunked["loss"], rtol=1e-5)


def test_resume_drops_metric_rows_after_the_resumed_step(tmp_path):
  """A run killed at step 40 after checkpoint 20 resumes from 20: the rows of steps 25-40 are
  dropped (they are written again), so no step appears twice; a line cut off by the kill too."""
  import json  # pylint: disable=g-import-not-at-top
  train_rows = [{"step": s, "loss": 1.0} for s in range(5, 45, 5)]
  (tmp_path / "train_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows) +
                                                '{"step": 4')
  (tmp_path / "eval_metrics.jsonl").write_text("".join(
      json.dumps({"step": s}) + "\n" for s in (20, 40)))
  dropped = train_lib.drop_metric_rows_after(tmp_path, 20)
  assert dropped == {"train_metrics.jsonl": 5, "eval_metrics.jsonl": 1}
  rows = [json.loads(l) for l in (tmp_path / "train_metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [5, 10, 15, 20]
  assert (tmp_path / "eval_metrics.jsonl").read_text() == '{"step": 20}\n'
  assert train_lib.drop_metric_rows_after(tmp_path, 20) == {}  # nothing more to drop
  assert train_lib.drop_metric_rows_after(tmp_path / "missing", 0) == {}


def test_preemption_watch_one_process_sees_sigterm_and_restores_the_handler():
  """One process: a SIGTERM during the watch is seen at the next `reached` (no process ended);
  the previous handler is back after it; a watch without a signal reaches nothing."""
  before = signal.getsignal(signal.SIGTERM)
  with preemption.PreemptionWatch(0) as watch:
    assert watch.mode == preemption.ONE_PROCESS and not watch.reached(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert watch.reached(2) and watch.reached(3)
    # The first SIGTERM put the default action back: a second one would end the process at once.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
  assert signal.getsignal(signal.SIGTERM) == before
  assert preemption.EXIT_STATUS == 143


def test_lost_process_errors_are_told_from_a_process_own_errors():
  """A collective whose other end is gone (gloo's error, also inside gin's proxy or as the
  context of another error) is a lost process; other runtime errors are not."""
  gloo = jax.errors.JaxRuntimeError(
      "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error "
      "[127.0.0.1]:31110: Connection reset by peer")
  assert process_watch.is_lost_process_error(gloo)
  try:
    try:
      raise gloo
    except jax.errors.JaxRuntimeError:
      raise ValueError("while saving") from None
  except ValueError as e:
    assert process_watch.is_lost_process_error(e)
  assert not process_watch.is_lost_process_error(
      jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 GiB"))
  assert not process_watch.is_lost_process_error(ValueError("Connection reset by peer"))
  # One process: the watch does nothing.
  watch = process_watch.ProcessWatch(lambda lost: None).start()
  assert watch.wait_for_verdict(0.1) is None
  watch.finish()
