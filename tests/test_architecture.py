"""The import graph of the project's modules (ARCHITECTURE.md): no cycle, and the library is
layered under the dataset-creation package.

Every `.py` file of mcwq_t5x/, tasks/ and preprocessing/ is parsed with `ast` (nothing is imported),
and every import statement counts, those inside functions included: a function-level import hides
a cycle from Python, not from the reader.
"""
import ast
import pathlib

PACKAGES = ("mcwq_t5x", "tasks", "preprocessing")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_name(path: pathlib.Path) -> str:
  """`mcwq_t5x/checkpoints.py` -> "mcwq_t5x.checkpoints"; a package's `__init__.py` -> its name."""
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


def test_graph_sees_function_level_imports():
  """The parser finds imports inside functions and `from mcwq_t5x import x` as module x."""
  graph = import_graph()
  assert "mcwq_t5x.network" in graph["mcwq_t5x.model"]
  assert "mcwq_t5x.readers" in graph["mcwq_t5x.vocab"]
  assert "tasks" in graph["mcwq_t5x.inspect_task"]  # a function-level `import tasks`


def test_find_cycle_reports_the_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle():
  cycle = find_cycle(import_graph())
  assert not cycle, "import cycle among the project's modules: " + " -> ".join(cycle)


def test_library_does_not_import_preprocessing():
  offenders = {
      name: sorted(m for m in imports if m.split(".")[0] == "preprocessing")
      for name, imports in import_graph().items()
      if name.split(".")[0] == "mcwq_t5x"
  }
  offenders = {k: v for k, v in offenders.items() if v}
  assert not offenders, f"mcwq_t5x modules import preprocessing: {offenders}"


def test_checkpoint_paths_is_a_leaf():
  """The leaf of the checkpoint code (ARCHITECTURE.md) imports no other module of the project."""
  graph = import_graph()
  assert graph["mcwq_t5x.checkpoint_paths"] == set()
  assert graph["mcwq_t5x.cpu_settings"] == set()
