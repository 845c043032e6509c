"""Turning logits into next tokens: penalties, temperature, top-k/p, min-p, the
grammar bitmask and seeded draws (``Sampler``), row by row as ``SamplingRow`` says."""

from radixlm.runtime.sampling.sampler import SampleOutput, Sampler, SamplingRow

__all__ = ["SampleOutput", "Sampler", "SamplingRow"]
