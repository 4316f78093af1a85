"""The layout holds: every import in the package points down the layer order docs/architecture.md draws (read from
the code, function-level imports included), package files stay within the size budget, and the README's layout
names what the tree holds."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EMBEDDING_KINDS = ("bertjax.embeddings.sparse", "bertjax.embeddings.multivector", "bertjax.embeddings.rerank")
# Bottom to top; a module may import from its own layer and the layers below it.
LAYERS = (
    ("bertjax", "bertjax.errors"),
    ("bertjax.core",),
    ("bertjax.kernels",),
    ("bertjax.model",),
    ("bertjax.data",),
    ("bertjax.objectives",),
    ("bertjax.convert",),
    ("bertjax.tasks",),
    # bertjax.embeddings, bottom to top: the shared modules (no kind), the dense kind, the kinds built on it (never on
    # one another: test_embedding_kinds_import_no_other_kind), and the tools over every kind (the package's own
    # __init__ and any module not named here among them).
    ("bertjax.embeddings.model", "bertjax.embeddings.folders", "bertjax.embeddings.losses", "bertjax.embeddings.blocks",
     "bertjax.embeddings.buckets", "bertjax.embeddings.quantize", "bertjax.embeddings.retrieval",
     "bertjax.embeddings.distill"),
    ("bertjax.embeddings.dense",),
    EMBEDDING_KINDS,
    ("bertjax.embeddings", "bertjax.embeddings.teacher", "bertjax.embeddings.mining", "bertjax.embeddings.suite",
     "bertjax.embeddings.mteb_model"),
    ("bertjax.run", "bertjax.pretrain", "bertjax.finetune", "bertjax.predict"),
    ("bertjax.cli", "bertjax.__main__"),
)
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def layer_of(module: str) -> int:
  """The index of the longest layer prefix naming `module` (bertjax itself: its __init__)."""
  best, found = -1, None
  for i, names in enumerate(LAYERS):
    for name in names:
      hit = module == name if name in ("bertjax", "bertjax.errors") else (
          module == name or module.startswith(name + "."))
      if hit and len(name) > best:
        best, found = len(name), i
  assert found is not None, f"{module} is in no layer of docs/architecture.md"
  return found


def package_files(folder="bertjax"):
  for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        yield path, module[:-len(".__init__")] if module.endswith(".__init__") else module


def _is_module(name: str) -> bool:
  """Whether the dotted `name` is a module or package of this repository."""
  path = os.path.join(ROOT, *name.split("."))
  return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def imports(path: str, module: str):
  """(line, imported module) of every import of bertjax (or configs) in a file, relative ones resolved; `from P
  import M` of a module M of package P is an import of P.M (what it runs, P's __init__ aside)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        yield node.lineno, a.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
      for a in node.names:
        sub = f"{base}.{a.name}"
        yield node.lineno, sub if base == "bertjax" or _is_module(sub) else base


def test_no_import_runs_back_up_the_layers():
  """A module of layer n imports only from layers <= n (docs/architecture.md); the registry of task kinds names
  its plug-ins by path instead (`bertjax.tasks.MODULES`)."""
  upward = []
  for path, module in package_files():
    mine = layer_of(module)
    for line, target in imports(path, module):
      if target.split(".")[0] != "bertjax" or target == "bertjax.__main__":
        continue
      if layer_of(target) > mine:
        upward.append(f"{os.path.relpath(path, ROOT)}:{line} {module} -> {target}")
  assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_configs_import_no_mode_and_no_tool():
  """A config describes a run; the code that runs it is never a config's dependency."""
  found = []
  for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    if name.endswith(".py"):
      path = os.path.join(ROOT, "configs", name)
      for line, target in imports(path, f"configs.{name[:-3]}"):
        if target.startswith("bertjax") and layer_of(target) >= len(LAYERS) - 2:
          found.append(f"configs/{name}:{line} -> {target}")
  assert not found, found


def test_the_layer_test_catches_an_upward_import(tmp_path):
  """The check reads function-level and relative imports too: an upward one in either is found."""
  code = "def f():\n  from bertjax import finetune\nfrom ..cli import common\n"
  path = tmp_path / "x.py"
  path.write_text(code)
  targets = [t for _, t in imports(str(path), "bertjax.core.x")]
  assert sorted(targets) == ["bertjax.cli.common", "bertjax.finetune"]
  assert all(layer_of(t) > layer_of("bertjax.core.x") for t in targets)


def test_the_layer_test_reads_a_submodule_imported_from_its_package(tmp_path):
  """`from bertjax.embeddings import teacher` is an import of the top-layer module, not of the package's name."""
  path = tmp_path / "x.py"
  path.write_text("from bertjax.embeddings import folders, teacher\nfrom bertjax.embeddings.sparse import encoder\n")
  targets = [t for _, t in imports(str(path), "bertjax.embeddings.losses")]
  assert targets == ["bertjax.embeddings.folders", "bertjax.embeddings.teacher",
                     "bertjax.embeddings.sparse.encoder"]
  assert [layer_of(t) for t in targets] == [layer_of("bertjax.embeddings.losses"), layer_of("bertjax.embeddings"),
                                            layer_of("bertjax.embeddings.rerank")]
  assert layer_of("bertjax.embeddings.model") < layer_of("bertjax.embeddings.dense.encoder") < \
      layer_of("bertjax.embeddings.sparse.task") < layer_of("bertjax.embeddings.teacher")


def test_embedding_kinds_import_no_other_kind():
  """The sparse, multi-vector and rerank kinds share one layer and build on the shared modules and `dense` only:
  none imports another (function-level imports included)."""
  found = []
  for path, module in package_files("bertjax/embeddings"):
    mine = [k for k in EMBEDDING_KINDS if module == k or module.startswith(k + ".")]
    for line, target in imports(path, module):
      other = [k for k in EMBEDDING_KINDS if (target == k or target.startswith(k + ".")) and k not in mine]
      if mine and other:
        found.append(f"{os.path.relpath(path, ROOT)}:{line} {module} -> {target}")
  assert not found, "embedding kinds that import another kind:\n" + "\n".join(found)


def test_package_files_and_functions_stay_within_the_budget():
  long_files, long_functions = [], []
  for path, _ in package_files():
    text = open(path, encoding="utf-8").read()
    if text.count("\n") > MAX_FILE_LINES:
      long_files.append(f"{os.path.relpath(path, ROOT)}: {text.count(chr(10))} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long_functions.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}: {n} lines")
  assert not long_files and not long_functions, long_files + long_functions


def test_readme_layout_names_every_package_and_module():
  """The README's layout block names each sub-package and each top-level module of bertjax/ (a line of its own,
  indented two spaces, NAME/ or NAME.py first), and nothing that is not there."""
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  block = readme.split("## Layout", 1)[1].split("```", 2)[1]
  named = set(re.findall(r"^  ([a-z_]+(?:/|\.py)) ", block, re.M))
  tree = {n + "/" for n in os.listdir(os.path.join(ROOT, "bertjax"))
          if os.path.isfile(os.path.join(ROOT, "bertjax", n, "__init__.py"))}
  tree |= {n for n in os.listdir(os.path.join(ROOT, "bertjax")) if n.endswith(".py") and n != "__init__.py"}
  assert named == tree, f"README layout names {sorted(named - tree)} that are not in bertjax/, and leaves out " \
                        f"{sorted(tree - named)}"
