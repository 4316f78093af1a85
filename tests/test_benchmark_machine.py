"""Every benchmark's results JSON names the machine it ran on: benchmarks/machine.py's stamp() gives the documented
shapes, through json and back, with the fields of /proc/cpuinfo's first processor, the one-line description its
docstring spells and the versions of the installed distributions, each read here independently of machine.py; and
every benchmark script that writes JSON dumps at least one value stamp() made (read from its syntax tree), or is
listed below with the reason it need not."""
import ast
import glob
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
# Loaded from its file, so that benchmarks/ (whose storage.py, bench.py ... would shadow) stays off sys.path.
_spec = importlib.util.spec_from_file_location("benchmarks_machine", os.path.join(BENCHMARKS, "machine.py"))
machine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(machine)

MACHINE_KEYS = {"vendor", "model_name", "family", "model", "cores", "avx2", "avx512f", "avx512_bf16", "amx",
                "describe"}

# Scripts that call json.dump but write no results file of their own measurement, each with its reason.
NOT_STAMPED = {
    "tagging_splits.py": "summarizes other runs' results files (each stamped by the script that measured it) and "
                         "measures nothing itself: a stamp would name the machine that summarized, not the one "
                         "that measured",
}


def first_processor() -> dict:
  """The first block of /proc/cpuinfo, read here independently of machine.cpu()."""
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    block = f.read().split("\n\n")[0]
  out = {}
  for line in block.splitlines():
    if ":" in line:
      key, value = line.split(":", 1)
      out[key.strip()] = value.strip()
  return out


def installed_versions() -> dict:
  """{distribution: version} from the *.dist-info folder names on sys.path (the first one wins, as for an import);
  a wheel's folder name spells '-' in a distribution's name as '_'."""
  out = {}
  for entry in sys.path:
    for folder in sorted(glob.glob(os.path.join(entry, "*.dist-info"))):
      name, _, version = os.path.basename(folder)[:-len(".dist-info")].partition("-")
      out.setdefault(name.lower().replace("_", "-"), version)
  return out


VERSIONED = ("jax", "jaxlib", "flax", "orbax-checkpoint", "torch", "transformers", "sentence-transformers")


def check_versions(v: dict):
  import jax
  installed = installed_versions()
  assert v == {k: installed[k] for k in VERSIONED}, (v, installed)  # the test extra installs all seven
  assert v["jax"] == jax.__version__


def check_machine(m: dict):
  assert set(m) >= MACHINE_KEYS, set(MACHINE_KEYS) - set(m)
  if not os.path.exists("/proc/cpuinfo"):
    assert m["cores"] == os.cpu_count() and m["describe"]
    return
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    processors = sum(line.startswith("processor") for line in f)
  cpu = first_processor()
  flags = cpu.get("flags", "").split()
  assert m["cores"] == processors
  assert m["vendor"] == cpu["vendor_id"]
  assert m["model_name"] == cpu.get("model name", "")
  assert (m["family"], m["model"]) == (cpu.get("cpu family"), cpu.get("model"))
  assert m["avx2"] == ("avx2" in flags) and m["avx512f"] == ("avx512f" in flags)
  assert m["avx512_bf16"] == ("avx512_bf16" in flags)
  assert m["amx"] == any(f.startswith("amx") for f in flags)
  isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
  isa += "+bf16" * ("avx512_bf16" in flags) + "+AMX" * any(f.startswith("amx") for f in flags)
  assert m["describe"] == (f"{cpu.get('model name', '')} ({cpu['vendor_id']} family {cpu.get('cpu family')} "
                           f"model {cpu.get('model')}), {processors} cores, {isa}")


def test_stamp_adds_the_machine_to_a_dict_and_keeps_its_keys():
  result = {"rows": [{"x": 1}], "command": "python benchmarks/x.py", "machine": "x86_64"}
  stamped = machine.stamp(result)
  assert stamped is not result and result["machine"] == "x86_64"  # a copy; the argument is left as it was
  written = json.loads(json.dumps(stamped))  # what a benchmark's results file holds
  assert written["rows"] == [{"x": 1}] and written["command"] == "python benchmarks/x.py"
  assert set(written) == {"rows", "command", "machine", "versions"}
  check_machine(written["machine"])  # an older "machine" value is replaced by the full one
  check_versions(written["versions"])
  assert machine.stamp(stamped) == stamped  # stamping twice changes nothing


