"""Checkpoints: folder layout and formats (`checkpoint_paths`, the leaf), readers of Hugging Face
and T5X-native checkpoints, the T5X-native writer, Orbax saving and resuming (`checkpoints`), the
one loader of parameters from any path (`checkpoint_loaders`), the best checkpoint by a logged
metric, the run record (`run_info`), one training at a time per MODEL_DIR (`run_lock`) and the
Hugging Face export.

Imports: the engine (network config, partitioning), the data wing's vocabularies, and other
checkpointing modules; nothing of evaluation or stores; TensorFlow only inside functions.
"""
