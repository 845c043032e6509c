"""Tensor parallelism over ``torch.distributed``: which slice of the model each rank
holds (``sharding``), the ranks' collectives (``group``), and the rank processes that
follow rank 0's passes (``ranks``). Imported only by a tensor-parallel engine."""

from radixlm.runtime.distributed.sharding import ShardingError, ShardPlan

__all__ = ["ShardPlan", "ShardingError"]
