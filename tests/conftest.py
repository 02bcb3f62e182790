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
