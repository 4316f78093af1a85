r"""Fine-tuning config (the paper's recipe by default). Usage:

  python -m bertjax train --config=configs/finetune.py:task=glue/mrpc,init=PRETRAIN_WORKDIR_OR_HF_DIR,lr=2e-5 \
      --workdir=W

Argument keys: task (glue/{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli} | squad/v1.1 | squad/v2.0 | squad_json |
ner | local | pairs | sparse | rerank | multivector), init, lr, batch, epochs, seq (0 = 128, or 384 for SQuAD), seed,
shard, variant (only without init).

Your own file (task=local; CSV, TSV or JSONL): --config.data.train_file=train.csv --config.data.eval_file=dev.csv
--config.data.text_a_column=sentence [--config.data.text_b_column=...] --config.data.label_column=label. A quick
run: batch=16,epochs=1,seq=64. Every field and task: docs/finetuning.md.
"""
import ml_collections

from bertjax.model.config import INIT_RATES
from configs import common

# The model fields a fine-tuning config sets on top of its init's architecture.
RUN_FIELDS = ("dropout_rate", "attention_dropout_rate", "classifier_dropout", "dtype", "scan_layers", "scan_unroll",
              "remat", "attention_impl", "attention_block", "embedding_lookup", "dropout_impl", "prune_final_layer",
              "initializer")
# Rates left negative (INIT_RATES) are the init's own.


