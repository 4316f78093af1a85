"""Every benchmark's results JSON names the machine it ran on: benchmarks/machine.py's stamp() gives the documented
shapes with the fields of /proc/cpuinfo's first processor, and every benchmark script that writes JSON passes its
results through it (or is listed below with the reason it need not)."""
import glob
import importlib.util
import os

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


def check_machine(m: dict):
  assert set(m) >= MACHINE_KEYS, set(MACHINE_KEYS) - set(m)
  assert m["describe"] == machine.describe() and isinstance(m["describe"], str) and m["describe"]
  assert m["cores"] == os.cpu_count()
  if not os.path.exists("/proc/cpuinfo"):
    return
  cpu = first_processor()
  flags = cpu.get("flags", "").split()
  assert m["vendor"] == cpu["vendor_id"]
  assert m["model_name"] == cpu.get("model name", "")
  assert (m["family"], m["model"]) == (cpu.get("cpu family"), cpu.get("model"))
  assert m["avx2"] == ("avx2" in flags) and m["avx512f"] == ("avx512f" in flags)
  assert m["avx512_bf16"] == ("avx512_bf16" in flags)
  assert m["amx"] == any(f.startswith("amx") for f in flags)
  assert cpu["vendor_id"] in m["describe"] and f"family {cpu.get('cpu family')}" in m["describe"]


def test_stamp_adds_the_machine_to_a_dict_and_keeps_its_keys():
  result = {"rows": [{"x": 1}], "command": "python benchmarks/x.py", "machine": "x86_64"}
  stamped = machine.stamp(result)
  assert stamped is not result and result["machine"] == "x86_64"  # a copy; the argument is left as it was
  assert stamped["rows"] == [{"x": 1}] and stamped["command"] == "python benchmarks/x.py"
  assert set(stamped) == {"rows", "command", "machine", "versions"}
  check_machine(stamped["machine"])  # an older "machine" value is replaced by the full one
  assert stamped["versions"] == machine.versions()
  assert "jax" in stamped["versions"] and "jaxlib" in stamped["versions"]
  assert machine.stamp(stamped) == stamped  # stamping twice changes nothing


def test_stamp_wraps_a_list_of_rows():
  rows = [{"regime": "fixed", "tokens_per_s": 1.0}, {"regime": "glue", "tokens_per_s": 2.0}]
  stamped = machine.stamp(rows)
  assert set(stamped) == {"machine", "versions", "rows"}
  assert stamped["rows"] == rows
  check_machine(stamped["machine"])
  assert stamped["versions"] == machine.versions()
  assert machine.rows(stamped) == rows and machine.rows(rows) == rows  # either form reads back as the rows
  with pytest.raises(TypeError):
    machine.stamp("a string")


def test_every_benchmark_that_writes_json_stamps_it():
  scripts = sorted(glob.glob(os.path.join(BENCHMARKS, "*.py")))
  assert scripts
  missing = []
  for path in scripts:
    name = os.path.basename(path)
    text = open(path, encoding="utf-8").read()
    if "json.dump(" in text and "machine.stamp(" not in text and name not in NOT_STAMPED:
      missing.append(name)
  assert not missing, f"benchmarks writing JSON without machine.stamp (or a reason in NOT_STAMPED): {missing}"
  for name in NOT_STAMPED:  # the allowlist names scripts that exist and still write JSON without a stamp
    text = open(os.path.join(BENCHMARKS, name), encoding="utf-8").read()
    assert "json.dump(" in text and "machine.stamp(" not in text, name
