"""Training and evaluation behind the recipes (``recipes/train.py``, ``recipes/evaluate.py``).

`train` runs one resolved recipe configuration under Accelerate (`Settings`: the keys it reads
and their defaults); `evaluate_run` rolls a model out on a test split and writes the report.
The pieces (the distributed DRO objective, the curriculum's batch sampler, DRO groups,
checkpoints, the set-up and the steps) are importable on their own.
"""

from gno_ext.training.captured import capture_step
from gno_ext.training.checkpoint import (
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gno_ext.training.evaluate import (
    evaluate_rollouts,
    evaluate_run,
    evaluate_saved,
    write_report,
)
from gno_ext.training.flat import FlatParameters
from gno_ext.training.loop import run_dir_of, train
from gno_ext.training.objective import (
    NonFiniteGuard,
    NonFiniteLossError,
    choose_precision,
    global_objective,
)
from gno_ext.training.recipe_data import (
    CurriculumBatchSampler,
    DataSpec,
    GroupBinner,
    data_spec,
    open_split,
)
from gno_ext.training.settings import Settings
from gno_ext.training.setup import compile_model

__all__ = ["train", "Settings", "compile_model", "capture_step", "evaluate_run", "evaluate_saved", "run_dir_of",
           "global_objective", "NonFiniteGuard", "NonFiniteLossError", "choose_precision", "CurriculumBatchSampler",
           "GroupBinner", "DataSpec", "data_spec", "open_split", "FlatParameters", "save_training_checkpoint",
           "load_training_checkpoint", "latest_checkpoint", "evaluate_rollouts", "write_report"]
