"""The errors of a lost process told from a process's own (mcwq_t5x.engine.process_watch). A dead
process of a multi-process run: tests/e2e/test_multiprocess.py."""
import jax

from mcwq_t5x.engine import process_watch


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
