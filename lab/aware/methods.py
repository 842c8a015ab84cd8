"""Fine-tuning methods compared with AWARe, one registry entry each (docs/aware.md, "Baselines").

Every method honours one contract (a subclass of :class:`Method`, registered by name)::

    @register_method("my-method")
    class MyMethod(Method):
        def prepare(self, model, spec, cfg, saliency=None) -> (model, parameter groups, info): ...
        def finish(self, model) -> model: ...          # back to a standard model

:func:`prepare` freezes every parameter first, so an entry only switches on what trains (and at
which learning rate: ``cfg`` is the optimisation recipe, anything with the fields ``lr``,
``lr_projector``, ``lr_adapter`` and ``aware_lr`` of :class:`lab.experiments.aware.run.finetune.TrainConfig`);
it then counts ``(trainable, total)`` into ``info``. The built-in entries:

- ``zero-shot``: nothing trains.
- ``full``: the whole language model and the projector (a vision tower inside the model stays frozen).
- ``lora`` / ``dora``: peft adapters (``LoraConfig(use_dora=...)``) on the *same* language-model
  target Linears as AWARe (q/k/v); as in LLaVA-1.5's LoRA recipe the projector, when it is a target,
  trains fully at the projector lr. The rank makes the trainable count match AWARe's
  (:func:`matched_lora_rank`).
- ``aware``: select -> row split (:mod:`lab.aware.masking`, :mod:`lab.aware.freeze`) from a
  saliency profile computed beforehand (:func:`lab.aware.saliency.profile`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lab import plugins
from lab._registry import Registry
from lab.aware.config import AwareConfig
from lab.aware.freeze import apply, merge, trainable_parameters
from lab.aware.masking import needs_saliency, select
from lab.aware.saliency import Saliency
from lab.aware.targets import VISION_EXCLUDE, find_targets, is_projector

METHODS = Registry("method", group="continual_lab.aware_methods", contract=plugins.check_aware_method)


def register_method(name: str):
    """Record a :class:`Method` subclass under ``name`` (one entry in one file adds a method)."""
    return METHODS.register(name)


def method_names() -> tuple[str, ...]:
    """Every registered method, in registration order (the sweep runs them in this order)."""
    return tuple(METHODS.names())


def get_method(name: str) -> "Method":
    return METHODS.create(name)


@dataclass(frozen=True)
class MethodSpec:
    method: str = "aware"
    aware: AwareConfig = field(default_factory=AwareConfig)
    lora_rank: int | None = None    # None: matched to AWARe's trainable count on the same targets

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {list(method_names())}")

    def to_dict(self) -> dict:
        return {"method": self.method, "lora_rank": self.lora_rank, **self.aware.to_dict()}


class Method:
    """One fine-tuning method. ``prepare`` receives a fully frozen model.

    ``lr_field``: the field of the training recipe that sets this method's language-model (or
    adapter) learning rate (None: nothing trains); ``grid``: the candidate rates a study tunes it
    over; ``rate``: the base rate a study's learning-rate front multiplies; ``role``: ``"reference"`` (E is relative to it: full fine-tuning), ``"baseline"``,
    ``"method"`` or ``"none"`` (nothing trains); ``has_targets``: it trains the spec's target layers
    (False: the whole model, or nothing); ``selects_rows``: it freezes rows chosen by the spec's rule
    and rho (the tables then show them)."""

    lr_field: str | None = None
    grid: tuple[float, ...] = ()
    rate: float | None = None       # the centre of its learning-rate front (the study scales it, projector too)
    role: str = "baseline"
    has_targets: bool = True
    selects_rows: bool = False

    def needs_saliency(self, spec: MethodSpec) -> bool:
        """Whether :meth:`prepare` needs an activation profile of the base model for ``spec``."""
        return False

    def prepare(self, model: nn.Module, spec: MethodSpec, cfg: Any,
                saliency: Saliency | None = None) -> tuple[nn.Module, list[dict], dict]:
        raise NotImplementedError

    def finish(self, model: nn.Module) -> nn.Module:
        return model


def param_groups(model: nn.Module, lr: float, lr_projector: float) -> list[dict]:
    """AdamW groups over the parameters that require grad: the projector's at ``lr_projector``."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    proj = [p for n, p in named if is_projector(n)]
    rest = [p for n, p in named if not is_projector(n)]
    return [g for g in ({"params": rest, "lr": lr}, {"params": proj, "lr": lr_projector}) if g["params"]]


def _split_targets(model: nn.Module, aware: AwareConfig) -> tuple[dict, dict]:
    layers = find_targets(model, aware.targets, exclude=aware.exclude)
    proj = {n: m for n, m in layers.items() if is_projector(n)}
    return {n: m for n, m in layers.items() if n not in proj}, proj


def matched_lora_rank(model: nn.Module, aware: AwareConfig) -> int:
    """LoRA rank r such that LoRA's trainable count — ``r * sum(d_in + d_out)`` over the language-model
    targets, plus the whole projector when it is a target — equals AWARe's, ``(1 - rho)`` of all
    target rows (weights and biases). Rounded, at least 1."""
    lm_layers, proj_layers = _split_targets(model, aware)
    if not lm_layers:
        raise ValueError("LoRA needs at least one language-model target (e.g. q_proj)")
    size = lambda m: m.weight.numel() + (m.out_features if m.bias is not None else 0)  # noqa: E731
    aware_count = (1 - aware.rho) * sum(size(m) for m in {**lm_layers, **proj_layers}.values())
    proj_count = sum(size(m) for m in proj_layers.values())
    per_rank = sum(m.in_features + m.out_features for m in lm_layers.values())
    return max(1, round((aware_count - proj_count) / per_rank))


