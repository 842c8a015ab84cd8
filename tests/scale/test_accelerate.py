"""AWARe across processes with accelerate, on the CPU: 2 processes (gloo) train the tiny mini-LLaVA to
the weights 1 process reaches with the same global batch; frozen rows stay bit-identical on every
rank, get no optimizer state and no gradient traffic; the saliency profile sharded across ranks is
the single-process one. Every shipped accelerate config parses; the DDP one is the one launched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    import socket

    out = tmp_path_factory.mktemp("ddp")
    with socket.socket() as s:                      # a free port: parallel sessions never meet on 29500
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml"),
           "--num_processes", "2", "--main_process_port", str(port), str(HERE / "_ddp_finetune.py"), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def one_process():
    from _toy import TRAIN, toy_context

    from lab.aware.methods import MethodSpec
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.ablate import Variant, run_variant
    from lab.experiments.aware.run.context import MAIN, upstream
    from lab.experiments.aware.run.profiling import calibration_batches

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = toy_context(train=TRAIN)
        before = upstream(ctx.base, ctx, exact=False)
        sal = profile(ctx.base, calibration_batches(ctx.calib[("upstream", 8)], ctx.enc, batch_size=2),
                      targets="qkv+projector+mlp", progress=False)
        out = {"ctx": ctx, "saliency": sal}
        for method in ("aware", "full"):
            row, info = run_variant(ctx, Variant("one", method, MethodSpec(method, MAIN)), "fashion", 0, before=before,
                                    saliency=sal, progress=False, keep_model=True)
            out[method] = info
    finally:
        torch.set_num_threads(old)
    return out


def _load(path):
    from lab._io import load_tensors

    return load_tensors(path)[0]


@pytest.mark.parametrize("method", ["aware", "full"])
def test_two_processes_train_the_weights_of_one_with_the_same_global_batch(two_processes, one_process, method):
    two = _load(two_processes / f"{method}.safetensors")
    one = one_process[method]["model"].state_dict()
    base = one_process["ctx"].base.state_dict()
    assert two.keys() == one.keys()
    worst = max(float((two[k] - one[k]).abs().max()) for k in one)
    moved = max(float((one[k] - base[k]).abs().max()) for k in one)
    assert worst < 1e-5, f"{method}: 2 processes differ from 1 by {worst:.2e}"
    assert moved > 1e-3, f"{method}: training moved nothing ({moved:.2e}): the comparison would prove nothing"


def test_frozen_rows_are_bit_identical_and_cost_no_state_or_traffic(two_processes, one_process):
    masks = {k: m.bool() for k, m in _load(two_processes / "masks.safetensors").items()}
    two = _load(two_processes / "aware.safetensors")
    base = one_process["ctx"].base.state_dict()
    assert masks and all(m.any() and (~m).any() for m in masks.values())
    for name, m in masks.items():
        w = f"{name}.weight"
        assert torch.equal(two[w][m], base[w][m]), f"{name}: a retained row moved"
        assert not torch.equal(two[w][~m], base[w][~m]), f"{name}: its trainable rows did not train"
    report = json.loads((two_processes / "report.json").read_text())
    assert report["world"] == 2 and report["backend"] == "gloo"
    train = report["aware"]["train"]
    assert train["frozen_identical_on_ranks"] and train["frozen_unchanged"]
    assert train["grad_elements_reduced_per_step"] == train["trainable"]      # only trainable rows travel
    assert train["optimizer_state_elements"] == 2 * train["trainable"]       # AdamW's two moments, nothing else
    assert report["aware"]["summary"] == (
        f"2 processes (MULTI_CPU, gloo): {train['trainable']:,} trainable; {train['trainable']:,} gradient elements "
        f"all-reduced per step; optimizer state {2 * train['trainable']:,} elements; frozen weights unchanged and "
        f"identical on every rank (sha256 {train['frozen_sha256'][:12]})")
    rows = sum(int((~m).sum()) * two[f"{n}.weight"].shape[1] for n, m in masks.items())
    assert train["trainable"] < report["full"]["train"]["trainable"] and train["trainable"] >= rows


def test_sharded_profile_is_the_single_process_profile(two_processes, one_process):
    two = _load(two_processes / "saliency.safetensors")
    one = one_process["saliency"].scores
    assert two.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-6, atol=1e-7)
    report = json.loads((two_processes / "report.json").read_text())
    assert report["profile"] == {"batches_per_rank": 2, "samples": 8}


@pytest.mark.parametrize("name,kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("deepspeed_zero2", "DEEPSPEED")])
def test_every_shipped_config_parses(name, kind):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert cfg.distributed_type.name == kind and cfg.num_machines == 1 and cfg.mixed_precision in ("no", "bf16")
    if kind == "FSDP":
        from accelerate.utils import FullyShardedDataParallelPlugin

        fsdp = cfg.fsdp_config
        assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                                state_dict_type=fsdp["fsdp_state_dict_type"])
        assert plugin.fsdp_version == 2
    if kind == "DEEPSPEED":
        ds = cfg.deepspeed_config
        assert ds["zero_stage"] == 2 and ds["offload_optimizer_device"] == "none"


@pytest.mark.parametrize("action", ["profile", "ablate", "tune"])
def test_other_aware_actions_refuse_a_multi_process_launch(action, monkeypatch, capsys):
    from lab.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")          # what accelerate launch / torchrun set in every process
    assert main(["aware", action]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"lab aware {action}: error: $WORLD_SIZE 2: one of several launched processes; only "
                   f"`lab aware finetune` runs under accelerate launch (sweeps: --executor ray)")


def test_fsdp_is_refused_in_one_line(monkeypatch):
    import accelerate
    from accelerate.utils import DistributedType

    from lab.experiments.aware.run import distributed

    class FakeAccelerator:                       # what accelerate launch --config_file fsdp.yaml gives on GPUs
        distributed_type = DistributedType.FSDP

        def __init__(self, **kw):
            pass

    monkeypatch.setattr(accelerate, "Accelerator", FakeAccelerator)
    with pytest.raises(ValueError, match="FSDP shards every weight.*use configs/accelerate/ddp.yaml"):
        distributed.Session()
