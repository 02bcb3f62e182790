"""The preemption watch of one process (mcwq_t5x.engine.preemption): a SIGTERM is seen at the next
step boundary and the previous handler is restored. Whole runs preempted: tests/e2e/
(test_faults_checkpoints, test_multiprocess)."""
import os
import signal

from mcwq_t5x.engine import preemption


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
