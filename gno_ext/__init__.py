"""gno_ext: the Generalized Neural Operator for parametric boundary-value problems."""

from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, PDESample, collate

__version__ = "0.1.0"

__all__ = ["BCType", "BoundarySpec", "Grid", "PDEBatch", "PDESample", "collate", "__version__"]
