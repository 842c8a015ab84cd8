"""The 'fused' engine (lab/tosca/engines/_fused.py + _fused.c): its gradients are autograd's to float32
rounding, its update is the eager update bit for bit, its kernels give the same bits at any thread
count, a run is reproducible, and without a C compiler training falls back to the eager step."""
import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca.engines import _fused
from lab.tosca.engines._step import FlatParams, flat_update
from lab.tosca.learner import ToscaConfig
from tests.tosca._modules import luca_head_batch, train_tosca

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(_fused.kernels() is None, reason=f"no fused kernels: {_fused.why_not_built()}")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """One intra-op thread unless a test sets another."""


@pytest.mark.parametrize("d,k,batch,zero_rows", [(1280, 10, 48, 0), (768, 100, 48, 2), (96, 5, 17, 3), (40, 3, 1, 0),
                                                 (33, 1, 7, 0)])
@pytest.mark.parametrize("param", ["positive", "free"])
def test_fused_gradients_are_as_close_to_exact_as_autograds(d, k, batch, zero_rows, param):
    """Both float32 steps against autograd in float64: measured, each within ~1e-6 of the largest
    entry (the same maths, rounded in other orders)."""
    torch.manual_seed(d)
    luca, head, x, y = luca_head_batch(d, k, batch, param, seed=d + batch, zero_rows=zero_rows)
    params = [*luca.parameters(), *head.parameters()]
    want_ce = F.cross_entropy(head(luca(x)), y)
    autograd32 = [g.clone() for g in torch.autograd.grad(want_ce, params)]
    l64, h64 = copy.deepcopy(luca).double(), copy.deepcopy(head).double()
    exact = torch.autograd.grad(F.cross_entropy(h64(l64(x.double())), y), [*l64.parameters(), *h64.parameters()])
    names = [n for n, _ in [*luca.named_parameters(), *head.named_parameters()]]
    step = _fused.FusedStep(luca, head, ToscaConfig())
    ce = step.gradients(x, y)
    assert ce == pytest.approx(want_ce.item(), rel=1e-6, abs=1e-6)
    for name, a, b, e in zip(names, autograd32, step.flat.grads, exact):
        scale = e.abs().max().item() or 1.0
        err_fused, err_autograd = ((b.double() - e).abs().max() / scale).item(), ((a.double() - e).abs().max() / scale).item()
        assert err_fused <= max(1e-5, 10 * err_autograd), (name, err_fused, err_autograd)
    step.close()


def _flat(n, n_l1, seed):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(n_l1, generator=g) * 0.01, torch.randn(n - n_l1, generator=g)]
    params[0][::7] = 0.0  # sign(0) = 0
    fp = FlatParams(params)
    fp.momentum.normal_(generator=g)
    return fp, g


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_update_is_the_eager_update_bit_for_bit(threads):
    a, g = _flat(10_007, 6_001, seed=1)
    b, _ = _flat(10_007, 6_001, seed=1)
    k = _fused.kernels()
    for lr in (0.025, 0.01, 1e-3):
        grad = torch.randn(a.grad.shape, generator=g)
        a.grad.copy_(grad)
        b.grad.copy_(grad)
        flat_update(a, a.prefix(1), lr=lr, l1=5e-4, momentum=0.9, weight_decay=0.0)
        k.flat_update(b.flat.data_ptr(), b.grad.data_ptr(), b.momentum.data_ptr(), b.flat.numel(), b.prefix(1),
                      lr, 5e-4, 0.9, threads)
    assert torch.equal(a.flat, b.flat) and torch.equal(a.momentum, b.momentum)


def test_the_kernels_give_the_same_bits_at_one_and_two_threads():
    luca, head, x, y = luca_head_batch(768, 100, 48, "positive", seed=5, zero_rows=2)
    step = _fused.FusedStep(luca, head, ToscaConfig())
    step.gradients(x, y)
    b = next(iter(step.buffers.values()))
    saved = {n: t.clone() for n, t in vars(b).items() if torch.is_tensor(t)}
    grads = step.flat.grad.clone()
    k, p, n, d, K = step.k, b.p, 48, 768, 102
    outs = {}
    for T in (1, 2):
        for name, t in vars(b).items():  # the same inputs for both thread counts
            if torch.is_tensor(t):
                t.copy_(saved[name])
        with torch.no_grad():
            torch.mm(b.f, step.W.t(), out=b.M)
        ce = k.head(p["M"], p["f"], p["nf2"], step.W.data_ptr(), y.data_ptr(), n, K, d, step.p_sp, 0, step.pg_sp,
                    p["Wc"], p["fr"], p["E"], p["G"], p["df"], p["cen"], p["gsn"], p["dw"], p["live"], T)
        k.gate_bwd(p["gout"], p["h"], p["s"], p["g4"], n * d, T)
        k.ln_bwd(p["fr"], p["res"], step.p_lw, p["mean"], p["rstd"], p["gres"], step.pg_lw, step.pg_lb, step.pg_bu,
                 n, d, T)
        k.gate_fwd(p["s"], p["h"], p["f"], p["nf2"], n, d, T)
        outs[T] = (ce, {n_: t.clone() for n_, t in vars(b).items() if torch.is_tensor(t)}, step.flat.grad.clone())
    assert outs[1][0] == outs[2][0]
    for name in outs[1][1]:
        assert torch.equal(outs[1][1][name], outs[2][1][name]), name
    assert torch.equal(outs[1][2], outs[2][2]) and not torch.equal(outs[1][2], torch.zeros_like(grads))
    step.close()


