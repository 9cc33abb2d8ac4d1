"""Training and evaluation behind the recipes (``recipes/train.py``, ``recipes/evaluate.py``).

`train` runs one resolved recipe configuration under Accelerate; `evaluate_run` rolls a model
out on a test split and writes the report. The pieces (the distributed DRO objective, the
curriculum's batch sampler, DRO groups, checkpoints) are importable on their own.
"""

from gno_ext.training.checkpoint import (
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gno_ext.training.data import (
    CurriculumBatchSampler,
    DataSpec,
    GroupBinner,
    data_spec,
    open_split,
)
from gno_ext.training.evaluate import evaluate_rollouts, write_report
from gno_ext.training.flat import FlatParameters
from gno_ext.training.loop import capture_step, compile_model, evaluate_run, evaluate_saved, run_dir_of, train
from gno_ext.training.objective import (
    NonFiniteGuard,
    NonFiniteLossError,
    choose_precision,
    global_objective,
)

__all__ = ["train", "compile_model", "capture_step", "evaluate_run", "evaluate_saved", "run_dir_of", "global_objective", "NonFiniteGuard", "NonFiniteLossError",
           "choose_precision", "CurriculumBatchSampler", "GroupBinner", "DataSpec", "data_spec", "open_split",
           "FlatParameters", "save_training_checkpoint", "load_training_checkpoint", "latest_checkpoint", "evaluate_rollouts",
           "write_report"]
