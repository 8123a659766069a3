"""CPU stand-ins for the two CUDA-only parts of TRL 1.16's AsyncGRPOTrainer, so the real trainer runs on a CPU.

1. Its tree attention: the trainer packs a micro-batch into a prefix trie and runs attention through the FA3
   varlen kernel (`kernels-community/flash-attn3`, fetched from the Hub, CUDA only) under the name `tree_fa3`.
   `cpu_tree_attention` is the same computation in plain PyTorch: each packed sequence's queries attend
   causally (aligned to the end, as FA's varlen causal mask) to the keys and values of its root-to-sequence
   path (`tree_kv_index`).
2. Its MFU set-up asks `torch.cuda.get_device_name`, which raises without CUDA; on the CPU the peak FLOPs
   are unknown, which the trainer already handles (MFU metrics off).
`cpu_async_grpo_trainer(**kwargs)` builds an `AsyncGRPOTrainer` with both in place. For CPU runs and tests only.
"""

from __future__ import annotations

from typing import Any


def cpu_tree_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *, tree_kv_index: Any,
                       tree_cu_seqlens_q: Any, tree_cu_seqlens_k: Any, tree_max_seqlen_q: Any = None,
                       tree_max_seqlen_k: Any = None, scaling: float | None = None, sliding_window: int | None = None,
                       softcap: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """TRL's `tree_attention` contract: query/key/value `(1, heads, tokens, dim)` in, `(1, tokens, heads, dim)` out."""
    import torch
    import torch.nn.functional as F

    if softcap:
        raise NotImplementedError("cpu_tree_attention does not implement attention soft-capping")
    q = query[0]
    k = key[0].index_select(1, tree_kv_index)
    v = value[0].index_select(1, tree_kv_index)
    if q.shape[0] != k.shape[0]:  # grouped-query attention: each key head serves several query heads
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    out = torch.empty_like(q)
    starts_q, starts_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for sequence in range(len(starts_q) - 1):
        q0, q1, k0, k1 = starts_q[sequence], starts_q[sequence + 1], starts_k[sequence], starts_k[sequence + 1]
        rows = torch.arange(q1 - q0).unsqueeze(1) + (k1 - k0) - (q1 - q0)  # each query's own position on the path
        cols = torch.arange(k1 - k0).unsqueeze(0)
        mask = cols <= rows
        if sliding_window:
            mask &= cols > rows - sliding_window
        out[:, q0:q1] = F.scaled_dot_product_attention(q[:, q0:q1], k[:, k0:k1], v[:, k0:k1], attn_mask=mask, scale=scaling)
    return out.transpose(0, 1).unsqueeze(0), None


def use_cpu_tree_attention() -> None:
    """Register `cpu_tree_attention` under TRL's tree-attention name (after the trainer's constructor, which
    registers the CUDA kernel under it)."""
    from transformers import AttentionInterface

    from gym_bridge.trl._async.seams import tree_attention_name

    AttentionInterface.register(tree_attention_name(), cpu_tree_attention)


def cpu_async_grpo_trainer(**kwargs: Any) -> Any:
    """`AsyncGRPOTrainer(**kwargs)` that trains on the CPU (see the module docstring)."""
    import importlib
    from unittest import mock

    from gym_bridge.trl._async.seams import async_seams

    trainer_class = async_seams().trainer
    module = importlib.import_module(trainer_class.__module__)
    with mock.patch.object(module, "get_peak_flops_per_device", lambda accelerator, dtype: None):
        trainer = trainer_class(**kwargs)
    use_cpu_tree_attention()
    return trainer
