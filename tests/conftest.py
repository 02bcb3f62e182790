"""Shared pytest set-up.

Eight fake CPU devices are configured before JAX is imported, so partitioning tests can build
8x1, 4x2 and 2x4 meshes on a CPU-only machine (T5X tests do the same).
"""
import contextlib
import os
import pathlib
import shutil
import tempfile

# XLA's LLVM back end without its optimisation passes: the tests' networks are tiny, so compiling
# dominates their time (the tiny train step compiles in about half the time; its loss changes in
# the 7th digit). XLA:CPU's older LLVM IR fusion emitters instead of its MLIR ones
# (`--xla_cpu_use_fusion_emitters=false`, jaxlib 0.10.2) halve it again. Commands started by the
# tests do not inherit XLA_FLAGS (tests/mains.py: `CHILD_ENV`).
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Two workers share two cores (pytest.ini): one OpenMP thread per process (PyTorch, BLAS), inherited
# by the commands the tests start. With one OpenMP thread per core each, the threads spin while
# the other worker runs. A variable set before the tests wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# JAX's persistent compilation cache, shared by the session's xdist workers and every command they
# start (environment variables, read when JAX is imported): a program compiled once (a train step,
# a decoder loop of the same shapes) is loaded by every later process or Trainer that builds it
# again. The cache key covers the program, XLA_FLAGS and the devices, so the in-process tests' flags
# above never share an entry with a command's. A size limit turns on JAX's file locking (two workers
# write at once). The controller (or the only process, under `-n 0`) creates the folder before the
# workers start and removes it at the end (`pytest_unconfigure`); a cache set by the user is kept.
_OWN_COMPILATION_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ:
  _OWN_COMPILATION_CACHE = tempfile.mkdtemp(prefix="mcwq-t5x-tests-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_COMPILATION_CACHE
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
MCWQ_DIR = SHARED_DIR / "mcwq"

#: Seconds a test's set-up or call may take on the slower 2-core machine (AMD EPYC, AVX2) before the
#: run's last report line names it (`pytest_terminal_summary`): a report, never a failure (no timed
#: tests). `MCWQ_TEST_BUDGET_S` overrides it (README.md, "Tests").
TEST_BUDGET_S = float(os.environ.get("MCWQ_TEST_BUDGET_S", "30"))
_OVER_BUDGET = []  # (seconds, phase, node id) of each set-up or call over TEST_BUDGET_S


def pytest_runtest_logreport(report):
  """Records a set-up or call over `TEST_BUDGET_S` (in the controller, reports of every worker)."""
  if report.when in ("setup", "call") and report.duration > TEST_BUDGET_S:
    _OVER_BUDGET.append((report.duration, report.when, report.nodeid))


@pytest.hookimpl(trylast=True)  # why: after the slowest durations
def pytest_terminal_summary(terminalreporter):
  """One line naming every set-up or call over `TEST_BUDGET_S`, slowest first; it runs before
  pytest's closing 'N passed in S s' line, which stays the run's last line."""
  if not _OVER_BUDGET:
    terminalreporter.write_line(f"over the per-test budget of {TEST_BUDGET_S:g} s: none")
    return
  over = ", ".join(f"{nodeid} ({when} {seconds:.0f} s)"
                   for seconds, when, nodeid in sorted(_OVER_BUDGET, reverse=True))
  terminalreporter.write_line(
      f"over the per-test budget of {TEST_BUDGET_S:g} s ({len(_OVER_BUDGET)}): {over}")


def pytest_unconfigure(config):
  """Removes the session's compilation cache (in the process that created it)."""
  del config
  if _OWN_COMPILATION_CACHE is not None:
    shutil.rmtree(_OWN_COMPILATION_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Under pytest-xdist's `--dist loadgroup` (pytest.ini): a test without an `xdist_group` mark
  is grouped with the other tests of its file (module fixtures then run once, as with
  `--dist loadfile`); the "readme-<chain>" groups (the README's commands of one chain and the
  tests that read their runs; `readme_commands.chain`) are scheduled first (`pytest.ini` keeps this
  order), so that the long chains start at once."""
  del config
  for item in items:
    if not any(item.iter_markers("xdist_group")):
      item.add_marker(pytest.mark.xdist_group(item.path.stem))
  items.sort(
      key=lambda item: not item.get_closest_marker("xdist_group").args[0].startswith("readme"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
  """Stops the session (exit status 4, a one-line reason) when the groups above did not take effect.

  pytest-xdist gives a grouped test the id `<test id>@<group>` in its workers' collections and
  schedules the tests of one group as one unit. pytest 9.2.0 keeps a node's id in another attribute,
  and the suffix pytest-xdist 3.8.0 sets there is lost: every test is then its own unit, the tests
  of one file run on both workers and each worker builds their module fixtures again, and nothing
  fails to say so. `requirements-test.txt` pins a pytest that works; this check covers an
  environment with other versions.

  Raises:
    pytest.UsageError: a worker collected tests without their group (`--dist loadgroup` only).
  """
  if node.config.getvalue("dist") != "loadgroup":
    return
  # as pytest-xdist splits an id: the group follows the last "@" after any parameters
  ungrouped = [nodeid for nodeid in ids if not nodeid.rfind("@") > nodeid.rfind("]")]
  if ungrouped:
    import xdist  # pylint: disable=g-import-not-at-top
    raise pytest.UsageError(
        f"pytest-xdist did not group the tests ({len(ungrouped)} of {len(ids)} without a group, "
        f"e.g. {ungrouped[0]}): module fixtures would run on both workers. pytest "
        f"{pytest.__version__} and pytest-xdist {xdist.__version__} do not work together "
        "here; install the versions of requirements-test.txt.")


@pytest.fixture(scope="session", autouse=True)
def mcwq_tasks_registered():
  """Imports `tasks.mcwq` in each test process before its first test, with the environment the
  session started with.

  The module registers the SeqIO tasks at import with the vocabulary that `MCWQ_VOCAB`,
  `MCWQ_DATA_DIR` and `MCWQ_CACHE_DIR` give (`vocab.get_vocabulary()`). Tests that point
  `MCWQ_DATA_DIR` at a missing folder, to check the error a user sees, would otherwise register
  them when they happen to be the first to import the module: with a vocabulary whose model file
  does not exist (no data to train it), for every later test of that process (without this
  fixture, `pytest -n 0 tests/unit/entry_points/test_train.py -k "missing_data_dir or
  vocab_model_size"` fails).
  """
  import tasks.mcwq  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
  """The read-only `../shared` folder with the real data (see ../shared/README.md)."""
  assert SHARED_DIR.is_dir(), f"real data expected at {SHARED_DIR}"
  return SHARED_DIR


@pytest.fixture(scope="session")
def mcwq_dir() -> pathlib.Path:
  """`../shared/mcwq`: MCWQ dev/test files, RIR references and published predictions."""
  assert MCWQ_DIR.is_dir(), f"MCWQ data expected at {MCWQ_DIR}"
  return MCWQ_DIR


@pytest.fixture
def local_server():
  """`local_server(handler, path="/", **state)` starts a threaded HTTP server on 127.0.0.1 that
  answers with `handler` (a `local_http.Handler` subclass) and returns it (`local_http.Server`:
  `url` is its address with `path`, the `state` keywords are its attributes); every server started
  is shut down after the test."""
  import local_http  # pylint: disable=g-import-not-at-top
  with contextlib.ExitStack() as stack:
    yield lambda handler, path="/", **state: stack.enter_context(
        local_http.serve(handler, path, **state))


@pytest.fixture
def local_gcs(tmp_path, local_server, monkeypatch):
  """A stand-in of Google Cloud Storage on 127.0.0.1 (`local_http.GcsFolder`) over the folder
  `tmp_path/gcs` (its subfolders are the buckets), with TensorStore's `gcs` store pointed at it
  for the test (`local_http.gcs_env`); returns the server (`root`: the folder, `seen`: the
  request paths)."""
  import local_http  # pylint: disable=g-import-not-at-top
  root = tmp_path / "gcs"
  root.mkdir()
  server = local_server(local_http.GcsFolder, root=root, seen=[])
  for name, value in local_http.gcs_env(server.base).items():
    monkeypatch.setenv(name, value)
  return server


@pytest.fixture(scope="session")
def migrated_cfq_sample(tmp_path_factory) -> pathlib.Path:
  """The shared CFQ sample migrated as `python -m preprocessing.migrate --out DIR` does it
  (embedded CoDEx-M store): 1,818 records, 151 with entities, split `cfq_sample` (train 1,598,
  dev 220). About 30 s, once per session (`scenarios.once`); read-only for the tests (copy it
  before changing it)."""
  import scenarios  # pylint: disable=g-import-not-at-top

  def build(out):
    from preprocessing import migrate  # pylint: disable=g-import-not-at-top
    report = migrate.run(migrate.build_parser().parse_args(["--out", str(out), "--quiet"]))
    assert report["written"] == 1818 and report["assigned"] == 151, report
    return {"written": report["written"]}

  folder, _ = scenarios.once(tmp_path_factory, "migrated_cfq_sample", build)
  return folder


@pytest.fixture(scope="session")
def our_run(tmp_path_factory, mcwq_dir) -> pathlib.Path:
  """MODEL_DIR of `python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin` with
  `scenarios.OUR_RUN` and the very small network, run once per session in a fresh process (read-only for
  the tests: copy it before changing it)."""
  del mcwq_dir  # the real data must be there
  import mains  # pylint: disable=g-import-not-at-top
  import scenarios  # pylint: disable=g-import-not-at-top

  def build(model_dir):
    out = mains.python_m(
        "mcwq_t5x.train", "--gin_file=gin/mcwq_t5x/tiny_random_split_en.gin",
        *mains.gin_flags(mains.SMALL_MODEL + scenarios.OUR_RUN + [f"MODEL_DIR = '{model_dir}'"]))
    (model_dir.parent / f"{model_dir.name}.log").write_text(out.stderr)  # beside MODEL_DIR
    return {"log": str(model_dir.parent / f"{model_dir.name}.log")}

  folder, _ = scenarios.once(tmp_path_factory, "our_run", build)
  return folder


@pytest.fixture(scope="session")
def readme(tmp_path_factory, mcwq_dir):
  """The README's commands, run once per session as printed (plus size overrides) in a temporary
  copy of the repository (`scenarios.ReadmeRun`; `readme.result(i)` runs the commands whose
  outputs command i reads first: `readme_commands.DEPENDS`)."""
  del mcwq_dir  # the real data must be there
  import readme_commands  # pylint: disable=g-import-not-at-top
  import scenarios  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.data import vocab  # pylint: disable=g-import-not-at-top
  small = str(vocab.small_vocab_path())
  return scenarios.ReadmeRun(tmp_path_factory, [c for _, c in readme_commands.COMMANDS],
                             lambda index: readme_commands.env_of(index, small),
                             readme_commands.with_overrides, readme_commands.depends,
                             readme_commands.same_as)


@pytest.fixture
def full_disk(monkeypatch):
  """`full_disk(n)`: from now on, files opened with `os.fdopen` (`writers.open_atomic`'s) raise
  OSError(ENOSPC), as `write(2)` on a full disk does, once `n` characters have been written to
  them; no root tricks."""
  import errno  # pylint: disable=g-import-not-at-top
  real_fdopen = os.fdopen

  class FullDiskFile:

    def __init__(self, f, limit):
      self._f, self._left = f, limit

    def write(self, text):
      self._left -= len(text)
      if self._left < 0:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return self._f.write(text)

    def __getattr__(self, name):
      return getattr(self._f, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return self._f.__exit__(*exc)

  def fill_after(n_chars: int) -> None:
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: FullDiskFile(real_fdopen(*a, **k), n_chars))

  return fill_after
