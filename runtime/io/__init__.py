"""What crosses the engine's edge: the typed messages (``GenerateRequest`` in,
``StreamChunk`` / ``GenerateOutput`` out, the loop's messages), sampling parameters,
building validated ``TokenizedRequest``s (every check that raises happens here, in
the caller's thread), incremental detokenization, and the model's chat template as
role blocks (``chat_template``: the DSL's and the server's)."""

from radixlm.runtime.io.detokenizer import DetokenizeResult, IncrementalDetokenizer
from radixlm.runtime.io.messages import (
    Abort,
    AddRequests,
    FinishReason,
    FlushCache,
    GenerateOutput,
    GenerateRequest,
    LogprobSpec,
    LoopMessage,
    StreamChunk,
    TokenizedRequest,
    Wake,
)
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = [
    "Abort",
    "AddRequests",
    "DetokenizeResult",
    "FinishReason",
    "FlushCache",
    "GenerateOutput",
    "GenerateRequest",
    "IncrementalDetokenizer",
    "LogprobSpec",
    "LoopMessage",
    "RequestBuilder",
    "SamplingParams",
    "StreamChunk",
    "TokenizedRequest",
    "Wake",
]
