"""The 'fused' accelerator (opt-in; the shipped TOSCA study ran with it): one TOSCA training step
on cached features with the element-wise work in C.

The step of lab/tosca/engines/_step.py (``CE(head(LuCA(x)), y) + l1·Σ|p_luca|``, then SGD with momentum),
for the default 'tosca' flow on the CPU in float32, arranged around its 14 matrix products:

* the products are torch's (``addmm``/``mm`` into buffers allocated once per batch shape);
* everything between them is one kernel of lab/tosca/engines/_fused.c: GELU and its backward, the residual +
  LayerNorm and its backward (with the bias gradients), the sigmoid gate and its backward, and the
  cosine head with its cross-entropy, whose normalisations are differentiated by algebra (two
  ``addmm`` finish the head's gradients, see ``head`` in the C file);
* the L1 + SGD update is one pass over the flat buffers (the same bits as ``flat_update``).

So one step is ~25 calls instead of ~90 and touches each activation once or twice. Gradients agree
with autograd's to ~1e-6 relative (tests/tosca/test_fused.py): the same maths, other roundings
(polynomial exp/erf, another summation order), so a run's numbers differ from the 'eager' engine's
in the last digits. benchmarks/bench_tosca_step.py times it against the bare products + update.

The learner takes the 'eager' step where this one does not apply (another flow, another device:
:func:`covers`) or cannot be had (no C compiler, a compiler that fails or hangs, a cached library
that fails its checks and cannot be rebuilt: :func:`why_not_built`, said in one line), and its log
records which engine ran.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from lab import _cc
from lab.tosca.luca import REFERENCE_FLOW

from ._step import FlatParams, by_name, flat_update

SOURCE = Path(__file__).with_name("_fused.c")
_P, _I, _F, _T = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {  # name: (argument types, result type)
    "gelu_fwd": ([_P, _P, _I, _T], None),
    "gelu_bwd": ([_P, _P, _P, _I, _I, _T], None),
    "ln_fwd": ([_P, _P, _P, _P, _P, _F, _P, _P, _P, _I, _I, _T], None),
    "ln_bwd": ([_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _T], None),
    "gate_fwd": ([_P, _P, _P, _P, _I, _I, _T], None),
    "gate_bwd": ([_P, _P, _P, _P, _I, _T], None),
    "relu_bwd": ([_P, _P, _I], None),
    "head": ([_P, _P, _P, _P, _P, _I, _I, _I, _P, _T, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _T], _F),
    "flat_update": ([_P, _P, _P, _I, _I, _F, _F, _F, _T], None),
}
_kernels = None


def kernels():
    """The compiled kernels (a ``ctypes.CDLL`` with typed functions), or None."""
    global _kernels
    if _kernels is None:
        lib = _cc.load(SOURCE, symbols=tuple(_SIGNATURES))   # a library without them is never used
        if lib is not None:
            for name, (args, res) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
        _kernels = lib or False
    return _kernels or None


def covers(luca, cfg) -> bool:
    """Whether the fused step is written for this LuCA and config: the 'tosca' flow on the CPU."""
    return luca.flow == REFERENCE_FLOW and str(cfg.device) == "cpu"


def why_not_built() -> str:
    """Why :func:`kernels` is None ('' when they are built)."""
    return "" if kernels() is not None else _cc.why_not(SOURCE)


class _Buffers:
    """Every activation and scratch array of one batch shape (n rows, K classes), allocated once."""

    def __init__(self, n: int, d: int, r: int, k: int):
        def e(*shape):
            return torch.empty(*shape)
        self.z1, self.a1, self.a3, self.g3, self.g1 = (e(n, r) for _ in range(5))
        self.res, self.h, self.s, self.f, self.g4, self.gres, self.gout, self.fr = (e(n, d) for _ in range(8))
        self.mean, self.rstd, self.nf2, self.df, self.cen, self.gsn = (e(n) for _ in range(6))
        self.M, self.E, self.G = e(n, k), e(n, k), e(n, k)
        self.dw, self.live, self.Wc = e(k), e(k), e(k, d)
        self.p = {name: t.data_ptr() for name, t in vars(self).items() if torch.is_tensor(t)}


class FusedStep:
    """One task's step ``step(x, y, lr) -> CE`` (a float), as :class:`~lab.tosca.engines._step.TrainStep`;
    ``close()`` when the task is done. Needs :func:`covers` and :func:`kernels`."""

    def __init__(self, luca, head, cfg):
        self.cfg, self.k = cfg, kernels()
        n_luca = len(list(luca.parameters()))
        self.flat = FlatParams([*luca.parameters(), *head.parameters()])
        self.n_l1 = self.flat.prefix(n_luca)
        g = by_name(luca, self.flat.grads[:n_luca])
        hg = by_name(head, self.flat.grads[n_luca:])
        self.dim, self.r, self.eps = luca.dim, luca.r, luca.norm.eps
        self.bd, self.WdT, self.WuT, self.Wu = luca.down.bias, luca.down.weight.t(), luca.up.weight.t(), luca.up.weight
        self.Ws1, self.Ws2, self.Ws1T, self.Ws2T = (luca.se_down.weight, luca.se_up.weight, luca.se_down.weight.t(),
                                                    luca.se_up.weight.t())
        self.W = head.weight
        self.p_bu, self.p_lw, self.p_lb = (t.data_ptr() for t in (luca.up.bias, luca.norm.weight, luca.norm.bias))
        self.g_se_up, self.g_se_down, self.g_up, self.g_down, self.g_W = (
            g["se_up.weight"], g["se_down.weight"], g["up.weight"], g["down.weight"], hg["weight"])
        self.pg_lw, self.pg_lb, self.pg_bu, self.pg_bd = (g[n].data_ptr() for n in ("norm.weight", "norm.bias",
                                                                                   "up.bias", "down.bias"))
        self.free = head.param == "free"
        sigma = head.sigma if self.free else head.sigma_raw
        self.p_sp, self.pg_sp = sigma.data_ptr(), hg["sigma" if self.free else "sigma_raw"].data_ptr()
        fp = self.flat
        self.update_args = (fp.flat.data_ptr(), fp.grad.data_ptr(), fp.momentum.data_ptr(), fp.flat.numel(), self.n_l1)
        self.threads = torch.get_num_threads()
        self.buffers: dict[tuple[int, int], _Buffers] = {}

    @torch.no_grad()
    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Fill the flat gradient buffer for the batch ``(x [n, d], y [n])``; returns the CE."""
        k, T = self.k, self.threads
        x, y = x.contiguous(), y.contiguous()
        n, K, d, r, W = x.shape[0], self.W.shape[0], self.dim, self.r, self.W
        b = self.buffers.get((n, K))
        if b is None:
            b = self.buffers[(n, K)] = _Buffers(n, d, r, K)
        p = b.p
        # forward: adapter, residual + LayerNorm, calibrator gate, the head's cosines
        torch.addmm(self.bd, x, self.WdT, out=b.z1)
        k.gelu_fwd(p["z1"], p["a1"], n * r, 1)
        torch.mm(b.a1, self.WuT, out=b.res)
        k.ln_fwd(p["res"], self.p_bu, x.data_ptr(), self.p_lw, self.p_lb, self.eps, p["h"], p["mean"], p["rstd"], n, d, T)
        torch.mm(b.h, self.Ws1T, out=b.a3).relu_()
        torch.mm(b.a3, self.Ws2T, out=b.s)
        k.gate_fwd(p["s"], p["h"], p["f"], p["nf2"], n, d, T)
        torch.mm(b.f, W.t(), out=b.M)
        # the head: CE, dCE/dσ, and A, Wc, fr for its two gradient products
        ce = k.head(p["M"], p["f"], p["nf2"], W.data_ptr(), y.data_ptr(), n, K, d, self.p_sp, int(self.free),
                    self.pg_sp, p["Wc"], p["fr"], p["E"], p["G"], p["df"], p["cen"], p["gsn"], p["dw"], p["live"], T)
        torch.addmm(b.Wc, b.M.t(), b.f, out=self.g_W)
        torch.addmm(b.fr, b.M, W, out=b.gout)                       # dCE/df
        # backward through the gate, LayerNorm, adapter
        k.gate_bwd(p["gout"], p["h"], p["s"], p["g4"], n * d, T)
        torch.mm(b.g4.t(), b.a3, out=self.g_se_up)
        torch.mm(b.g4, self.Ws2, out=b.g3)
        k.relu_bwd(p["g3"], p["a3"], n * r)
        torch.mm(b.g3.t(), b.h, out=self.g_se_down)
        torch.addmm(b.gout, b.g3, self.Ws1, out=b.fr)                # dCE/dh (fr's buffer reused)
        k.ln_bwd(p["fr"], p["res"], self.p_lw, p["mean"], p["rstd"], p["gres"], self.pg_lw, self.pg_lb, self.pg_bu,
                 n, d, T)
        torch.mm(b.gres.t(), b.a1, out=self.g_up)
        torch.mm(b.gres, self.Wu, out=b.g1)
        k.gelu_bwd(p["g1"], p["z1"], self.pg_bd, n, r, 1)
        torch.mm(b.g1.t(), x, out=self.g_down)
        return ce

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
        cfg = self.cfg
        ce = self.gradients(x, y)
        if cfg.weight_decay:  # not in the reference's settings; torch's passes then
            flat_update(self.flat, self.n_l1, lr=lr, l1=cfg.l1, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        else:
            self.k.flat_update(*self.update_args, lr, cfg.l1, cfg.momentum, self.threads)
        return ce

    def close(self) -> None:
        self.flat.release()
