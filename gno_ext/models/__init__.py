"""Complete models behind one registry: `get_model(name, **kwargs)`.

`GatedFNO` and `GNOFNO` need the optional ``neuraloperator`` package, and ``gno_mesh`` (the GNO
on irregular domains) the optional ``torch-geometric``; they are imported on first use.
"""

from gno_ext.models import baselines  # noqa: F401  (registers the baselines)
from gno_ext.models.gno import GNO, GNOBlock
from gno_ext.models.registry import (
    MissingDependencyError,
    available_models,
    from_checkpoint,
    get_model,
    model_class,
    register_lazy,
    save_checkpoint,
)
from gno_ext.models.rollout import rollout


def _load_gated_fno() -> None:
    import gno_ext.models.gated_fno  # noqa: F401  (registers "gated_fno")


def _load_gno_fno() -> None:
    import gno_ext.models.gno_fno  # noqa: F401  (registers "gno_fno")


def _load_gno_mesh() -> None:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        raise MissingDependencyError("model gno_mesh needs torch-geometric: pip install torch-geometric "
                          "(or the project's extra: pip install -e '.[mesh]')") from None
    import gno_ext.models.gno_mesh  # noqa: F401  (registers "gno_mesh")


def _load_mesh_gnn() -> None:
    _load_gno_mesh()  # the same dependency, named the same way
    import gno_ext.models.mesh_gnn  # noqa: F401  (registers "mesh_gnn" and "mesh_persistence")


register_lazy("gated_fno", _load_gated_fno)
register_lazy("gno_fno", _load_gno_fno)
register_lazy("gno_mesh", _load_gno_mesh)
register_lazy("mesh_gnn", _load_mesh_gnn)
register_lazy("mesh_persistence", _load_mesh_gnn)

__all__ = ["GNO", "GNOBlock", "GNOFNO", "GatedFNO", "MissingDependencyError", "available_models", "from_checkpoint", "get_model", "model_class", "rollout",
           "save_checkpoint"]


def __getattr__(name: str):
    if name == "GatedFNO":
        from gno_ext.models.gated_fno import GatedFNO

        return GatedFNO
    if name == "GNOFNO":
        from gno_ext.models.gno_fno import GNOFNO

        return GNOFNO
    raise AttributeError(f"module 'gno_ext.models' has no attribute {name!r}")
