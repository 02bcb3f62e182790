"""Shared pytest set-up.

Eight fake CPU devices are configured before JAX is imported, so partitioning tests can build
8x1, 4x2 and 2x4 meshes on a CPU-only machine (T5X tests do the same).
"""
import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
MCWQ_DIR = SHARED_DIR / "mcwq"


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


@pytest.fixture(scope="session")
def migrated_cfq_sample(tmp_path_factory) -> pathlib.Path:
  """The shared CFQ sample migrated as `python -m preprocessing.migrate --out DIR` does it
  (embedded CoDEx-M store): 1,818 records, 151 with entities, split `cfq_sample` (train 1,598,
  dev 220). About 30 s; read-only for the tests (copy it before changing it)."""
  from preprocessing import migrate  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp("migrated_cfq_sample")
  report = migrate.run(migrate.build_parser().parse_args(["--out", str(out), "--quiet"]))
  assert report["written"] == 1818 and report["assigned"] == 151, report
  return out
