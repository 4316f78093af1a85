"""bertjax: BERT pretraining and fine-tuning in JAX/Flax, from one CPU to a TPU pod."""
__version__ = "0.1.0"
