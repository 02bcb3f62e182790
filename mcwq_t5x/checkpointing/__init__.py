"""Checkpoints: folder layout and formats (`checkpoint_paths`, the leaf), readers of Hugging Face
and T5X-native checkpoints, the T5X-native writer, Orbax saving and resuming (`checkpoints`), the
one loader of parameters from any path (`checkpoint_loaders`), the best checkpoint by a logged
metric, the run record (`run_info`), one training at a time per MODEL_DIR (`run_lock`), the
Hugging Face export, and a training run's checkpoint settings and first state
(`train_state_init`) and its loop of steps, log lines, evaluations, checkpoints and preemption
(`train_loop`).

Imports: the engine (network config, partitioning, the trainer, preemption, the process watch),
the data wing's vocabularies, pipeline and training data, and other checkpointing modules; nothing
of evaluation or stores (the loop's evaluation is a callable it is given); TensorFlow only inside
functions.
"""
