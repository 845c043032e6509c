"""Running a ``ForwardBatch`` through the model: the ``ModelRunner`` and its forward
paths (the eager model, the CPU few-row kernels, the compiled decode step), the
CPU thread set-up, and which path each pass kind takes on this CPU (``CpuPaths``).

``ForwardBatch`` / ``ModelOutput`` are the one contract with the scheduler."""

from radixlm.runtime.executor.forward_batch import ForwardBatch, ModelOutput, TokenLogprob
from radixlm.runtime.executor.model_runner import ModelRunner, PassCounts

__all__ = ["ForwardBatch", "ModelOutput", "ModelRunner", "PassCounts", "TokenLogprob"]
