"""llama.cpp (``llama-cpp-python``) as a side of bench_peers.py, run with the Python of
its own virtual environment (built natively: benchmarks/README.md, "How to run them"); imports
only llama_cpp and the standard library. It serves the GGUF file it is given, with
the token ids the parent wrote (the same tokenizer: the file's own vocabulary).

Usage (by bench_peers.py): LLAMA_PYTHON llamacpp_side.py GGUF_PATH WORKLOADS_JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workloads import Call, Unsupported, serve  # noqa: E402


class LlamaCppSide:
    """One sequence at a time (llama-cpp-python has no batched generate); its prompt
    cache is cleared before each workload, so a repeated prompt is prefilled again."""

    def __init__(self, gguf_path: str) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=gguf_path, n_ctx=2048, n_batch=512, n_threads=2, verbose=False)

    def generate(self, call: Call) -> int:
        if call.json_schema is not None:
            raise Unsupported  # its grammar path is measured in peers.md, not here
        made = 0
        for prompt in call.prompts:
            self.llm.reset()
            for n, _ in enumerate(self.llm.generate(prompt, temp=0.0, reset=True), start=1):
                if n == call.max_new_tokens:  # EOS ignored: forced calls take every token
                    break
            made += n
        return made

    def reset(self) -> None:
        self.llm.reset()

    def warm_up(self) -> None:
        self.generate(Call([[100, 200, 300, 400]], 4, forced=True))


if __name__ == "__main__":
    serve(LlamaCppSide(sys.argv[1]), Path(sys.argv[2]))