@register_method("zero-shot")
class ZeroShot(Method):
    role, has_targets = "none", False

    def prepare(self, model, spec, cfg, saliency=None):
        return model, [], {}


@register_method("full")
class Full(Method):
    lr_field, grid, rate, role, has_targets = "lr", (2e-5, 5e-5, 1e-4), 1e-5, "reference", False

    def prepare(self, model, spec, cfg, saliency=None):
        vision = re.compile(VISION_EXCLUDE)
        for n, p in model.named_parameters():   # everything but an image encoder (a hub LLaVA's CLIP)
            p.requires_grad_(not any(vision.fullmatch(part) for part in n.split(".")))
        return model, param_groups(model, cfg.lr, cfg.lr_projector), {}


class _LoRA(Method):
    dora = False
    lr_field, grid, rate = "lr_adapter", (1e-4, 3e-4, 1e-3), 3e-4

    def prepare(self, model, spec, cfg, saliency=None):
        from peft import LoraConfig, get_peft_model

        rank = spec.lora_rank or matched_lora_rank(model, spec.aware)
        lm_layers, proj_layers = _split_targets(model, spec.aware)
        with torch.random.fork_rng(devices=[]):   # lora_A from the run's own seed, whatever ran before
            torch.manual_seed(int(getattr(cfg, "seed", 0)))
            model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                     target_modules=list(lm_layers), use_dora=self.dora))
        for name in proj_layers:   # LLaVA's LoRA recipe: the projector itself trains fully
            for p in model.get_submodule("base_model.model." + name).parameters():
                p.requires_grad_(True)
        return model, param_groups(model, cfg.lr_adapter, cfg.lr_projector), {"lora_rank": rank}

    def finish(self, model):
        return model.merge_and_unload()


@register_method("lora")
class LoRA(_LoRA):
    pass


@register_method("dora")
class DoRA(_LoRA):
    dora = True


@register_method("aware")
class Aware(Method):
    lr_field, grid, rate, role, selects_rows = "lr_aware", (5e-5, 1.5e-4, 5e-4), 1e-4, "method", True

    def needs_saliency(self, spec):
        return needs_saliency(spec.aware.rule)

    def prepare(self, model, spec, cfg, saliency=None):
        layers = find_targets(model, spec.aware.targets, exclude=spec.aware.exclude)
        if self.needs_saliency(spec):
            if saliency is None:
                raise ValueError("activation rules need a saliency profile (lab.aware.profile)")
            missing = set(layers) - set(saliency.scores)
            if missing:
                raise ValueError(f"saliency lacks {len(missing)} target layers, e.g. {sorted(missing)[:3]}")
            scores = {n: saliency.scores[n] for n in layers}
        else:
            scores = {n: torch.zeros(m.out_features) for n, m in layers.items()}
        masks = select(scores, spec.aware.rho, spec.aware.rule, weights=layers, seed=spec.aware.seed)
        apply(model, masks)
        return model, param_groups(model, cfg.aware_lr, cfg.lr_projector), {"masks": masks}

    def finish(self, model):
        return merge(model)


def prepare(model: nn.Module, spec: MethodSpec, cfg: Any, *,
            saliency: Saliency | None = None) -> tuple[nn.Module, list[dict], dict]:
    """Make ``model`` trainable the way ``spec`` says; return (model, optimizer groups, info)."""
    for p in model.parameters():
        p.requires_grad_(False)
    model, groups, info = get_method(spec.method).prepare(model, spec, cfg, saliency)
    info["trainable"], info["total"] = trainable_parameters(model)
    return model, groups, info


def finish(model: nn.Module, method: str) -> nn.Module:
    """Back to a standard model (adapters merged, rows written back), in eval mode."""
    return get_method(method).finish(model).eval()


def lr_field(method: str) -> str | None:
    """The training-recipe field holding ``method``'s learning rate (None: it trains nothing)."""
    return get_method(method).lr_field


def uses_saliency(spec: MethodSpec) -> bool:
    """Whether ``spec`` needs an activation profile of the base model before :func:`prepare`."""
    return get_method(spec.method).needs_saliency(spec)


def reference_method() -> str:
    """The registered method E is relative to (role ``"reference"``: full fine-tuning)."""
    return next(n for n in method_names() if get_method(n).role == "reference")


def main_method() -> str:
    """The method the study is about and every ablation varies (role ``"method"``: AWARe), the first
    registered with that role."""
    return next(n for n in method_names() if get_method(n).role == "method")


def compared_methods() -> tuple[str, ...]:
    """The methods a study's findings name: the main method first, then every other that trains
    (role not ``"none"``), in registration order."""
    main = main_method()
    return (main, *(n for n in method_names() if n != main and get_method(n).role != "none"))


def method_variant(name: str) -> str:
    """The study's variant id of a method's own row in the ``methods`` group (``methods/<name>``)."""
    return f"methods/{name}"


def tunable_methods() -> tuple[str, ...]:
    """Every registered method with a learning rate to tune (``lr_field`` set), reference first."""
    names = [n for n in method_names() if get_method(n).lr_field]
    return tuple(sorted(names, key=lambda n: get_method(n).role != "reference"))


def table_columns(spec: MethodSpec, calib: str = "", calib_n: int = 0) -> dict:
    """What a results table says about ``spec``: ``rho``, ``rule`` and the calibration set (``calib``,
    ``calib_n``) where the method freezes selected rows (NaN, '' and 0 otherwise), and the ``targets``
    it trains ('all': the whole model, or nothing)."""
    m = get_method(spec.method)
    sel = m.selects_rows
    return {"rho": spec.aware.rho if sel else float("nan"), "rule": spec.aware.rule if sel else "",
            "targets": spec.aware.targets if m.has_targets else "all",
            "calib": calib if sel else "", "calib_n": calib_n if sel else 0}