def test_a_fused_run_is_reproducible_and_close_to_the_eager_run():
    data = synthetic_data(num_tasks=3, dim=48, noise=2.0, n_train=37)  # 74 per task: a short last batch
    a, b = train_tosca(data, 3, engine="fused"), train_tosca(data, 3, engine="fused")
    eager = train_tosca(data, 3, engine="eager")
    assert {r["engine"] for r in a.log} == {"fused"} and {r["engine"] for r in eager.log} == {"eager"}
    assert [r["loss"] for r in a.log] == [r["loss"] for r in b.log]
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(x, y)
    la, le = a.all_logits(data.test_x), eager.all_logits(data.test_x)
    assert [r["loss"] for r in a.log] == pytest.approx([r["loss"] for r in eager.log], rel=1e-4)
    torch.testing.assert_close(la, le, rtol=1e-3, atol=1e-3)
    assert torch.equal(la.argmax(-1), le.argmax(-1))


def test_other_flows_train_with_the_eager_step_without_a_note(capfd):
    data = synthetic_data(num_tasks=2, dim=32, noise=2.0, n_train=20)
    model = train_tosca(data, 3, flow="adapter", engine="fused")
    assert {r["engine"] for r in model.log} == {"eager"}
    assert "engine" not in capfd.readouterr().err


def _run_without(tmp_path, env_extra: dict, path_dirs: list[str]) -> subprocess.CompletedProcess:
    """Train small TOSCA models (fused, eager, fused again) in a fresh interpreter whose PATH holds only
    ``path_dirs`` (and a fresh cache root, so no kernels built before are found); prints the engines
    that ran for 'fused' and whether its losses are the eager engine's."""
    code = textwrap.dedent("""
        from lab.experiments.tosca._synthetic import synthetic_data
        from lab.tosca.learner import Tosca, ToscaConfig
        data = synthetic_data(num_tasks=2, dim=32, noise=2.0, n_train=20)
        out = {}
        for engine in ("fused", "eager", "fused"):
            m = Tosca(32, ToscaConfig(epochs=2, engine=engine, threads=1))
            for t, cs in enumerate(data.task_classes):
                k = data.train_task == t
                m.learn_task(cs, data.train_x[k], data.train_y[k])
            out[engine] = ([r["loss"] for r in m.log], {r["engine"] for r in m.log})
        print("RAN", sorted(out["fused"][1]))
        print("SAME", out["fused"][0] == out["eager"][0])
    """)
    env = {"PATH": os.pathsep.join(path_dirs), "HOME": str(tmp_path), "LAB_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def _notes(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("note: TOSCA trains with the 'eager' engine")]


def test_without_a_c_compiler_training_takes_the_eager_step_and_says_so_once(tmp_path):
    bin_dir = tmp_path / "bin"  # only python on PATH: no cc, gcc or clang
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    p = _run_without(tmp_path, {}, [str(bin_dir)])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "RAN ['eager']" in p.stdout and "SAME True" in p.stdout  # the eager step's numbers exactly
    (note,) = _notes(p.stderr)
    assert "not 'fused': no C compiler (set $CC, or install gcc or clang)." in note
    assert not list((tmp_path / "cache").glob("kernels/*.so"))


def test_a_compiler_that_fails_is_named_and_training_goes_on(tmp_path):
    p = _run_without(tmp_path, {"CC": "false"}, [os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "RAN ['eager']" in p.stdout and "SAME True" in p.stdout
    (note,) = _notes(p.stderr)
    assert "false could not build _fused.c: exit status 1" in note


def test_kernels_are_built_once_per_source_and_machine(tmp_path, monkeypatch):
    from lab import _cc

    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_cc, "_loaded", {})
    src = tmp_path / "k.c"
    src.write_text("int one(void) { return 1; }\n")
    lib = _cc.load(src)
    assert lib is not None and lib.one() == 1
    (built,) = (tmp_path / "kernels").glob("k-*.so")
    monkeypatch.setattr(_cc, "_loaded", {})
    assert _cc.load(src).one() == 1 and list((tmp_path / "kernels").glob("k-*.so")) == [built]  # reused
    # damaged (e.g. a disk error): its sha256 no longer matches, so the next process rebuilds it (here in
    # other processes: this one has the file mapped, and the loader would hand back the loaded copy)
    built.unlink()
    load = [sys.executable, "-c", f"from lab import _cc; print(_cc.load({str(src)!r}).one())"]
    env = {**os.environ, "LAB_CACHE_DIR": str(tmp_path)}
    assert subprocess.run(load, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT).stdout.strip() == "1"
    built.write_bytes(built.read_bytes()[:100])
    p = subprocess.run(load, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.stdout.strip() == "1" and built.stat().st_size > 100, p.stderr[-2000:]
    src.write_text("int one(void) { return 2; }\n")  # an edited source builds afresh
    monkeypatch.setattr(_cc, "_loaded", {})
    assert _cc.load(src).one() == 2 and len(list((tmp_path / "kernels").glob("k-*.so"))) == 2
    assert not list((tmp_path / "kernels").glob(".k-*")) and not list((tmp_path / "kernels").glob("*.tmp*"))


def test_a_compiler_without_march_native_still_builds(tmp_path, monkeypatch):
    """A compiler that rejects -march=native (an older clang on arm64) and -fopenmp gets neither."""
    from lab import _cc

    cc = tmp_path / "picky-cc"
    cc.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -march=native|-fopenmp) '
                  'echo "unsupported option $a" >&2; exit 1;; esac; done\nexec gcc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_cc, "_loaded", {})
    src = tmp_path / "k.c"
    src.write_text("int one(void) { return 1; }\n")
    lib = _cc.load(src)
    assert lib is not None and lib.one() == 1 and _cc.why_not(src) == ""
