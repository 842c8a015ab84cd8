"""LuCA — Learn and Calibrate — the per-task module of TOSCA (docs/tosca.md, "LuCA").

One LuCA sits on the d-dim decision-point feature of the frozen backbone (timm pre-logits:
the final [CLS] token after the last norm for a ViT, the pooled feature for a CNN)::

    adapter    a(x) = Linear(r, d)(GELU(Linear(d, r)(x)))          # with biases
    calibrator s(h) = Sigmoid(Linear(r, d)(ReLU(Linear(d, r)(h))))  # no biases (squeeze-excitation)

    flow 'tosca'      h = LN(x + a(x));  out = h * s(h)   # the reference default; gate sees h, not x
    flow 'adapter'    out = LN(a(x))                      # reference ablation
    flow 'calibrator' out = x * s(x)                      # reference ablation
    flow 'tosca_r'    out = x * s(x) + LN(a(x))           # reference ablation

r = d // ratio (ratio 16: d=768 -> r=48). Initialised as the reference (``init``): task 0 from
nn.Linear's default initialisation ('default'), every later task reset by ``reset_tosca`` ('xavier':
Xavier-uniform Linear weights, zero biases); LayerNorm weight 1 / bias 0 either way.
"""
from __future__ import annotations

import math

import torch
from torch import nn

# the flows (a flow named like the method it comes from is still a flow: code compares with these constants)
REFERENCE_FLOW, ADAPTER, CALIBRATOR, TOSCA_R = "tosca", "adapter", "calibrator", "tosca_r"
FLOWS = (REFERENCE_FLOW, ADAPTER, CALIBRATOR, TOSCA_R)
INITS = ("xavier", "default")
_HAS_ADAPTER = {REFERENCE_FLOW: True, ADAPTER: True, CALIBRATOR: False, TOSCA_R: True}
_HAS_CALIBRATOR = {REFERENCE_FLOW: True, ADAPTER: False, CALIBRATOR: True, TOSCA_R: True}


def check_flow(flow: str) -> str:
    if flow not in FLOWS:
        raise ValueError(f"unknown LuCA flow {flow!r}; valid flows: {', '.join(FLOWS)}")
    return flow


def bottleneck(dim: int, ratio: int = 16) -> int:
    """r = d // ratio, at least 1."""
    if dim < 1 or ratio < 1:
        raise ValueError(f"dim and ratio must be >= 1 (got dim={dim}, ratio={ratio})")
    return max(1, dim // ratio)


def param_count(dim: int, r: int, flow: str = REFERENCE_FLOW) -> int:
    """Trainable parameters of one LuCA, from the formula (not from a module).

    adapter: 2·d·r weights + r + d biases + LayerNorm 2·d;  calibrator: 2·d·r weights.
    For 'tosca' this is 4·d·r + r + 3·d = 149,808 at d=768, r=48 (the paper quotes 4·d·r).
    """
    check_flow(flow)
    n = 0
    if _HAS_ADAPTER[flow]:
        n += 2 * dim * r + r + dim + 2 * dim
    if _HAS_CALIBRATOR[flow]:
        n += 2 * dim * r
    return n


class LuCA(nn.Module):
    """One task's module: ``forward(x [N, d]) -> [N, d]`` (see the module docstring for the flows)."""

    def __init__(self, dim: int, *, ratio: int = 16, flow: str = REFERENCE_FLOW):
        super().__init__()
        self.dim, self.flow, self.r = dim, check_flow(flow), bottleneck(dim, ratio)
        if _HAS_ADAPTER[flow]:
            self.down = nn.Linear(dim, self.r)
            self.up = nn.Linear(self.r, dim)
            self.norm = nn.LayerNorm(dim)
        if _HAS_CALIBRATOR[flow]:
            self.se_down = nn.Linear(dim, self.r, bias=False)
            self.se_up = nn.Linear(self.r, dim, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, init: str = "xavier") -> None:
        """'xavier': the reference's ``reset_tosca``; 'default': ``nn.Linear.reset_parameters``
        (Kaiming-uniform with a=√5, bias uniform(±1/√fan_in)), drawn from ``generator`` in module order."""
        if init not in INITS:
            raise ValueError(f"unknown LuCA init {init!r}; valid: {', '.join(INITS)}")
        for m in self.modules():
            if isinstance(m, nn.Linear) and init == "default":
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
                if m.bias is not None:
                    bound = 1 / math.sqrt(m.in_features)
                    nn.init.uniform_(m.bias, -bound, bound, generator=generator)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, generator=generator)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def adapt(self, x: torch.Tensor) -> torch.Tensor:
        """a(x): the bottleneck MLP, without residual or norm."""
        return self.up(nn.functional.gelu(self.down(x)))

    def gate(self, h: torch.Tensor) -> torch.Tensor:
        """s(h) in (0, 1): the squeeze-excitation calibration gate, [N, d]."""
        return torch.sigmoid(self.se_up(torch.relu(self.se_down(h))))

    def gate_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the gate is computed from: h = LN(x + a(x)) for 'tosca', x for the other flows."""
        return self.norm(x + self.adapt(x)) if self.flow == REFERENCE_FLOW else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flow == REFERENCE_FLOW:
            h = self.norm(x + self.adapt(x))
            return h * self.gate(h)
        if self.flow == ADAPTER:
            return self.norm(self.adapt(x))
        if self.flow == CALIBRATOR:
            return x * self.gate(x)
        return x * self.gate(x) + self.norm(self.adapt(x))  # tosca_r

    def l1(self) -> torch.Tensor:
        """Σ|p| over every parameter (LayerNorm included), the reference's sparsity penalty."""
        return torch.stack([p.abs().sum() for p in self.parameters()]).sum()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
