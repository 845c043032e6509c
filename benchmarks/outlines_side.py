"""The peer baseline for bench_constrained.py: ``outlines`` + transformers.

Runs in its own venv (outlines pins its own outlines-core), reads the job as JSON on
stdin, prints one JSON line: compile time, median wall time of the batch, the texts.
Greedy, float32, one batch of all prompts (HF pads them), compact JSON whitespace
like radixlm's default.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import outlines
import torch
from outlines.types import JsonSchema
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    job = json.loads(sys.stdin.read())
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    tokenizer.padding_side = "left"
    hf = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32).eval()
    model = outlines.from_transformers(hf, tokenizer)
    start = time.perf_counter()
    generator = outlines.Generator(
        model, JsonSchema(json.dumps(job["schema"]), whitespace_pattern="")
    )
    compile_s = time.perf_counter() - start
    walls, texts = [], []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        texts = generator.batch(
            job["prompts"], max_new_tokens=job["max_new_tokens"], do_sample=False
        )
        walls.append(time.perf_counter() - start)
    print(json.dumps({"compile_s": compile_s, "wall_s": statistics.median(walls), "texts": texts}))


if __name__ == "__main__":
    main()