def test_stamp_wraps_a_list_of_rows():
  rows = [{"regime": "fixed", "tokens_per_s": 1.0}, {"regime": "glue", "tokens_per_s": 2.0}]
  stamped = json.loads(json.dumps(machine.stamp(rows)))
  assert set(stamped) == {"machine", "versions", "rows"}
  assert stamped["rows"] == rows
  check_machine(stamped["machine"])
  check_versions(stamped["versions"])
  assert machine.rows(stamped) == rows and machine.rows(rows) == rows  # either form reads back as the rows
  with pytest.raises(TypeError):
    machine.stamp("a string")


def _is_stamp(node) -> bool:
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stamp"
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "machine")


def stamped_dumps(tree) -> tuple[int, int]:
  """(json.dump calls, those whose value is machine.stamp(...) itself or a name the same function assigned from
  machine.stamp(...))."""
  functions = (ast.FunctionDef, ast.AsyncFunctionDef)
  dumps = stamped = 0
  for scope in [n for n in ast.walk(tree) if isinstance(n, (ast.Module, *functions))]:
    body, todo = [], list(ast.iter_child_nodes(scope))
    while todo:  # the scope's own nodes: a nested function is a scope of its own
      n = todo.pop()
      body.append(n)
      if not isinstance(n, functions):
        todo.extend(ast.iter_child_nodes(n))
    names = {t.id for n in body if isinstance(n, ast.Assign) and _is_stamp(n.value)
             for t in n.targets if isinstance(t, ast.Name)}
    for n in body:
      if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "dump"
          and isinstance(n.func.value, ast.Name) and n.func.value.id == "json" and n.args):
        dumps += 1
        value = n.args[0]
        stamped += _is_stamp(value) or (isinstance(value, ast.Name) and value.id in names)
  return dumps, stamped


def test_the_syntax_tree_check_tells_a_stamped_dump_from_a_mention():
  assert stamped_dumps(ast.parse("json.dump(machine.stamp(rows), f)")) == (1, 1)
  assert stamped_dumps(ast.parse("def main():\n  r = machine.stamp(rows)\n  json.dump(r, f)")) == (1, 1)
  # the text alone is not a stamp: a comment, a string, a stamp of something else than what is dumped
  assert stamped_dumps(ast.parse("# machine.stamp(rows)\njson.dump(rows, f)")) == (1, 0)
  assert stamped_dumps(ast.parse("s = 'machine.stamp('\njson.dump(rows, f)")) == (1, 0)
  assert stamped_dumps(ast.parse("r = machine.stamp(rows)\njson.dump(rows, f)")) == (1, 0)
  # a name stamped in one function is not stamped in another
  assert stamped_dumps(ast.parse("def a():\n  r = machine.stamp(x)\ndef b():\n  json.dump(r, f)")) == (1, 0)


def test_every_benchmark_that_writes_json_stamps_it():
  scripts = sorted(glob.glob(os.path.join(BENCHMARKS, "*.py")))
  assert scripts
  missing, dumping = [], 0
  for path in scripts:
    name = os.path.basename(path)
    dumps, stamped = stamped_dumps(ast.parse(open(path, encoding="utf-8").read(), path))
    dumping += dumps > 0
    if dumps and not stamped and name not in NOT_STAMPED:
      missing.append(name)
  assert dumping >= 20, dumping  # the check reads the benchmarks that write results
  assert not missing, f"benchmarks writing JSON without a machine.stamp value (or a reason in NOT_STAMPED): {missing}"
  for name in NOT_STAMPED:  # the allowlist names scripts that exist and still write JSON without a stamp
    dumps, stamped = stamped_dumps(ast.parse(open(os.path.join(BENCHMARKS, name), encoding="utf-8").read()))
    assert dumps and not stamped, name
