"""AWARe configuration: a small frozen dataclass validated on construction (docs/aware.md)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lab.aware.masking import check_rho, check_rule
from lab.aware.targets import DEFAULT_TARGETS, TARGET_PRESETS, VISION_EXCLUDE


@dataclass(frozen=True)
class AwareConfig:
    """What to freeze. Defaults are the paper's best setting (rho=0.3, global_highest, q/k/v+projector)."""

    rho: float = 0.3                    # fraction of target output neurons kept frozen
    rule: str = "activation-global"     # reference `global_highest`
    targets: str | tuple[str, ...] = DEFAULT_TARGETS   # preset name or component patterns
    exclude: str | None = VISION_EXCLUDE               # never touch the vision tower
    seed: int = 0                       # only used by rule='random'
    extra: dict = field(default_factory=dict, compare=False)  # free-form notes saved with results

    def __post_init__(self):
        check_rho(self.rho)
        check_rule(self.rule)
        if isinstance(self.targets, str) and not self.targets:
            raise ValueError("targets must be a preset name or patterns")
        if isinstance(self.targets, str) and "+" in self.targets and self.targets not in TARGET_PRESETS:
            raise ValueError(f"unknown target preset {self.targets!r}; presets: {list(TARGET_PRESETS)}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["targets"] = self.targets if isinstance(self.targets, str) else list(self.targets)
        return d
