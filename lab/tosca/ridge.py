"""A global ridge classifier on random ReLU features of the frozen backbone (RanPAC's read-out).

One implementation for two users (docs/tosca.md, "Inference: entropy routing" and "Baselines"):

* the ``ridge`` router (:mod:`lab.tosca.routing`): a RanPAC-style global ridge router from a
  follow-up method (PRISM) developed in the repository that first published TOSCA's code; the TOSCA
  paper's own routing is entropy — each test sample goes to the task module that owns its top-1
  ridge class;
* the RanPAC baseline (:class:`lab.experiments.tosca.baselines.RanPAC`), whose classifier *is*
  this ridge (McDonnell et al., NeurIPS 2023).

The maths, with ``x [n, d]`` frozen features and ``y`` labels in the incremental label space::

    h = ReLU(x̂ W)            W [d, D] Gaussian, drawn once from a seeded generator, frozen
    G = Σ hᵀh   [D, D]        accumulated task by task (float64): no features are stored
    Q = Σ hᵀY   [D, C]        Y one-hot over every class seen so far (Q grows by columns)
    W_out = (G + λI)⁻¹ Q      Cholesky in float64; scores = h W_out

``x̂`` is ``x / ‖x‖`` when ``normalize`` (PRISM's router: ``ridge_normalize: true``) and ``x``
itself otherwise (RanPAC's code projects the raw feature).

λ. ``lam`` is a number (PRISM's router configs: 1,000 — its code's fallback is 10⁴) or
``"auto"``: RanPAC's rule, run at every :meth:`RidgeRouter.update` on that update's data only —
the λ of :data:`RIDGES` with the least mean squared error on a 20 % split of the task's data
(seeded shuffle: our rows are ordered by class) from the ridge fitted on the other 80 %. Holding
out data of earlier tasks would mean storing their features, which the method does not; the λ
chosen on the latest task then serves every class.

Projection dimension. PRISM routes with ``D = 15,000`` (``ridge_proj_dim`` in every config); the
default here is :data:`PROJ_DIM` = 2,000, what a CPU affords per task (the solve is cubic in D).
Measured on the shared 2-core AMD EPYC box, both cores busy with another job (``nice 19``), 1 torch
thread, 100 classes, 5,000 samples per update (2,000 at D = 15,000):

=========  ======  ===================  ===========  ========  =========
feature d  D       update, per sample   solve        G         peak RSS
=========  ======  ===================  ===========  ========  =========
1280       2,000   0.30–0.34 ms         0.2–0.4 s    32 MB     0.8 GB
768        2,000   0.22–0.29 ms         0.15–0.2 s   32 MB     0.8 GB
1280       5,000   1.3 ms               1.4 s        200 MB    1.3 GB
768        5,000   1.2 ms               1.4 s        200 MB    1.3 GB
1280       15,000  10 ms                34 s         1.8 GB    6.1 GB
768        15,000  11 ms                38 s         1.8 GB    6.1 GB
=========  ======  ===================  ===========  ========  =========

(Peak RSS includes torch itself, about 0.6 GB; the solve makes two more [D, D] float64 copies.
The D = 15,000 rows were measured with the same operations in a stand-alone script.)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# where the ``ridge`` router comes from, in the words every page and table that names it uses
ORIGIN = ("a RanPAC-style global ridge router from a follow-up method (PRISM) developed in the repository that "
          "first published TOSCA's code; the TOSCA paper's own routing is entropy")
PROJ_DIM = 2000  # ours (laptop-friendly); PRISM's router: 15,000, RanPAC's paper: 10,000
LAMBDA = 1e3  # PRISM's router configs (ridge_lambda)
RIDGES = tuple(10.0 ** k for k in range(-8, 14))  # RanPAC's grid (their optimise_ridge_parameter)
_CHUNK_ELEMENTS = 1 << 24  # rows per update chunk: at most 2²⁴ float64 entries of h (128 MB)


def choose_lambda(h: torch.Tensor, Y: torch.Tensor, generator: torch.Generator,
                  grid=RIDGES) -> float:
    """RanPAC's λ: fit on a seeded 80 % of ``(h [n, D], Y [n, C])``, the λ of ``grid`` with the least
    MSE on the other 20 % (one eigendecomposition serves the whole grid)."""
    perm = torch.randperm(len(h), generator=generator)
    n = int(0.8 * len(h))
    tr, va = perm[:n], perm[n:]
    if n == 0 or len(va) == 0:
        raise ValueError(f"choosing λ needs at least 2 samples (got {len(h)})")
    evals, evecs = torch.linalg.eigh(h[tr].T @ h[tr])
    proj_q = evecs.T @ (h[tr].T @ Y[tr])  # [D, C]
    hv = h[va] @ evecs  # [n_val, D]
    losses = [float(((hv @ (proj_q / (evals + r)[:, None]) - Y[va]) ** 2).mean()) for r in grid]
    return grid[int(torch.tensor(losses).argmin())]


def ridge_solve(G: torch.Tensor, Q: torch.Tensor, lam: float) -> torch.Tensor:
    """``(G + λI)⁻¹ Q`` in float64: Cholesky, and an LU solve where the factorisation fails
    (λ so small that rounding leaves ``G + λI`` not numerically positive definite)."""
    A = G.double().clone()
    A.diagonal().add_(float(lam))
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        return torch.cholesky_solve(Q.double(), L)
    return torch.linalg.solve(A, Q.double())


class RidgeRouter:
    """Random ReLU features of the frozen feature and a ridge read-out, updated task by task.

    >>> r = RidgeRouter(dim=768, seed=1993)        # D = PROJ_DIM, λ = 1e3, L2-normalised input
    >>> r.update(train_x, train_y)                 # once per task; G and Q accumulate
    >>> scores = r.predict(test_x)                 # [N, classes seen]; top-1 class -> its task
    """

    def __init__(self, dim: int, proj_dim: int = PROJ_DIM, *, seed: int = 1993, lam: float | str = LAMBDA,
                 normalize: bool = True):
        if proj_dim < 1 or dim < 1:
            raise ValueError(f"dim and proj_dim must be >= 1 (got {dim}, {proj_dim})")
        if lam != "auto" and not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
            raise ValueError(f"lam must be a finite number > 0 or 'auto' (got {lam!r})")
        self.dim, self.proj_dim, self.seed, self.normalize = dim, proj_dim, seed, normalize
        self.lam_rule = lam
        self.lam = LAMBDA if lam == "auto" else float(lam)  # 'auto': replaced at every update
        self.W = torch.randn(dim, proj_dim, generator=torch.Generator().manual_seed(seed))  # float32, frozen
        self.G = torch.zeros(proj_dim, proj_dim, dtype=torch.float64)
        self.Q = torch.zeros(proj_dim, 0, dtype=torch.float64)
        self.count = 0  # samples behind G and Q
        self.updates = 0
        self._solved: tuple[float, int, torch.Tensor] | None = None  # (λ, updates, W_out)

    @property
    def num_classes(self) -> int:
        return self.Q.shape[1]

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``h = ReLU(x̂ W)``, float64 ``[n, D]``."""
        x = x.detach().cpu().float()
        if self.normalize:
            x = F.normalize(x, dim=1)
        return F.relu(x @ self.W).double()

    @torch.no_grad()
    def update(self, x: torch.Tensor, y: torch.Tensor, num_classes: int | None = None) -> None:
        """Add one task's frozen features ``x [n, d]`` and labels ``y [n]`` to G and Q; Q grows to
        ``num_classes`` columns (default: the largest label + 1). Features are not kept. Every call
        counts as one update (one task), even an empty one."""
        y = y.detach().cpu().long()
        if x.shape[0] != len(y) or x.shape[1] != self.dim:
            raise ValueError(f"update needs x [n, {self.dim}] and y [n] (got {tuple(x.shape)}, {tuple(y.shape)})")
        C = max(num_classes or 0, int(y.max()) + 1 if len(y) else 0, self.num_classes)
        if C > self.num_classes:
            self.Q = torch.cat([self.Q, torch.zeros(self.proj_dim, C - self.num_classes, dtype=torch.float64)], 1)
        rows = max(1, _CHUNK_ELEMENTS // self.proj_dim)
        for xs, ys in zip(x.split(rows), y.split(rows)):
            h = self.features(xs)
            self.G += h.T @ h
            self.Q += h.T @ F.one_hot(ys, C).double()
        if self.lam_rule == "auto" and len(y) >= 2:  # fewer: the last λ stays
            gen = torch.Generator().manual_seed(self.seed + self.updates)
            self.lam = choose_lambda(self.features(x), F.one_hot(y, C).double(), gen)
        self.count += len(y)
        self.updates += 1
        self._solved = None

    def solve(self, lam: float | None = None) -> torch.Tensor:
        """``W_out = (G + λI)⁻¹ Q`` ``[D, C]`` float64 (cached until the next update); ``lam``
        defaults to this ridge's λ."""
        if self.updates == 0:
            raise ValueError("the ridge has seen no data: call update() first")
        lam = self.lam if lam is None else float(lam)
        if self._solved is None or self._solved[:2] != (lam, self.updates):
            self._solved = (lam, self.updates, ridge_solve(self.G, self.Q, lam))
        return self._solved[2]

    @torch.no_grad()
    def predict(self, x: torch.Tensor, lam: float | None = None) -> torch.Tensor:
        """Class scores ``h W_out`` ``[N, C]`` (float64) for features ``x [N, d]``."""
        W_out = self.solve(lam)
        out = torch.zeros(len(x), W_out.shape[1], dtype=torch.float64)
        rows = max(1, _CHUNK_ELEMENTS // self.proj_dim)
        for i in range(0, len(x), rows):
            out[i:i + rows] = self.features(x[i:i + rows]) @ W_out
        return out

    # -- persistence (RanPAC saves its state with every stage) -------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"W": self.W, "G": self.G, "Q": self.Q, "ridge": torch.tensor([self.lam]),
                "count": torch.tensor([self.count, self.updates])}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.W = state["W"].float().clone()
        self.G, self.Q = state["G"].double().clone(), state["Q"].double().clone()
        self.dim, self.proj_dim = self.W.shape
        if "ridge" in state:
            self.lam = float(state["ridge"][0])
        if "count" in state:
            self.count, self.updates = (int(v) for v in state["count"])
        else:  # saved before the count was kept: G is non-zero once anything was added
            self.updates = int(bool(self.G.abs().sum() > 0))
        self._solved = None

    def __repr__(self) -> str:
        return (f"RidgeRouter(dim={self.dim}, proj_dim={self.proj_dim}, lam={self.lam_rule!r}"
                f"{'' if self.lam_rule != 'auto' else f' (now {self.lam:g})'}, normalize={self.normalize}, "
                f"classes={self.num_classes}, samples={self.count})")
