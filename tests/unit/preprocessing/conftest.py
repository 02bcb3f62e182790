"""Fixtures of the dataset-creation tests that read the shared CFQ sample
(`../shared/cfq/cfq_sample_{train,dev}.json`, 1,818 records with their full-release fields): built
once per test module, read-only for the tests."""
import pytest

from preprocessing import cfq, mapping as mp


@pytest.fixture(scope="module")
def cfq_files(shared_dir):
  """The CFQ sample's train and dev files (paths as strings, as the commands take them)."""
  return [str(shared_dir / "cfq" / f"cfq_sample_{p}.json") for p in ("train", "dev")]


@pytest.fixture(scope="module")
def records(cfq_files):
  """{questionIdx: record} of the CFQ sample."""
  return {rec["questionIdx"]: rec for _, rec in cfq.load_records(cfq_files)}


@pytest.fixture(scope="module")
def model(records):
  """The placeholder-alignment context model (`cfq.ContextModel`) fitted on the CFQ sample."""
  return cfq.ContextModel().fit(records.values())


@pytest.fixture(scope="module")
def mapping():
  """The Freebase -> Wikidata property mapping (`mapping.load_mapping()`, the file it ships)."""
  return mp.load_mapping()
