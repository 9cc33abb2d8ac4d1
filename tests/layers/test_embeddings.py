import pytest
import torch

from gno_ext.layers import PatchEmbed, PatchProject, field_statistics


@pytest.mark.parametrize("ndim,shape", [(1, (24,)), (2, (8, 12)), (3, (4, 8, 4))])
def test_patch_embed_equals_its_strided_convolution_with_gradients(ndim, shape):
    """The flattened-patch product gives the convolution's tokens (and weight gradients) in
    the order of the token grid."""
    torch.manual_seed(0)
    embed = PatchEmbed(3, 16, 4, ndim)
    x = torch.randn(2, 3, *shape)
    tokens = embed(x)
    weights = torch.randn_like(tokens)
    (tokens * weights).sum().backward()
    grads = [p.grad.clone() for p in embed.parameters()]
    embed.zero_grad()
    ref = embed.proj(x).flatten(2).transpose(1, 2)
    (ref * weights).sum().backward()
    assert tokens.shape == (2, torch.Size(shape).numel() // 4 ** ndim, 16)
    assert torch.allclose(tokens, ref, atol=1e-5)
    for g, p in zip(grads, embed.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-4)


def test_patch_project_inverts_the_patch_layout_of_patch_embed():
    """A projection whose weight copies each patch value to its slot reproduces the field:
    embedding and projection use the same patch order."""
    embed, project = PatchEmbed(2, 2 * 16, 4, 2), PatchProject(2 * 16, 2, 4, 2)
    with torch.no_grad():
        embed.proj.weight.copy_(torch.eye(32).view(32, 2, 4, 4))
        embed.proj.bias.zero_()
        project.proj.weight.copy_(torch.eye(32))
        project.proj.bias.zero_()
    project.norm = torch.nn.Identity()
    x = torch.randn(3, 2, 8, 12)
    assert torch.allclose(project(embed(x), (2, 3)), x, atol=1e-6)


def test_patch_embed_rejects_a_grid_not_divisible_by_the_patch():
    with pytest.raises(ValueError, match=r"grid \(10, 12\) is not divisible by the patch size 4"):
        PatchEmbed(1, 8, 4, 2)(torch.randn(1, 1, 10, 12))


def test_patch_layers_name_bad_sizes_and_inputs():
    with pytest.raises(ValueError, match="patch: must be >= 1, got 0"):  # (was built, then failed in forward)
        PatchEmbed(1, 8, 0, 2)
    with pytest.raises(ValueError, match="ndim: expected 1, 2 or 3, got 4"):  # (was a KeyError)
        PatchProject(8, 1, 4, 4)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, 2, \*S\) with 2 spatial axes, got \(1, 3, 16, 16\)"):
        PatchEmbed(2, 8, 4, 2)(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match=r"tokens: expected shape \(B, 16, D\) on the 2-D token grid \(4, 4\)"):
        PatchProject(8, 1, 4, 2)(torch.randn(1, 15, 8), (4, 4))


def test_parameter_normalizer_checks_log_scaled_values_unless_capturing(monkeypatch):
    from gno_ext.layers.embeddings import ParameterNormalizer

    norm = ParameterNormalizer(2, log_scale=[True, False])
    assert torch.isfinite(norm(torch.tensor([[0.5, -1.0]]))).all()  # only the log-scaled one must be positive
    with pytest.raises(ValueError, match=r"theta\[0, 0\] = 0.0: a log-scaled parameter must be positive"):
        norm(torch.tensor([[0.0, 1.0]]))
    for value in (float("nan"), float("inf")):  # either parameter: a non-finite one would give a NaN model
        with pytest.raises(ValueError, match=rf"theta\[1, 1\] = {value}: parameters must be finite"):
            norm(torch.tensor([[0.5, 1.0], [0.5, value]]))
        with pytest.raises(ValueError, match="parameters must be finite"):  # fit checks its data too
            ParameterNormalizer(2).fit(torch.tensor([[0.5, 1.0], [value, 2.0]]))
    # during a CUDA graph capture the check (a device read) is skipped rather than breaking it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    norm(torch.tensor([[0.0, 1.0]]))


def test_sincos_position_spans_wavelengths_from_the_domain_to_a_64th_of_it():
    import math

    from gno_ext.layers import sincos_position

    enc = sincos_position((4,), 8)  # one axis, four frequencies: 2 pi * 64^(i / 3)
    x = (torch.arange(4, dtype=torch.float64) + 0.5) / 4
    freqs = 2 * math.pi * torch.tensor([1.0, 4.0, 16.0, 64.0], dtype=torch.float64)
    expected = torch.cat([(x[:, None] * freqs).sin(), (x[:, None] * freqs).cos()], -1)
    assert enc.shape == (4, 8) and enc.dtype == torch.float32
    # float32 angles up to 2 pi * 64 * 7/8 = 352 are rounded to about 2e-5 (twice: frequency, product)
    assert torch.allclose(enc.double(), expected, atol=1e-4)
    assert sincos_position((2, 3), 10).shape == (6, 10)  # 2-D, width cut to dim


