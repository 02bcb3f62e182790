"""The import graph of the project's modules (ARCHITECTURE.md): no cycle, each wing of the library
imports only what its rule allows, no wing imports an entry point, and the library is layered under
the dataset-creation package.

Every `.py` file of mcwq_t5x/, tasks/ and preprocessing/ is parsed with `ast` (nothing is imported),
and every import statement counts, those inside functions included: a function-level import hides
a cycle from Python, not from the reader.
"""
import ast
import pathlib

import pytest

PACKAGES = ("mcwq_t5x", "tasks", "preprocessing")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_name(path: pathlib.Path) -> str:
  """`mcwq_t5x/checkpointing/checkpoints.py` -> "mcwq_t5x.checkpointing.checkpoints"; a package's `__init__.py` -> its name."""
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, pathlib.Path]:
  """{module name: file} of every module of `PACKAGES`."""
  return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported_modules(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
  """The project modules that the module `name` (file `path`) imports, anywhere in the file.

  `from package import x` counts as importing `package.x` when that is a module, else `package`;
  relative imports are resolved against `name`. Modules outside the project are left out.
  """
  is_package = path.name == "__init__.py"
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base_parts = name.split(".")
        if not is_package:
          base_parts = base_parts[:-1]
        base_parts = base_parts[:len(base_parts) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      targets = [
          f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
          for alias in node.names
      ]
    else:
      continue
    for target in targets:
      # `import a.b.c` of a module the project has, or the nearest enclosing project module.
      while target and target not in modules:
        target = target.rpartition(".")[0]
      if target and target != name:
        found.add(target)
  return found


def import_graph() -> dict[str, set[str]]:
  """{module: the project modules it imports}."""
  modules = project_modules()
  return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
  """One import cycle as [a, b, ..., a], or [] if the graph has none (depth-first search)."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str]:
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = visit(nxt)
        if cycle:
          return cycle
    path.pop()
    state[node] = 2
    return []

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return []


WINGS = ("engine", "data", "checkpointing", "evaluation", "stores", "prompting", "t5x_bridge")
# What each wing may import of the project, besides itself (mcwq_t5x/<wing>/__init__.py says why).
ALLOWED = {
    "engine": set(),
    "data": set(),
    "stores": set(),
    "checkpointing": {"engine", "data"},
    "evaluation": {"engine", "data", "checkpointing", "stores"},
    "prompting": {"data", "stores"},
    "t5x_bridge": {"engine"},
}
# Packages no module of a wing may import, anywhere in the module (the GPU image has neither
# TensorFlow nor SeqIO; the stores are plain Python clients).
FORBIDDEN_LIBRARIES = {
    "engine": {"tensorflow", "seqio", "tensorflow_datasets", "t5x"},
    "stores": {"jax", "flax", "optax", "tensorflow", "seqio", "tensorflow_datasets"},
    "checkpointing": {"seqio", "tensorflow_datasets"},
    "prompting": {"jax", "flax", "optax", "tensorflow", "seqio", "tensorflow_datasets"},
    "t5x_bridge": {"tensorflow", "seqio", "tensorflow_datasets"},
}
# Imported only inside functions, where a wing module may import them at all.
LAZY_LIBRARIES = {"checkpointing": {"tensorflow"}}


def wing_of(module: str) -> str:
  """"mcwq_t5x.engine.model" -> "engine"; an entry point ("mcwq_t5x.train") -> "entry"; a module
  outside mcwq_t5x -> its package ("tasks", "preprocessing")."""
  parts = module.split(".")
  if parts[0] != "mcwq_t5x":
    return parts[0]
  if len(parts) > 2 or (len(parts) == 2 and parts[1] in WINGS):
    return parts[1]
  return "entry" if len(parts) == 2 else "mcwq_t5x"


def external_imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
  """(top-level packages imported at module level, those imported inside functions or classes)."""
  tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
  top, nested = set(), set()

  def names(node):
    if isinstance(node, ast.Import):
      return {a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
      return {node.module.split(".")[0]}
    return set()

  for node in tree.body:
    top |= names(node)
    if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, guarded imports at top level
      for child in ast.walk(node):
        top |= names(child)
  for node in ast.walk(tree):
    nested |= names(node)
  return top, nested - top


def test_graph_sees_function_level_imports():
  """The parser finds imports inside functions and `from package import x` as module x."""
  graph = import_graph()
  assert "mcwq_t5x.engine.network" in graph["mcwq_t5x.engine.model"]
  assert "mcwq_t5x.data.readers" in graph["mcwq_t5x.data.vocab"]
  assert "tasks" in graph["mcwq_t5x.inspect_task"]  # a function-level `import tasks`


def test_find_cycle_reports_the_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle():
  cycle = find_cycle(import_graph())
  assert not cycle, "import cycle among the project's modules: " + " -> ".join(cycle)


def test_every_library_module_is_in_a_wing():
  """mcwq_t5x/ holds the entry points and what they share (gin handling, console, stderr filter);
  the library is in the wings."""
  top = sorted(p.stem for p in (ROOT / "mcwq_t5x").glob("*.py") if p.stem != "__init__")
  assert top == sorted(ENTRY_POINTS), top
  assert sorted(
      p.name
      for p in (ROOT / "mcwq_t5x").iterdir()
      if p.is_dir() and (p / "__init__.py").exists()) == sorted(WINGS)
  for wing in WINGS:
    doc = ast.get_docstring(ast.parse((ROOT / "mcwq_t5x" / wing / "__init__.py").read_text()))
    assert doc and "Imports:" in doc, f"mcwq_t5x/{wing}/__init__.py must say what it may import"


ENTRY_POINTS = ("train", "eval", "infer", "score", "report", "export_hf", "inspect_task",
                "divergence", "rir", "best_checkpoint", "gin_utils", "console", "stderr_filter",
                "prompt")


def test_wings_import_only_what_their_rule_allows():
  offenders = []
  for name, imports in import_graph().items():
    wing = wing_of(name)
    if wing not in WINGS:
      continue
    for target in sorted(imports):
      other = wing_of(target)
      if other != wing and other not in ALLOWED[wing]:
        offenders.append(f"{name} imports {target} ({wing} may import "
                         f"{sorted(ALLOWED[wing]) or 'nothing else of the project'})")
  assert not offenders, "\n".join(offenders)


def test_wings_keep_out_of_forbidden_libraries():
  offenders = []
  for name, path in project_modules().items():
    wing = wing_of(name)
    top, nested = external_imports(path)
    banned = FORBIDDEN_LIBRARIES.get(wing, set())
    for package in sorted((top | nested) & banned):
      offenders.append(f"{name} imports {package} (not in the {wing} wing)")
    for package in sorted(top & LAZY_LIBRARIES.get(wing, set())):
      offenders.append(f"{name} imports {package} at module level (only inside functions)")
  assert not offenders, "\n".join(offenders)


#: The modules the mains share: gin handling, the console and error lines, the stderr filter.
SHARED_BY_MAINS = ("mcwq_t5x.gin_utils", "mcwq_t5x.console", "mcwq_t5x.stderr_filter")


def test_no_wing_imports_an_entry_point_and_no_entry_point_another():
  offenders = []
  for name, imports in import_graph().items():
    for target in sorted(imports):
      if wing_of(target) == "entry" and target not in SHARED_BY_MAINS:
        offenders.append(f"{name} imports the entry point {target}")
      elif wing_of(name) in WINGS and target in SHARED_BY_MAINS:
        offenders.append(f"{name} imports gin handling ({target})")
  assert not offenders, "\n".join(offenders)


def test_library_does_not_import_preprocessing_or_tasks():
  offenders = {
      name: sorted(m for m in imports if m.split(".")[0] in ("preprocessing", "tasks"))
      for name, imports in import_graph().items()
      if wing_of(name) in WINGS
  }
  offenders = {k: v for k, v in offenders.items() if v}
  assert not offenders, f"library modules import preprocessing or tasks: {offenders}"


def test_rules_catch_a_violation(tmp_path, monkeypatch):
  """A wing module importing what its rule forbids is reported (the checks can fail)."""
  graph = import_graph()
  graph["mcwq_t5x.engine.model"] = graph["mcwq_t5x.engine.model"] | {"mcwq_t5x.data.readers"}
  monkeypatch.setattr(__import__(__name__), "import_graph", lambda: graph)
  with pytest.raises(AssertionError, match="engine.model imports mcwq_t5x.data.readers"):
    test_wings_import_only_what_their_rule_allows()
  bad = tmp_path / "m.py"
  bad.write_text("def f():\n  import tensorflow as tf\n")
  assert external_imports(bad) == (set(), {"tensorflow"})


def test_t5x_bridge_is_imported_by_no_module():
  """The real T5X's model on our engine is reached from gin files only: the library and the mains
  run without T5X."""
  importers = sorted(
      name for name, imports in import_graph().items()
      if wing_of(name) != "t5x_bridge" and any(wing_of(m) == "t5x_bridge" for m in imports))
  assert not importers, f"modules importing mcwq_t5x.t5x_bridge: {importers}"


def test_leaves():
  """The leaf of the checkpoint code and the CPU settings import no other module of the project."""
  graph = import_graph()
  assert graph["mcwq_t5x.checkpointing.checkpoint_paths"] == set()
  assert graph["mcwq_t5x.engine.cpu_settings"] == set()


def test_run_folder_has_one_owner():
  """`checkpointing.run_folder` names the run folder on top of the leaf only, and the writers and
  the report read its names from it (no second copy of the `checkpoint_<step>` pattern)."""
  graph = import_graph()
  assert graph["mcwq_t5x.checkpointing.run_folder"] == {"mcwq_t5x.checkpointing.checkpoint_paths"}
  for user in ("mcwq_t5x.train", "mcwq_t5x.eval", "mcwq_t5x.evaluation.prediction",
               "mcwq_t5x.checkpointing.best_checkpoint", "mcwq_t5x.evaluation.report.discovery"):
    assert "mcwq_t5x.checkpointing.run_folder" in graph[user], user
  copies = [
      p for p in project_modules().values()
      if r"checkpoint_\d+" in p.read_text(encoding="utf-8") and p.name != "checkpoint_paths.py"
  ]
  assert not copies, f"a second checkpoint_<step> pattern: {copies}"


#: Library modules tested in a file of another name: {module: the test file} (each file exists and
#: names the module). Every other module of a wing has `tests/**/test_<module>.py`; a module of a
#: package inside a wing (`evaluation/report/`) is tested by `test_<package>.py`.
TESTED_IN = {
    "mcwq_t5x.checkpointing.checkpoint_loaders":
        "tests/unit/checkpointing/test_checkpoints.py",
    "mcwq_t5x.checkpointing.checkpoint_paths":
        "tests/unit/checkpointing/test_checkpoints.py",
    "mcwq_t5x.checkpointing.run_info":
        "tests/e2e/test_run_identity.py",
    "mcwq_t5x.checkpointing.run_lock":
        "tests/e2e/test_faults_checkpoints.py",
    "mcwq_t5x.checkpointing.t5x_checkpoint_writer":
        "tests/unit/checkpointing/test_checkpoint_import.py",
    "mcwq_t5x.data.paths":
        "tests/unit/data/test_readers.py",
    "mcwq_t5x.data.tfds_mcwq":
        "tests/unit/data/test_tfds.py",
    "mcwq_t5x.engine.cpu_settings":
        "tests/unit/engine/test_partitioning.py",
    "mcwq_t5x.evaluation.prediction_checks":
        "tests/unit/evaluation/test_score.py",
    "mcwq_t5x.evaluation.published":
        "tests/unit/evaluation/test_report.py",
    "mcwq_t5x.prompting.client":
        "tests/unit/prompting/test_prompting.py",
    "mcwq_t5x.prompting.prompt_format":
        "tests/unit/prompting/test_prompting.py",
    "mcwq_t5x.prompting.selection":
        "tests/unit/prompting/test_prompting.py",
    "mcwq_t5x.stores.cache":
        "tests/unit/stores/test_endpoint.py",
    "mcwq_t5x.stores.flags":
        "tests/unit/stores/test_endpoint.py",
    "mcwq_t5x.stores.jsonl_cache":
        "tests/unit/preprocessing/test_substitute.py",
    "mcwq_t5x.stores.oxigraph":
        "tests/unit/stores/test_endpoint.py",
    "mcwq_t5x.stores.remote":
        "tests/unit/stores/test_endpoint.py",
    "mcwq_t5x.stores.transport":
        "tests/unit/stores/test_endpoint.py",
}


def test_every_library_module_has_its_tests():
  """ARCHITECTURE.md's rule for tests/unit/: each wing module has a test file of its name, or
  `TESTED_IN` names the file that tests it."""
  own = {p.stem[len("test_"):] for p in (ROOT / "tests").rglob("test_*.py")}
  missing, wrong = [], []
  for name, path in project_modules().items():
    if wing_of(name) not in WINGS or path.name == "__init__.py":
      continue
    package = path.parent.name if path.parent.name not in WINGS else None
    if path.stem in own or (package is not None and package in own):
      continue
    if name not in TESTED_IN:
      missing.append(name)
    elif not (ROOT / TESTED_IN[name]).is_file() or name.rsplit(
        ".", 1)[1] not in (ROOT / TESTED_IN[name]).read_text(encoding="utf-8"):
      wrong.append(f"{name}: {TESTED_IN[name]}")
  assert not missing, f"modules without tests/**/test_<module>.py or a TESTED_IN entry: {missing}"
  assert not wrong, f"TESTED_IN files that do not exist or never name their module: {wrong}"
