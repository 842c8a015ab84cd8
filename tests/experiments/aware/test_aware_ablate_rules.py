"""`lab aware ablate --rules`: checked before any model loads, and carried into the sweep's Size."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAB = str(Path(sys.executable).with_name("lab"))


def test_an_unknown_rule_is_refused_at_once_with_the_valid_names():
    p = subprocess.run([LAB, "aware", "ablate", "--rules", "weight-norm", "not-a-rule"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--rules not-a-rule: unknown AWARe rule; valid rules: activation-balanced, weight-norm, random" in lines[0]


def test_the_rules_given_are_the_rule_group_of_the_sweep():
    from lab import cli
    from lab.experiments.aware.run import ablate
    from lab.experiments.aware import cli as aware_cli
    from lab.experiments.aware.run.context import MAIN, SIZES

    assert aware_cli.REFERENCE_RULE == MAIN.rule
    parser = cli.build_parser()
    args = parser.parse_args(["aware", "ablate", "--size", "smoke", "--rules", "random", "weight-norm",
                              "--groups", "rho"])
    aware_cli._check_rules(args)
    size = aware_cli._size(args)
    assert size.rules == ("random", "weight-norm") and size.rhos == SIZES["smoke"].rhos
    assert aware_cli._ablate_groups(args) == ("rho", "rule")                 # --rules implies the rule group
    rule_group = [v for v in ablate.variants(size) if v.group == "rule"]
    assert [(v.label, v.spec.aware.rule) for v in rule_group] == [("random", "random"), ("weight-norm", "weight-norm")]
    default = parser.parse_args(["aware", "ablate", "--size", "smoke"])
    assert aware_cli._size(default).rules == SIZES["smoke"].rules and aware_cli._ablate_groups(default) is None
