"""Reusable GNO building blocks.

`GatedSpectralConv`, `FullPrecisionSpectralConv` (and `condition_on`, `checkpoint_blocks`) need the optional
``neuraloperator`` package, and the graph layers (`GraphAttentionKernel`, `GraphKernelIntegral`,
`GraphKernelMixture`, `GraphBoundaryTransfer`) the optional ``torch-geometric``; they are
imported on first use.
"""

from gno_ext.layers.attention import (
    AttentionKernel,
    AttentionKernelBank,
    chunk_plan,
    default_chunk,
    mixed_attention,
)
from gno_ext.layers.boundary import BoundaryTransfer, boundary_features, edge_tokens
from gno_ext.layers.embeddings import (
    ConvRefine,
    GridCoordinates,
    ParameterNormalizer,
    PatchEmbed,
    PatchProject,
    field_statistics,
    sincos_position,
    token_shape,
    use_grid_coordinates,
)
from gno_ext.layers.gate import ParameterGate, Routing, balance_losses, plan_all, record_balance_loss, route_all
from gno_ext.layers.mixture import GatedKernelMixture, dispatch, reference_mixture

__all__ = [
    "AttentionKernel",
    "AttentionKernelBank",
    "BoundaryTransfer",
    "ConvRefine",
    "FullPrecisionSpectralConv",
    "GatedKernelMixture",
    "GatedSpectralConv",
    "GraphAttentionKernel",
    "GraphBoundaryTransfer",
    "GraphKernelIntegral",
    "GraphKernelMixture",
    "GridCoordinates",
    "ParameterGate",
    "ParameterNormalizer",
    "PatchEmbed",
    "PatchProject",
    "Routing",
    "balance_losses",
    "boundary_features",
    "checkpoint_blocks",
    "chunk_plan",
    "condition_on",
    "default_chunk",
    "dispatch",
    "edge_tokens",
    "field_statistics",
    "mixed_attention",
    "reference_mixture",
    "plan_all",
    "record_balance_loss",
    "route_all",
    "sincos_position",
    "token_shape",
    "use_grid_coordinates",
]

_LAZY = {"FullPrecisionSpectralConv": "spectral", "GatedSpectralConv": "spectral", "condition_on": "spectral",
         "checkpoint_blocks": "spectral",
         "GraphAttentionKernel": "graph", "GraphBoundaryTransfer": "graph", "GraphKernelIntegral": "graph",
         "GraphKernelMixture": "graph"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"gno_ext.layers.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gno_ext.layers' has no attribute {name!r}")
