"""Print the table of every model config: what it is built from, what it receives, its size.

    python recipes/model_table.py                  # the paper's backbone (size=paper) on heat-joint-like data
    python recipes/model_table.py --size small

Parameter counts are for one field channel, one scalar parameter, a 2-D grid of 128 x 128 and
the chosen size's backbone; the data-dependent sizes come from the same code the recipes use.
"""

from __future__ import annotations

import argparse

from gno_ext.models import get_model, model_class
from gno_ext.training.recipe_data import DataSpec, model_kwargs_from_data

import train  # recipes/train.py (this script's folder is on the path)

RECEIVES = {
    "gno": ("frames, theta, v(x), boundary (types and data)", "this project (the GNO paper)"),
    "gated_fno": ("frames, theta", "this project (gated neuraloperator FNO)"),
    "gno_fno": ("frames, theta, v(x), boundary (types and data)", "this project (the GNO on neuraloperator's FNO)"),
    "vit": ("the k frames only", "ViT-k baseline (GNO paper)"),
    "concat": ("frames, theta, v(x) as channels", "Concat baseline (GNO paper)"),
    "cape_unet": ("frames, theta", "Takamoto et al. 2023 (CAPE)"),
    "cape_fno": ("frames, theta", "Takamoto et al. 2023 (CAPE)"),
    "cape_attn": ("frames, theta", "Takamoto et al. 2023 (CAPE)"),
    "unisolver": ("frames, theta and boundary (domain-wise), v(x) (point-wise)", "Zhou et al. 2025 (Unisolver)"),
    "moe_pot": ("the frames only (routing by latent state)", "Wang et al. 2025 (MoE-POT)"),
    "conditioned_vit": ("frames, theta, pooled v(x), boundary summary", "GNO paper, Appendix G"),
    "pino": ("the frames (theta and v(x) in the loss only)", "Li et al. 2021 (PINO); GNO paper, Appendix M"),
    "persistence": ("the last frame (copied forward; a reference)", "no training"),
    "fno": ("frames, theta, v(x), boundary channels", "Li et al. 2021 (FNO), neuraloperator"),
}
MESH = ("gno_mesh", "mesh_gnn")  # models of mesh nodes, not of a grid: described with the mesh recipes


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="paper")
    args = parser.parse_args(argv)
    spec = DataSpec(channels=1, n_params=1, field_channels=0, ndim=2, t_in=1, shape=(128, 128), log_params=(True,))
    lines = ["| config (`model=`) | registered model | receives | parameters | source |", "|---|---|---|---|---|"]
    for name in train.available("model"):
        cfg = train.compose("heat-joint", [f"size={args.size}", f"model={name}"])
        if cfg["model"]["name"] in MESH:
            continue
        t_in = cfg["data"]["n_steps_input"]
        s = DataSpec(**{**spec.__dict__, "t_in": t_in})
        kwargs = model_kwargs_from_data(model_class(cfg["model"]["name"]), s, cfg["model"]["kwargs"])
        model = get_model(cfg["model"]["name"], **kwargs)
        n = sum(p.numel() for p in model.parameters())
        receives, source = RECEIVES[cfg["model"]["name"]]
        if not cfg["model"]["kwargs"].get("parameter_channels", True):
            receives = receives.replace("frames, theta, v(x)", "frames; theta and v(x) through the gates only")
        if not cfg["model"]["kwargs"].get("boundary_transfer", True):
            receives = receives.replace(", boundary (types and data)", "") + "; no boundary transfer (ablation)"
        elif cfg["model"]["kwargs"].get("n_kernels", 2) == 1 and cfg["model"]["name"] in ("gno", "gno_fno"):
            receives += "; one kernel (ablation)"
        if cfg["model"]["kwargs"].get("soft_routing"):
            receives += "; kernels mixed by the gate's probabilities"
        if cfg["model"]["kwargs"].get("decoder") == "conv":
            receives += "; convolutional decoder"
        lines.append(f"| `{name}` | `{cfg['model']['name']}` | {receives} | {n / 1e6:.2f} M | {source} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
