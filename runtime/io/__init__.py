"""What crosses the engine's edge: sampling parameters, building a tokenized
``Request`` from a prompt (every check that raises happens here, in the caller's
thread), and incremental detokenization."""

from radixlm.runtime.io.detokenizer import DetokenizeResult, IncrementalDetokenizer
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = ["DetokenizeResult", "IncrementalDetokenizer", "RequestBuilder", "SamplingParams"]
