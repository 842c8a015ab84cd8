"""Run under `accelerate launch` by tests/scale/test_accelerate.py: profile and fine-tune the tiny
mini-LLaVA (AWARe and full) through a distributed Session; rank 0 saves what the test compares."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _toy import TRAIN, toy_context  # noqa: E402

from lab._io import save_tensors, write_json  # noqa: E402
from lab.aware.methods import MethodSpec  # noqa: E402
from lab.experiments.aware.run import distributed  # noqa: E402
from lab.experiments.aware.run.ablate import Variant, run_variant  # noqa: E402
from lab.experiments.aware.run.context import MAIN, upstream  # noqa: E402
from lab.experiments.aware.run.profiling import calibration_batches  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist = distributed.session("cpu")
    assert dist is not None, "not launched as several processes"
    ctx = toy_context(train=TRAIN)
    before = upstream(ctx.base, ctx, exact=False)
    sal = dist.profile(ctx.base, calibration_batches(ctx.calib[("upstream", 8)], ctx.enc, batch_size=2),
                       targets="qkv+projector+mlp", progress=False)
    report = {"rank_devices": str(dist.device), "profile_samples": sal.n_samples}
    for method in ("aware", "full"):
        v = Variant("ddp", method, MethodSpec(method, MAIN))
        row, info = run_variant(ctx, v, "fashion", 0, before=before, saliency=sal, progress=False,
                                keep_model=True, trainer=dist.train)
        report[method] = {"train": dict(dist.report["train"]), "downstream": row["downstream"], "summary": dist.summary()}
        if dist.is_main:
            save_tensors(out / f"{method}.safetensors", {k: t.clone() for k, t in info["model"].state_dict().items()})
            if "masks" in info:
                save_tensors(out / "masks.safetensors", {k: m.to(torch.uint8) for k, m in info["masks"].items()})
    if dist.is_main:
        save_tensors(out / "saliency.safetensors", sal.scores)
        write_json(out / "report.json", {**report, **{k: v for k, v in dist.report.items() if k != "train"}})
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
