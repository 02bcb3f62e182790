"""Which process of a multi-process run is gone, said by the processes that are left.

When a `jax.distributed` process dies, the others wait in their next collective until JAX's
coordination service misses its heartbeats (~50 s) and ends them from C++ (exit 134), naming no
process. `ProcessWatch` says it first: a daemon thread writes a counter under its own key of the
coordination service's key-value store every `INTERVAL_S` and reads the others'; a counter still
for `TIMEOUT_S` means gone, "failed: <error>" that error, an unanswering store that process 0 is
gone, "done" a normal end; then `on_lost(message)` is called. `is_lost_process_error` tells a
collective's error from a lost peer (gloo: "Connection reset by peer"). The store is reached
through `jax._src.distributed.global_state.client`, as Orbax does (JAX has no public name).
No TensorFlow or SeqIO import.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

import jax

#: Seconds between a process's reports.
INTERVAL_S = 1.0
#: Seconds without a report after which a process counts as gone (JAX's own heartbeat check ends
#: the processes after about 50 s).
TIMEOUT_S = 20.0
#: The key prefix of the reports in the coordination service's key-value store.
PREFIX = "mcwq_t5x/process_watch/"


class LostProcessError(RuntimeError):
  """Another process of a multi-process run is gone (died, killed): this one cannot go on."""


# What the runtime errors of a collective say when a process at the other end is gone: gloo (CPU)
# and NCCL (GPU) lose their connections, the coordination service its heartbeats.
_LOST_PEER_PATTERNS = ("connection reset by peer", "connection closed by peer", "broken pipe",
                       "connection refused", "remote process exited", "socket closed",
                       "heartbeat timeout", "unhealthy", "failed to send rpc to coordination")


def is_lost_process_error(error: Optional[BaseException]) -> bool:
  """Whether `error` (or an exception it was raised from) is a JAX runtime error of a collective
  whose other end is gone (`_LOST_PEER_PATTERNS`)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, jax.errors.JaxRuntimeError) and any(
        p in str(error).lower() for p in _LOST_PEER_PATTERNS):
      return True
    error = error.__cause__ or error.__context__
  return False


def _client() -> Any:
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


class ProcessWatch:
  """Watches the other processes of a multi-process run (see the module docstring).

  Args:
    on_lost: called once, from the watch's thread, with a message naming the process that is gone
      and why; expected to end this process.
    interval_s, timeout_s: see `INTERVAL_S`, `TIMEOUT_S`.
  """

  def __init__(self,
               on_lost: Callable[[str], None],
               interval_s: float = INTERVAL_S,
               timeout_s: float = TIMEOUT_S):
    self._on_lost = on_lost
    self._interval, self._timeout = float(interval_s), float(timeout_s)
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.lost: Optional[str] = None

  @staticmethod
  def _key(index: int) -> str:
    return f"{PREFIX}{index}"

  def start(self) -> "ProcessWatch":
    """Starts the thread (a no-op in a single-process run)."""
    if jax.process_count() > 1 and _client() is not None and self._thread is None:
      self._thread = threading.Thread(target=self._run, name="mcwq_t5x-process-watch", daemon=True)
      self._thread.start()
    return self

  def finish(self, status: str = "done") -> None:
    """Stops watching and tells the others how this process ends: "done" (not watched any more)
    or "failed: <error>" (they stop too, naming this process and the error). Idempotent."""
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join(timeout=self._interval * 5)
    self._thread = None
    try:
      _client().key_value_set(self._key(jax.process_index()), status, allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except  (the store is gone: nobody to tell)
      pass

  def wait_for_verdict(self, seconds: float) -> Optional[str]:
    """Waits up to `seconds` for the thread to find a lost process; returns its message or None."""
    deadline = time.monotonic() + seconds
    while self.lost is None and self._thread is not None and time.monotonic() < deadline:
      time.sleep(0.1)
    return self.lost

  def _report_lost(self, message: str) -> None:
    self.lost = message
    self._on_lost(message)

  def _run(self) -> None:
    me, count = jax.process_index(), jax.process_count()
    client = _client()
    seen: dict[int, tuple[Optional[str], float]] = {
        i: (None, time.monotonic()) for i in range(count) if i != me
    }
    counter = 0
    while not self._stop.wait(self._interval if counter else 0.0):
      counter += 1
      try:
        client.key_value_set(self._key(me), f"alive {counter}", allow_overwrite=True)
        values = {k.rsplit("/", 1)[-1]: v for k, v in client.key_value_dir_get(PREFIX)}
      except Exception as e:  # pylint: disable=broad-except  (the coordination service is gone)
        if self._stop.is_set():
          return
        if me != 0:
          self._report_lost(f"process 0 of {count} (the coordinator) is gone: the coordination "
                            f"service it runs does not answer ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})")
          return
        logging.warning("process watch: the coordination service does not answer (%s)", e)
        continue
      now = time.monotonic()
      for i, (last, since) in list(seen.items()):
        value = values.get(str(i))
        if value == "done":
          del seen[i]
        elif value is not None and value.startswith("failed"):
          self._report_lost(f"process {i} of {count} stopped with an error "
                            f"({value[len('failed: '):]}): see its log")
          return
        elif value != last:
          seen[i] = (value, now)
        elif now - since > self._timeout:
          self._report_lost(f"process {i} of {count} is gone: it has not reported for "
                            f"{now - since:.0f} s (died, killed or hung: see its log)")
          return


def resume_message(lost: str, command: str, resume_from: str) -> str:
  """The last line of a process that stops because another one is gone.

  Args:
    lost: which process is gone and why (`ProcessWatch`'s message).
    command: this process's command line.
    resume_from: what the rerun starts from (the newest checkpoint's folder, or the start).
  """
  count = jax.process_count()
  return (f"{lost}; process {jax.process_index()} cannot go on without it and stops. Rerun the "
          f"same command on every process (--process_index 0 to {count - 1}) to resume from "
          f"{resume_from}; this process's command: {command}")
