"""Pre-training: mesh -> sharded state -> one jitted step -> periodic log / eval / checkpoint, phase by phase.

`checks` (every check of the config, before anything compiles), `plan` (what each phase reads and runs: sources,
mixtures, masking, model switches), `start` (an init checkpoint's params, or its whole state to anneal from),
`loop` (the trainers, the pipeline and the run on the skeleton every mode shares, `bertjax.run`).
"""
from bertjax.pretrain.checks import ConfigError, granularity, resolve, validate
from bertjax.pretrain.loop import (
                                   build,
                                   eval_source,
                                   evaluate,
                                   train_and_evaluate,
)
from bertjax.pretrain.start import HEAD_NAMES, fit_init_params, load_init_params

__all__ = ["ConfigError", "granularity", "resolve", "validate", "build", "eval_source", "evaluate",
           "train_and_evaluate", "HEAD_NAMES", "fit_init_params",
           "load_init_params"]