def get_config(arg=None):
  a = common.parse_arg(arg, task="glue/mrpc", init="", lr=2e-5, batch=32, epochs=3, seq=0, seed=0, shard="dp",
                       variant="base", vocab=30522, dtype="float32", scan=False)
  c = ml_collections.ConfigDict()
  c.mode = "finetune"  # python -m bertjax train dispatches on it
  c.task = a.task
  c.init = a.init  # bertjax pre-training workdir or HF safetensors folder; "" = random init of `model` (tests)
  c.seed = a.seed  # head init, dropout and example order; sweeps vary it

  # The model's run settings (dropout, dtype, layer scan, kernels, the fresh head's initializer), applied over the
  # init's own architecture; with no init, also the architecture (variant, vocab_size, max_position_embeddings).
  # The dropout rates stay the init's unless set (INIT_RATES).
  # Each at model.BertConfig's default (bertjax/model/config.py documents each) but for these deltas; the fresh task
  # head is drawn as HF transformers draws it, N(0, 0.02²) (the original's truncated normal is 12% narrower;
  # docs/finetuning.md has the measured difference). Attention by the row length (`attention_impl="by_length"`):
  # long documents' rows run blockwise, which keeps no [L, L] scores, short ones the dense path.
  c.model = common.model_section(a.variant, fields=("vocab_size", "max_position_embeddings") + RUN_FIELDS,
                                 vocab_size=a.vocab, dtype=a.dtype, scan_layers=a.scan, initializer="normal",
                                 attention_impl="by_length", **{k: -1.0 for k in INIT_RATES})

  c.data = ml_collections.ConfigDict()
  c.data.tfds_data_dir = ""  # where tfds keeps glue/squad ("" = tfds default)
  c.data.train_file = ""  # local / squad_json / ner: training file (.csv .tsv .jsonl | SQuAD JSON | CoNLL)
  c.data.eval_file = ""  # the same for evaluation
  c.data.text_a_column = "text_a"  # local: column names
  c.data.text_b_column = ""  # local: second sentence column ("" = single sentence)
  c.data.label_column = "label"
  c.data.labels = ("",)  # local / ner: the declared label set, e.g. ("neg", "pos") or ("O", "B-PER", "I-PER")
  c.data.regression = False  # local: a float label (Pearson/Spearman)
  c.data.max_seq_length = a.seq or (384 if a.task.startswith("squad") else 128)
  c.data.doc_stride = 128  # SQuAD windows
  # False: windows start doc_stride tokens apart (the original run_squad.py); True: consecutive windows share
  # doc_stride tokens (HF tokenizers' `stride`, as run_qa.py passes its --doc_stride): fewer windows per long context.
  c.data.doc_stride_is_overlap = False
  c.data.max_query_length = 64
  c.data.max_answer_length = 30
  c.data.n_best = 20
  c.data.tokenizer = ""  # override the init's tokenizer (vocab.txt or .model)
  c.data.do_lower_case = True
  # Batches are padded to a few lengths, not all to max_seq_length: multiples of max(16, max_seq_length / 8 rounded
  # up to 8), so at most this many compiled programs (16s at seq 128, 48s at 384); 0 pads to max_seq_length.
  c.data.length_buckets = 8
  # Batches of random rows from one length bucket (the batch order shuffled): a batch is padded to its bucket, not
  # to a long outlier's length. Every example still once per epoch; a bucket's last batch may be partial.
  c.data.group_by_length = True
  c.data.packing = False  # pack the training examples into full rows (block-diagonal attention), whatever their length
  # Pack them when it pays: the task kind can (classification, regression, tagging) and the examples average at
  # most half a row, so most of an unpacked batch would be padding. Evaluation is then packed too. False: never
  # unless `packing` says so.
  c.data.auto_packing = True
  c.data.pack_max_per_row = 8  # examples per packed row at most
  # task=pairs / sparse / multivector with a distillation loss (`*.loss` margin_mse | distill_kl): the folder of a
  # teacher's scores of data.train_file (python -m bertjax teacher; docs/embeddings.md#distillation-from-a-teacher).
  c.data.teacher_scores = ""

  # task=pairs (embedding training; anchor / positive columns: data.text_a_column / data.text_b_column, scored
  # pairs: data.regression=True with data.label_column)
  c.embedding = ml_collections.ConfigDict()
  c.embedding.pooling = ""  # cls | mean | max over the real tokens; "": a sentence-transformers init's, else mean
  c.embedding.normalize = True  # unit-length embeddings
  c.embedding.scale = 20.0  # similarity scale in the loss (1 / temperature), sentence-transformers' default
  c.embedding.symmetric = False  # also positives -> anchors (symmetric InfoNCE)
  c.embedding.negative_columns = ("",)  # hard-negative columns, e.g. ("negative",)
  # Matryoshka: the loss summed over these leading widths (each renormalised), e.g. "768,512,256,128,64"; eval adds
  # nDCG@10 (or Spearman) at each. "": the full width only.
  c.embedding.matryoshka_dims = ""
  # Gradient caching (GradCache): embed the batch in chunks of this many rows without activations, the loss on the
  # whole batch, then each chunk's backward pass. Equal gradients, memory of one chunk. 0: off.
  c.embedding.cache_chunk = 0
  # mnrl: in-batch negatives (above) | margin_mse: sentence-transformers' MarginMSELoss | distill_kl: its
  # DistillKLDivLoss at `temperature`; both against data.teacher_scores, on dot products of the embeddings.
  c.embedding.loss = "mnrl"
  c.embedding.temperature = 1.0

  # task=sparse (SPLADE on the pairs' columns and negatives): sentence-transformers' SpladeLoss over
  # SparseMultipleNegativesRankingLoss, its defaults. Pooling and activation "": a SparseEncoder init's, else max, relu.
  c.sparse = ml_collections.ConfigDict()
  c.sparse.pooling = ""  # max | sum over the tokens
  c.sparse.activation = ""  # relu: log(1 + ReLU(logit)) | log1p_relu: log(1 + log(1 + ReLU(logit)))
  c.sparse.scale = 1.0  # dot-product scale in the ranking loss
  c.sparse.document_regularizer_weight = 3e-5  # FLOPS on the documents (positives and negatives)
  c.sparse.query_regularizer_weight = 5e-5  # FLOPS on the queries; -1: none
  # The regularisers' weights rise from 0 as (step / W)^2, W this fraction of the run, then hold.
  c.sparse.regularizer_warmup = 1 / 3
  c.sparse.max_active_dims = 0  # evaluation: keep each vector's largest terms (0: all)
  # Queries: mlm (the MLM model, as documents) | static (inference-free: a learned weight per term at the terms a
  # query's tokens hold, sentence-transformers' SparseStaticEmbedding; started from the init's static weights,
  # else the IDF of the training documents) | "": an inference-free SparseEncoder init's static side, else mlm.
  c.sparse.query_side = ""
  c.sparse.static_lr_ratio = 50.0  # static: its weights learn this many times faster (1e-3 against 2e-5)
  # mnrl | margin_mse: SpladeLoss over SparseMarginMSELoss | distill_kl: over SparseDistillKLDivLoss (temperature 2)
  c.sparse.loss = "mnrl"
  c.sparse.temperature = 2.0

  # task=rerank (cross-encoder; query, document, relevance columns): bce, sentence-transformers'
  # BinaryCrossEntropyLoss on each pair | listnet, its ListNetLoss over each query's documents (a batch is queries).
  c.rerank = ml_collections.ConfigDict()
  c.rerank.loss = "bce"
  # bce: the weight of a relevant pair's term (its pos_weight; the number of mined negatives per positive evens
  # out a list of one positive and N negatives, as sentence-transformers' reranker recipes set it).
  c.rerank.pos_weight = 1.0

  # task=multivector (ColBERT-style late interaction on the pairs' columns and negatives): sentence-transformers'
  # multi-vector MultipleNegativesRankingLoss on MaxSim scores. A MultiVectorEncoder init brings its own settings.
  c.multivector = ml_collections.ConfigDict()
  c.multivector.dim = 128  # the projection's width
  c.multivector.scale = 1.0
  c.multivector.query_length = 32  # 0: data.max_seq_length
  c.multivector.document_length = 0  # 0: data.max_seq_length
  c.multivector.query_expansion = True  # pad queries to query_length with [MASK], scored by MaxSim (ColBERT)
  c.multivector.attend_to_expansion = False
  c.multivector.query_prompt = ""  # e.g. "[Q] " when the tokenizer has such a token
  c.multivector.document_prompt = ""
  c.multivector.skip_punctuation = True  # punctuation tokens give no document vectors (ColBERT)
  # mnrl | margin_mse: MultiVectorMarginMSELoss | distill_kl: MultiVectorDistillKLDivLoss, on MaxSim scores
  c.multivector.loss = "mnrl"
  c.multivector.temperature = 1.0

  c.train = ml_collections.ConfigDict()
  c.train.learning_rate = a.lr  # 2e-5, 3e-5 or 5e-5
  c.train.global_batch_size = a.batch  # 32 (16 allowed)
  c.train.num_epochs = a.epochs  # 2 to 4
  c.train.warmup_fraction = 0.1  # linear warmup over the first 10% of steps, then linear decay to 0
  # linear_from_warmup: from the peak at the end of warmup down to 0 at the last step, as HF's
  # get_linear_schedule_with_warmup | linear: the original's lr·(1 − t/T) after warmup, 10% less learning-rate
  # area over a run with 10% warmup (docs/finetuning.md).
  c.train.schedule = "linear_from_warmup"
  c.train.optimizer = "adamw"
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.weight_decay = 0.01
  # AdamW as PyTorch, HF and optax have it (bias-corrected moments). False is the original's update, whose steps
  # are 2-5x larger over a fine-tuning run of a few hundred steps, a known cause of unstable BERT fine-tuning
  # (Mosbach et al. 2021; Zhang et al. 2021); set False to reproduce google-research/bert's run_classifier.
  c.train.adam_bias_correction = True
  c.train.grad_clip_norm = 1.0
  c.train.fused_update = True  # clipping + AdamW in one pass per parameter (False: optax chain, same maths and state)
  c.train.grad_accum_steps = 1  # micro-batches per step, their gradients summed (the memory of one micro-batch)
  c.train.eval_batch_size = 0  # rows per evaluation batch (0 = global_batch_size)
  c.train.stop_after_steps = 0  # stop (with a checkpoint) after this many steps in this run; 0 = run to the end
  c.train.prng_impl = "threefry2x32"  # dropout bits: threefry2x32 (portable) | rbg | unsafe_rbg (faster on GPU/TPU)

  c.log_every = 50
  c.checkpoint_every = 1000  # steps between resumable checkpoints (also at each epoch's end and on SIGTERM/SIGINT)
  c.keep_checkpoints = 2  # most recent resumable checkpoints kept (the best params live apart, in WORKDIR/best)
  c.sharding = common.sharding(a.shard)
  c.lock()
  return c
