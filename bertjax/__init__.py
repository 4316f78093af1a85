"""bertjax: BERT pretraining and fine-tuning in JAX/Flax, from one CPU to a TPU pod."""
import os

__version__ = "0.1.0"

# JAX's persistent compilation cache for the command-line tools, unless JAX_COMPILATION_CACHE_DIR names another
# folder (an empty value turns it off).
COMPILE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "bertjax-xla")
