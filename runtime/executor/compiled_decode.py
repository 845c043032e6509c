"""Decode steps through a ``torch.compile``'d model forward (``enable_torch_compile``).

A decode step of a small model on CPU is a few hundred tiny ops around the
matmuls (norms, RoPE, SwiGLU, attention glue), each paying eager torch's
dispatch cost. Inductor fuses them into a handful of C++ loops, and its C++
wrapper calls those and the matmul kernels without Python in between.

Only passes of decode rows with at most ``max_batch_size`` rows, the longest
with at least ``MIN_PREFIX`` cached tokens (and, on a backend that pads rows,
rows x longest at most ``MAX_PADDED_KV``), take this path (every other pass
runs the eager model, which is the same code). Attention runs in the backend's
staged form (``StagedDecodeMetadata``, or ``KernelStagedDecodeMetadata`` with the
C++ kernel as an opaque op): inside the graph it reads the KV pool and stages
the new K/V; ``commit`` writes them to the pool after the graph. The graph is
compiled with dynamic shapes, so one graph serves every batch size from 2 up and
every context length; batch size 1 gets its own. ``warm_up`` compiles both before
the first request, so requests do not wait on a compile. A cold compile takes one
to two minutes per graph on 2 cores (float32; bfloat16 longer); inductor caches
the result on disk (``TORCHINDUCTOR_CACHE_DIR``, default under the system temp
dir), after which the warm-up takes well under a minute.

On CPU inductor needs a C++ compiler (g++ or clang) and the Python headers.
"""

from __future__ import annotations

import logging
import time

import torch
from torch.fx.experimental import _config as shape_config

from radixlm.runtime.attention import AttentionBackend, AttentionInputs, AttentionMetadata
from radixlm.runtime.config import ConfigError
from radixlm.runtime.executor.forward_batch import ForwardBatch

__all__ = ["CompiledDecode", "MIN_PREFIX", "MAX_PADDED_KV"]

logger = logging.getLogger(__name__)

# torch.compile specialises sizes 0 and 1: a pass whose longest row has fewer
# cached tokens (a one-token prompt's prefill and first decode step) would
# compile a graph of its own, so such passes run eager.
MIN_PREFIX = 2

# The torch backend's compiled attention pads every row to the longest and
# gathers all rows' K/V at once; its eager one groups rows by length. The
# compiled step wins while rows x longest cached tokens is small and loses ever
# more above about this many (benchmarks/README.md, "CPU engine
# choices"), so with that backend such passes run eager; the cpu backend's
# kernel pads nothing.
MAX_PADDED_KV = 3072


class CompiledDecode:
    """Runs eligible decode passes through the compiled model; see the module doc."""

    def __init__(
        self, model: torch.nn.Module, backend: AttentionBackend, max_batch_size: int
    ) -> None:
        self.model = model
        self.backend = backend
        self.max_batch_size = max_batch_size
        # The model's modules and weights never change after loading, so dynamo's
        # guards on them (hundreds of checks on every call, a visible share of a
        # step: benchmarks/README.md, "CPU engine choices") are
        # dropped; the guards on the inputs stay.
        options: dict = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        if _on_cpu(model):
            options["cpp_wrapper"] = True
        self._forward = torch.compile(model, dynamic=True, fullgraph=True, options=options)
        self.passes = 0  # passes run compiled

    def accepts(self, batch: ForwardBatch) -> bool:
        """Whether this pass is decode rows only, no more than ``max_batch_size``,
        the longest with ``MIN_PREFIX`` cached tokens or more (and, where the
        backend pads, ``MAX_PADDED_KV / rows`` or fewer)."""
        extend = batch.attn.extend_lens
        rows = extend.numel()
        if rows > self.max_batch_size or not bool((extend == 1).all()):
            return False
        longest = int(batch.attn.prefix_lens.max())
        if self.backend.pads_staged_rows and rows * longest > MAX_PADDED_KV:
            return False
        return MIN_PREFIX <= longest

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """One accepted pass: (B, hidden) final hidden states; the K/V land in the pool."""
        metadata = self.backend.prepare_staged_decode(batch.attn)
        hidden = self._call(batch.input_ids, batch.positions, metadata)
        self.backend.commit(metadata)
        self.passes += 1
        return hidden

    def warm_up(self) -> None:
        """Compiles the graphs for batch size 1 and for 2 and up, on dummy rows.

        Nothing is committed, so the pool is untouched: the dummy rows attend to
        the first slots of ``req_to_token`` row 0 (valid slot ids whatever they
        hold; the output is thrown away). Their prefix is ``MIN_PREFIX`` tokens
        long, the shortest a compiled pass has. The dummy inputs are made outside
        inference mode and the metadata inside it, as the scheduler and
        ``ModelRunner.run`` make theirs: torch.compile guards on that too.
        """
        device = self.backend.kv_pool.k.device  # where ModelRunner.run puts a pass
        for batch_size in sorted({1, min(2, self.max_batch_size)}):
            start = time.perf_counter()
            # Distinct tensors, as in a real pass: the graph guards on which
            # inputs are the same tensor object.
            zeros = torch.zeros(batch_size, dtype=torch.int64, device=device)
            inputs = AttentionInputs(
                rows=zeros.clone(),
                prefix_lens=torch.full_like(zeros, MIN_PREFIX),
                extend_lens=torch.ones_like(zeros),
                out_cache_loc=zeros.clone(),
            )
            positions = inputs.prefix_lens.clone()
            with torch.inference_mode():
                metadata = self.backend.prepare_staged_decode(inputs)
                try:
                    self._call(zeros, positions, metadata)
                except Exception as e:  # no C++ compiler, unsupported op, ...
                    detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    raise ConfigError(
                        "enable_torch_compile: compiling the decode step failed "
                        f"({type(e).__name__}: {detail}); torch.compile on CPU needs a "
                        "C++ compiler and the Python headers"
                    ) from e
            logger.info(
                "compiled the decode step for batch size %d in %.1f s",
                batch_size,
                time.perf_counter() - start,
            )

    def _call(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        # No duck sizing: by default torch.compile gives input sizes of equal value
        # one symbol, so a warm-up whose mask happened to be as wide as the model
        # has KV heads would tie the mask width to that constant (one graph per
        # context length). Patched per call, not process-wide.
        with shape_config.patch(use_duck_shape=False):
            return self._forward(input_ids, positions, metadata)


def _on_cpu(model: torch.nn.Module) -> bool:
    return next(model.parameters()).device.type == "cpu"
