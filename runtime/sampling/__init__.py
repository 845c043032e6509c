"""Turning logits into next tokens: penalties, temperature, top-k/p, min-p, the
grammar bitmask and seeded draws (``Sampler``), row by row as ``SamplingRow`` says;
and verifying speculative proposals against them (``Verifier``)."""

from radixlm.runtime.sampling.sampler import SampleOutput, Sampler, SamplingRow
from radixlm.runtime.sampling.verify import Verifier, VerifyOutput, VerifyRow

__all__ = ["SampleOutput", "Sampler", "SamplingRow", "Verifier", "VerifyOutput", "VerifyRow"]
