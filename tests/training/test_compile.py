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
