"""The baselines of the GNO paper, in the same registry and recipes as the GNO.

| name | family | receives |
|---|---|---|
| ``vit`` | ViT-k (k = ``t_in`` frames) | the frames only |
| ``concat`` | ViT with ``theta`` (and ``theta_field``) as channels | frames, theta, fields |
| ``cape_unet``, ``cape_fno``, ``cape_attn`` | CAPE + U-Net / FNO / ViT | frames, theta |
| ``unisolver`` | adaptive-layer-norm conditioning, zero-initialised | frames, theta, boundary (domain-wise), fields (point-wise) |
| ``moe_pot`` | top-2-of-4 experts routed by the latent state, shared expert | the frames only |
| ``conditioned_vit`` | FiLM / Pos / Proj / Token at the encoder or every layer | frames, theta, pooled fields, boundary summary |
| ``pino`` | FNO + PDE residual in the loss | the frames (theta only in the loss) |
| ``fno`` | FNO with theta, fields and boundary channels | frames, theta, fields, boundary |
| ``persistence`` | the last input frame copied forward (no weights; a reference) | the frames |

``cape_fno``, ``pino`` and ``fno`` need neuraloperator (imported when built).
"""

from gno_ext.models.baselines.cape import CAPE, CAPEFNO, CAPEAttn, CAPEUNet, UNet
from gno_ext.models.baselines.conditioning import ConditionedViT, Conditioner
from gno_ext.models.baselines.fno import ChannelFNO
from gno_ext.models.baselines.moe_pot import MoEMLP, MoEPOT
from gno_ext.models.baselines.persistence import Persistence
from gno_ext.models.baselines.pino import PINO
from gno_ext.models.baselines.unisolver import Unisolver
from gno_ext.models.baselines.vit import Concat, ViT, ViTBackbone

__all__ = ["ViT", "ViTBackbone", "Concat", "CAPE", "UNet", "CAPEUNet", "CAPEFNO", "CAPEAttn", "Unisolver", "MoEMLP",
           "MoEPOT", "Conditioner", "ConditionedViT", "PINO", "ChannelFNO", "Persistence"]
