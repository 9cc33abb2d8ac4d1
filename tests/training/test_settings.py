"""`gno_ext.training.settings`: one definition of the loop's settings, equal to the recipes' YAML,
checked once with messages that name the key."""

from pathlib import Path

import pytest
import yaml

from gno_ext.training.settings import (
    DataSettings,
    EvalSettings,
    OptimizerSettings,
    Settings,
    TrainerSettings,
    defaults,
)

CONF = Path(__file__).resolve().parents[2] / "recipes" / "conf"


@pytest.mark.parametrize("cls,path", [(TrainerSettings, "trainer/default.yaml"),
                                      (OptimizerSettings, "optimizer/adamw.yaml")])
def test_the_recipes_yaml_lists_every_setting_with_its_default(cls, path):
    assert yaml.safe_load((CONF / path).read_text()) == defaults(cls)


@pytest.mark.parametrize("source", sorted(p.stem for p in (CONF / "data").glob("*.yaml")))
def test_every_data_source_of_the_recipes_is_a_data_setting(source):
    """Each ``recipes/conf/data/*.yaml`` holds data settings only, of their types (the values the
    recipe sets, ``???`` and ``${size}``, aside)."""
    given = yaml.safe_load((CONF / "data" / f"{source}.yaml").read_text())
    known = {k: v for k, v in given.items() if v != "???" and not str(v).startswith("${")}
    data = Settings.from_config({"data": known}).data
    assert data.kind == source and set(given) <= set(defaults(DataSettings))


def test_the_recipes_eval_section_lists_every_eval_setting_with_its_default():
    assert yaml.safe_load((CONF / "config.yaml").read_text())["eval"] == defaults(EvalSettings)


def test_absent_keys_take_the_defaults_and_given_ones_are_converted():
    s = Settings.from_config({"trainer": {"epochs": 10, "clip_grad": 2, "dro": {"bins": 4.0}},
                              "optimizer": {"betas": [0.8, 0.9]}, "model": {"name": "gno", "balance_weight": 0.01}})
    assert s.trainer.epochs == 10 and s.trainer.batch_size == 32 and s.trainer.clip_grad == 2.0
    assert s.trainer.dro.bins == 4 and isinstance(s.trainer.dro.bins, int)
    assert s.trainer.dro.tau == 1.0 and s.trainer.dro.temperature == "absolute" and s.trainer.dro.weights == "batch"
    assert s.optimizer.betas == (0.8, 0.9) and s.optimizer.lr == 1e-3 and s.balance_weight == 0.01
    assert s.warmup_epochs == 7  # 0.7 of 10 epochs
    assert Settings.from_config({"trainer": {"curriculum": {"warmup_epochs": 2}}}).warmup_epochs == 2
    assert Settings.from_config({}) == Settings()


@pytest.mark.parametrize("cfg,message", [
    ({"trainer": {"dro": {"tua": 2}}}, r"trainer.dro.tua: no such setting; did you mean trainer.dro.tau\?"),
    ({"trainer": {"epoch": 2}}, r"trainer.epoch: no such setting; did you mean trainer.epochs\?"),
    ({"optimizer": {"zzz": 1}}, "optimizer.zzz: no such setting; the settings are name, lr, "),
    ({"trainer": {"precision": "fp32"}}, "trainer.precision: expected one of auto, bf16, fp16, no, got 'fp32'"),
    ({"trainer": {"find_unused_parameters": "yes"}},
     "trainer.find_unused_parameters: expected one of auto, true, false, got 'yes'"),
    ({"trainer": {"progress": 1}}, "trainer.progress: expected true or false, got 1"),
    ({"trainer": {"max_steps": 0}}, r"trainer.max_steps: expected an integer >= 1 or null, got 0"),
    ({"trainer": {"val_batch_size": 0}}, r"trainer.val_batch_size: expected an integer >= 1 or null, got 0"),
    ({"trainer": {"batch_size": True}}, "trainer.batch_size: expected an integer >= 1, got True"),
    ({"trainer": {"ema": 3}}, "trainer.ema: expected a mapping of settings, got 3"),
    ({"optimizer": {"betas": [0.9]}}, r"optimizer.betas: expected two numbers in \[0, 1\), got \[0.9\]"),
    ({"trainer": {"compile_options": 1}}, "trainer.compile_options: expected a mapping of inductor options, got 1"),
    ({"model": {"balance_weight": -1}}, "model.balance_weight: expected a number >= 0, got -1"),
    # the evaluation's settings and the seed, checked before training rather than after it
    ({"eval": {"steps": 0}}, "eval.steps: expected an integer >= 1, got 0"),
    ({"eval": {"batch_size": 0}}, "eval.batch_size: expected an integer >= 1, got 0"),
    ({"eval": {"max_trajectories": 0}}, "eval.max_trajectories: expected an integer >= 1 or null, got 0"),
    ({"eval": {"split": "tests"}}, "eval.split: expected one of test, valid, train, got 'tests'"),
    ({"eval": {"stpes": 3}}, r"eval.stpes: no such setting; did you mean eval.steps\?"),
    ({"seed": 1.7}, "seed: expected an integer >= 0, got 1.7"),
    ({"seed": -1}, "seed: expected an integer >= 0, got -1"),
    # the data section, typed and checked like the others
    ({"data": {"kind": "zarr"}}, "data.kind: expected one of generated, mesh, the_well, pdebench, custom, got 'zarr'"),
    ({"data": {"n_steps_input": 0}}, "data.n_steps_input: expected an integer >= 1, got 0"),
    ({"data": {"in_memory": "maybe"}}, "data.in_memory: expected one of auto, true, false, got 'maybe'"),
    ({"data": {"in_memory_limit_gb": 0}}, "data.in_memory_limit_gb: expected a number above 0, got 0"),
    ({"data": {"split_fractions": [0.5, 0.5]}}, r"data.split_fractions: expected three proportions >= 0"),
    ({"data": {"split_fractions": [0, 0, 0]}}, r"data.split_fractions: expected three proportions >= 0"),
    ({"data": {"log_params": [1]}}, r"data.log_params: expected a list of true or false or null, got \[1\]"),
    ({"data": {"domains": "annulus"}}, "data.domains: expected a list of names, got 'annulus'"),
    ({"data": {"root": 3}}, "data.root: expected text or null, got 3"),
    ({"data": {"presett": "heat-param"}}, r"data.presett: no such setting; did you mean data.preset\?"),
])
def test_a_bad_setting_is_named(cfg, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_config(cfg)


def test_cpu_threads_are_the_free_cores_shared_by_the_processes(monkeypatch):
    from gno_ext.training.setup import choose_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert choose_cpu_threads(None, cores=2, load=0.0) == 2  # an idle machine: every core
    assert choose_cpu_threads(None, cores=2, load=2.1) == 1  # both cores busy elsewhere: one thread, not two
    assert choose_cpu_threads(None, cores=16, load=3.8) == 12
    assert choose_cpu_threads(None, world=4, cores=16, load=0.0) == 4  # four processes share the cores
    assert choose_cpu_threads(None, world=4, cores=2, load=0.0) == 1
    assert choose_cpu_threads(3, cores=2, load=5.0) == 3  # trainer.cpu_threads set: taken as given
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    import torch
    assert choose_cpu_threads(None, cores=16, load=0.0) == torch.get_num_threads()  # yours wins
