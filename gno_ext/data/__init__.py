"""Dataset presets (the paper's protocols), the generator and the writer in The Well's layout."""

from gno_ext.data.generate import dataset_info, default_cache, default_root, generate
from gno_ext.data.mesh import generate_advection_mesh, generate_heat_mesh
from gno_ext.data.presets import PRESETS, Preset, SplitPlan, Trajectory, get_preset
from gno_ext.data.simulate import simulate
from gno_ext.data.writer import write_well_file

__all__ = ["PRESETS", "Preset", "SplitPlan", "Trajectory", "dataset_info", "default_cache", "default_root",
           "generate",
           "generate_advection_mesh", "generate_heat_mesh", "get_preset", "simulate", "write_well_file"]
