import pytest
import torch

from gno_ext.training import compile_model


def test_compile_model_merges_mode_and_options(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    net = torch.nn.Linear(2, 2)
    assert compile_model(net, "reduce-overhead") is net
    compile_model(net, True, {})
    compile_model(net, "reduce-overhead", {"combo_kernels": True})
    compile_model(net, "max-autotune", {"coordinate_descent_tuning": False})
    assert calls[0] == {"mode": "reduce-overhead"} and calls[1] == {"mode": None}
    assert calls[2] == {"options": {"triton.cudagraphs": True, "combo_kernels": True}}
    assert calls[3]["options"]["max_autotune"] is True and calls[3]["options"]["coordinate_descent_tuning"] is False


@pytest.mark.parametrize("mode,options,match", [("fast", {"combo_kernels": True}, "compile mode 'fast'"),
                                                (True, {"combo_kernel": True}, r"\['combo_kernel'\]")])
def test_compile_model_names_a_bad_mode_or_option(mode, options, match):
    with pytest.raises(ValueError, match=match):
        compile_model(torch.nn.Linear(2, 2), mode, options)


def test_compiled_code_is_kept_for_the_next_run_in_the_chosen_folder(tmp_path, monkeypatch):
    """``trainer.compile_cache``: a folder keyed by torch version and device holds inductor's
    compiled graphs, and a second compilation of the same function (a later run: dynamo's and
    inductor's memory cleared) loads them instead of compiling again; ``off`` turns the caches
    off; ``auto`` follows $TORCHINDUCTOR_CACHE_DIR where it is set; a file is refused."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import clear_caches

    from gno_ext.training.setup import compile_cache_dir, use_compile_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(inductor_config, "fx_graph_cache", inductor_config.fx_graph_cache)
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", functorch_config.enable_autograd_cache)
    cpu = torch.device("cpu")
    folder = use_compile_cache(str(tmp_path / "cache"), cpu)
    assert folder == tmp_path / "cache" / f"torch-{torch.__version__.split('+')[0]}-cpu"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))  # (restored after the test)

    def step(x):
        return torch.relu(x @ x.T + 1).sum(1)

    x = torch.randn(8, 8)
    for run in range(2):  # two "runs": nothing but the folder carries over
        torch._dynamo.reset()
        clear_caches()
        counters.clear()
        torch.testing.assert_close(torch.compile(step)(x), step(x))
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        assert (hits, misses > 0) == (0, True) if run == 0 else hits > 0, (run, hits, misses)
    assert any(folder.rglob("*")), "the compiled code is in the folder"
    assert use_compile_cache("off", cpu) is None and not inductor_config.fx_graph_cache
    assert compile_cache_dir("auto", cpu) == folder  # $TORCHINDUCTOR_CACHE_DIR, where set
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"trainer.compile_cache=.*file: is a file, not a folder"):
        compile_cache_dir(str(tmp_path / "file"), cpu)
