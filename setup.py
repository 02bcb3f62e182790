"""mcwq-t5x: MCWQ (Cui et al., TACL 2022) as SeqIO tasks, a lean T5X-style mT5 engine, evaluation and
the CFQ->Wikidata dataset-creation pipeline."""
import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent


def _requirements(name):
  lines = (_HERE / name).read_text().splitlines()
  return [
      l.split("#")[0].strip() for l in lines if l.split("#")[0].strip() and not l.startswith("-r")
  ]


setuptools.setup(
    name="mcwq-t5x",
    version="0.1.0",
    description=" ".join(__doc__.split()),
    long_description=(_HERE / "README.md").read_text() if (_HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(
        include=["mcwq_t5x", "mcwq_t5x.*", "tasks", "tasks.*", "preprocessing", "preprocessing.*"]),
    package_data={"": ["*.json", "*.tsv", "*.gin"]},
    include_package_data=True,
    install_requires=_requirements("requirements.txt"),
    extras_require={
        "test": _requirements("requirements-test.txt"),
        # Runtime dependencies of the real T5X; T5X itself is not on the package index: install
        # it with scripts/install_t5x.sh (or `pip install --no-deps -r requirements-t5x.txt`).
        "t5x": _requirements("requirements-t5x-runtime.txt"),
    },
    license="Apache-2.0",
    license_files=["LICENSE"],
)