def test_sincos_frequencies_are_made_once_per_device_in_eager_mode():
    """Eager calls reuse one frequency tensor per device: a CUDA graph capture of an eager
    model cannot copy them from the host (tests/training/test_capture.py, on a GPU)."""
    from gno_ext.layers import embeddings

    freqs = embeddings._frequencies(5, "cpu")
    assert embeddings._frequencies(5, torch.device("cpu")) is freqs
    assert embeddings._frequencies(6, "cpu") is not freqs and freqs.shape == (5,)
    assert torch.equal(embeddings.sincos_position((5,), 10), embeddings.sincos_position((5,), 10))


def test_field_statistics_per_channel_and_bad_samples():
    torch.manual_seed(0)
    u = torch.randn(6, 2, 3, 8, 8) * torch.tensor([1.0, 5.0, 0.0])[:, None, None] + torch.tensor([0.0, -2.0, 7.0])[:, None, None]
    mean, std = field_statistics(u, 3, 2)
    want = u.transpose(0, 2).reshape(3, -1)
    assert torch.allclose(mean, want.mean(1)) and torch.allclose(std[:2], want[:2].std(1))
    assert std[2] == 1e-6  # a constant channel: floored, not zero
    assert torch.equal(field_statistics(u[:, 0], 3, 2)[0], u[:, 0].transpose(0, 1).reshape(3, -1).mean(1))  # (N, C, *S)
    with pytest.raises(ValueError, match=r"u: expected 2 channel\(s\) at axis -3, after a sample axis, got shape"):
        field_statistics(u, 2, 2)
    with pytest.raises(ValueError, match="after a sample axis, got shape \\(3, 8, 8\\)"):
        field_statistics(u[0, 0], 3, 2)
    bad = u.clone()
    bad[4, 1, 2, 5, 6] = float("nan")
    bad[5, 0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"u\[4, 1, 2, 5, 6\] = nan: field samples must be finite \(2 entries are not\)"):
        field_statistics(bad, 3, 2)


@pytest.mark.parametrize("name", ["gno", "vit"])
def test_models_refuse_non_finite_training_fields(name):  # (the GNO and the baselines took NaN statistics)
    from gno_ext.models import get_model
    model = get_model(name, latent=32, patch=8, depth=1, heads=4) if name == "gno" else get_model(name)
    u = torch.randn(4, 1, 1, 16, 16)
    u[2, 0, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match=r"u\[2, 0, 0, 3, 3\] = nan: field samples must be finite"):
        model.fit_normalization(u, torch.rand(4, 1))
    assert torch.equal(model.u_std, torch.ones(1))  # left as it was


def test_conv_refine_starts_as_the_identity_and_joins_patches():
    """`ConvRefine` adds nothing at initialisation (its last convolution is zero); once trained,
    an output value depends on its neighbours across a patch edge and on the input context."""
    from gno_ext.layers import ConvRefine

    torch.manual_seed(0)
    refine = ConvRefine(channels=2, context_channels=1, hidden=8, ndim=2)
    field, context = torch.randn(3, 2, 16, 16), torch.randn(3, 1, 16, 16)
    assert torch.equal(refine(field, context), field)
    torch.nn.init.normal_(refine.out.weight)
    moved = field.clone()
    moved[:, :, 4, 4] += 1.0  # the first cell of a 4x4 patch: (3, 3), across the patch edge, changes too
    change = (refine(moved, context) - refine(field, context)).abs().sum((0, 1))
    assert change[5, 5] > 0 and change[3, 3] > 0 and change[8, 8] == 0  # two cells away (3x3 twice) and no further
    other = context.clone()
    other[:, :, 10, 10] += 1.0
    assert (refine(field, other) - refine(field, context)).abs().sum() > 0
    for ndim in (1, 3):
        shape = (2, 2, *[8] * ndim)
        assert ConvRefine(2, 0, 4, ndim)(torch.randn(shape), torch.randn(2, 0, *[8] * ndim)).shape == shape
    with pytest.raises(ValueError, match="kernel: must be odd"):
        ConvRefine(2, 1, 8, 2, kernel=4)
    with pytest.raises(ValueError, match="hidden"):
        ConvRefine(2, 1, 0, 2)
