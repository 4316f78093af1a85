r"""Pre-training config. Usage:

  python -m bertjax train --config=configs/pretrain.py:variant=base,seq=128,shard=fsdp --workdir=DIR \
      --config.data.data_dir=gs://bucket/data --config.train.num_steps=1000000

Argument keys (all optional): variant, seq, preds (0 = from mask), batch, steps, shard, tp, ln (post|pre),
act (gelu|gelu_tanh|relu|silu), pos (learned|sinusoidal|rotary|alibi), nsp (True|False), mask (masked-LM rate),
wwm, dynamic, dtype, scan, remat, opt. configs/roberta.py and configs/modernbert.py are the other families'
recipes on this one; any architecture switch of either works here too (--config.model.position_embedding=rotary).
Every field can also be overridden with --config.a.b=value; the config is locked, so a mistyped key is an error.
"""
import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="base", seq=128, preds=20, batch=256, steps=1_000_000, shard="fsdp", tp=4,
                       ln="post", act="gelu", pos="learned", nsp=True, mask=0.15, wwm=False, dynamic=False,
                       dtype="float32", scan=True, remat="none", opt="adamw", vocab=30522)
  c = ml_collections.ConfigDict()
  c.mode = "pretrain"  # python -m bertjax train dispatches on it
  c.objective = "mlm"  # mlm (MLM, + NSP with train.use_nsp) | electra (configs/electra.py)
  c.seed = 0  # parameter init, dropout and data order

  # Every model.BertConfig field, at the dataclass's default (bertjax/model/config.py documents each), but these:
  # the argument keys above, and scanned layers (compile time flat in depth).
  c.model = common.model_section(a.variant, vocab_size=a.vocab, hidden_act=a.act, position_embedding=a.pos,
                                 layer_norm=a.ln, nsp_head=a.nsp, dtype=a.dtype, scan_layers=a.scan, remat=a.remat)

  c.data = ml_collections.ConfigDict()
  c.data.data_dir = ""  # output of `python -m bertjax dataset` (has creation.json)
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.max_seq_length = a.seq  # must equal the data's max_seq_length
  c.data.max_predictions_per_seq = a.preds  # must equal the data's; 0 = ceil(max_seq_length · masked_lm_prob)
  c.data.masked_lm_prob = a.mask  # used when the data is (re)made, and by dynamic masking
  # nsp_pairs (the original) | full_sentences | doc_sentences (RoBERTa's): how the data must have been made
  c.data.example_mode = "nsp_pairs"
  c.data.eval_masked_lm_prob = 0.0  # held-out masking rate, re-masked once; 0 = as the data was made
  c.data.whole_word_mask = a.wwm  # used when the data is made, and by dynamic masking
  c.data.dynamic_masking = a.dynamic  # redraw masks in the pipeline each time an example is read
  c.data.prefetch = 2  # batches prepared ahead in a background thread
  # Shards shuffled across at once (data/pretraining/order.py); 0 = the whole split. Data in a bucket larger than the
  # local cache is read window by window, this window's shards and the next's in the cache (docs/scaling.md).
  c.data.shuffle_window = 0
  c.data.cache_limit = ""  # local disk for a bucket's shards, e.g. "8G"; "" = $BERTJAX_CACHE_LIMIT, else 4G
  c.data.packing = False  # pack several examples per row (block-diagonal attention, per-example NSP)
  c.data.pack_max_per_row = 4  # examples per packed row at most
  c.data.pack_row_predictions = 0  # masked positions per packed row; 0 = max_predictions_per_seq + pack_max_per_row
  c.data.masked_lm_prob_end = 0.0  # dynamic masking: the rate falls (or rises) linearly to this; 0 = constant
  # Several data folders (`bertjax dataset` outputs) by name, for mixtures: {"web": DIR, "code": DIR}; a phase's
  # `mixture` weighs them. Empty: data.data_dir alone.
  c.data.sources = ml_collections.ConfigDict()
  c.data.when_exhausted = "repeat"  # a source read to its end: repeat (a new order) | stop (the run ends there)
  c.data.eval_dir = ""  # the held-out split's folder; "" = data.data_dir (or the first phase's first source)

  c.train = ml_collections.ConfigDict()
  c.train.global_batch_size = a.batch  # sequences per optimizer step, over all devices
  c.train.grad_accum_steps = 1  # micro-batches per step (the batch is split; the gradient is exactly the same)
  c.train.num_steps = a.steps  # optimizer steps in all
  # Linear warmup from 0, then linear decay to 0 at num_steps (the original's schedule): 10,000 steps, or a tenth
  # of a shorter run (steps=20 warms up for 2, not for 10,000 steps it never reaches).
  c.train.warmup_steps = min(10_000, a.steps // 10)
  c.train.learning_rate = 1e-4  # peak learning rate
  c.train.optimizer = a.opt  # adamw | lamb
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.adam_bias_correction = False  # the original's update (no bias correction; matters only in warmup)
  # linear: the original's lr·(1 − t/T) after warmup | linear_from_warmup (HF's) | cosine | wsd | constant
  c.train.schedule = "linear"
  c.train.decay_fraction = 0.1  # wsd: the last fraction of the steps decays
  c.train.decay_shape = "linear"  # wsd: linear | cosine | sqrt (1 - √progress)
  c.train.final_lr_ratio = 0.0  # cosine, wsd: end at learning_rate · this
  c.train.weight_decay = 0.01  # decoupled, not applied to LayerNorm parameters or biases
  c.train.grad_clip_norm = 1.0  # clip by global norm (0 disables)
  c.train.fused_update = True  # clipping + AdamW in one pass per parameter (False: optax chain, same maths and state)
  c.train.ema_decay = 0.0  # keep an exponential moving average of the weights (e.g. 0.999); 0 = none
  # Batch-size warmup: the global batch ramps from batch_warmup_from to global_batch_size over this many token
  # slots (sequences x length), in batch_warmup_levels sizes (compiled shapes); 0 = no ramp.
  c.train.batch_warmup_tokens = 0
  c.train.batch_warmup_from = 0
  c.train.batch_warmup_levels = 4
  c.train.use_nsp = a.nsp  # L = L_MLM + L_NSP; False trains on L_MLM alone (the NSP ablation)
  c.train.stop_after_steps = 0  # stop (with a checkpoint) after this many steps in this run; 0 = run to num_steps
  c.train.prng_impl = "threefry2x32"  # dropout bits: threefry2x32 (portable) | rbg | unsafe_rbg (faster on GPU/TPU)

  c.log_every = 100  # steps between console/TensorBoard logs (also when non-finite values are checked)
  c.eval_every = 10_000  # steps between evaluations on the held-out split (0: only at the end)
  c.eval_batches = 100  # batches per evaluation (0: the whole split)
  c.checkpoint_every = 10_000  # steps between checkpoints
  c.keep_checkpoints = 3  # most recent checkpoints kept
  c.init_checkpoint = ""  # when the workdir has no checkpoint: a bertjax workdir or an HF safetensors folder
  c.init_step = 0  # a bertjax workdir's step to start from; 0 = its newest
  c.init_optimizer = "reset"  # keep: a bertjax workdir's optimizer state too (annealing it); reset: params only
  # Phases (bertjax/core/phases.py): phase_order "stable,decay" runs config.phases.stable then .decay, each a
  # common.phase(...) with its own length, sequence length, batch, mixture, masking, rotary θ and learning-rate
  # segment; "" = one phase of the settings above. configs/modernbert_phases.py and configs/mmbert.py are recipes.
  c.phases = ml_collections.ConfigDict()
  c.phase_order = ""
  c.peak_tflops_per_device = 0.0  # for MFU; 0 = the chip's known bf16 peak, or measured jnp.dot on CPU
  c.predict_examples = ("the [MASK] of the function is returned .",)  # fill-in-the-blank shown after training

  c.sharding = common.sharding(a.shard, a.tp)
  c.lock()
  return c
