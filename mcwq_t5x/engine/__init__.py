"""The engine: the T5.1.1/mT5 network with T5X's parameter names and logical axes, the
encoder-decoder model (decoding; its loss fused with the output layer in `losses`), the
attention masks, the trainer and the partitioner (device mesh, shardings),
the CPU settings of the mains, a SIGTERM's checkpoint (`preemption`), the watch of the other
processes of a multi-process run (`process_watch`) and the model FLOPs of a training step against
the machine's measured matmul peak (`flops`).

Imports: JAX, Flax, Optax, NumPy and other engine modules; nothing of MCWQ (`data`), of
checkpoints, evaluation or stores, and no TensorFlow or SeqIO (the GPU image has neither).
"""
