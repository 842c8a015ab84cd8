"""TOSCA cost, measured in one run (docs/tosca.md).

Prints
1. TOSCA end-to-end (one backbone feature pass + training every task on cached features + evaluation
   under every routing) divided by that one feature pass — target <= 1.2 on the CPU, <= 1.5 on a GPU;
2. the speed-up over a reference-style run (backbone every epoch on the training images, a
   prototype pass, and one backbone pass per task module per test image at every stage), computed
   from image-pass COUNTS x the per-image backbone cost measured in step 1, plus the same module
   compute as ours;
3. the trainable-parameter ratio TOSCA : layer-wise adapters for ViT-B/16, exact from module shapes
   (timm vit_base_patch16_224 with random weights; nothing is downloaded).

CPU (default): the offline scenario (efficientnet_lite0, fashion_mnist_mini B0 Inc2).
GPU: ``--device cuda`` — ViT-B/16 (random weights, bf16 autocast) on CIFAR-100-sized random images
(50k train + 10k test, 32 px upsampled to 224, B0 Inc5 = 20 tasks); TOSCA with each --engines entry
('eager', 'cuda_graph'). Images sit on the GPU before timing starts; labels are random, so only
times are meaningful there.

    python benchmarks/bench_tosca.py                       # CPU, ~minutes
    python benchmarks/bench_tosca.py --device cuda --engines eager,cuda_graph
"""
from __future__ import annotations

import argparse
import copy
import time

import torch


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def train_and_eval(x_tr, y_tr, task_tr, x_te, y_te, task_te, tasks, cfg):
    """TOSCA on ready features: train every task, evaluate after each stage under every routing."""
    from lab.tosca.learner import Tosca, cpu_threads
    from lab.tosca.routing import ROUTINGS, route

    model = Tosca(x_tr.shape[1], cfg)
    t_train = t_eval = 0.0
    acc = {}
    for t, classes in enumerate(tasks):
        _sync(cfg.device)
        t0 = time.perf_counter()
        m = task_tr == t
        model.learn_task(classes, x_tr[m], y_tr[m])
        _sync(cfg.device)
        t1 = time.perf_counter()
        seen = task_te <= t
        with cpu_threads(cfg.threads if cfg.device == "cpu" else 0):
            logits = model.all_logits(x_te[seen])
            for r in ROUTINGS:
                res = route(logits, r, task_ids=task_te[seen], labels=y_te[seen])
                acc[r] = float((res.preds == y_te[seen].cpu()).float().mean() * 100)
        _sync(cfg.device)
        t_train, t_eval = t_train + t1 - t0, t_eval + time.perf_counter() - t1
    return t_train, t_eval, acc, model


def reference_passes(n_train: int, epochs: int, test_per_task: list[int]) -> dict:
    """Backbone image passes of the reference protocol (TOSCA's code on PILOT)."""
    test = sum((b + 1) * sum(test_per_task[: b + 1]) for b in range(len(test_per_task)))
    return {"train (epochs x train images)": epochs * n_train, "prototypes (1 x train images)": n_train,
            "test (modules x seen test images, every stage)": test}


def param_ratio() -> None:
    import timm

    from lab.experiments.tosca.layerwise import adapter_param_count, add_adapters
    from lab.tosca.luca import LuCA, param_count

    vit = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
    ad = adapter_param_count(add_adapters(copy.deepcopy(vit)))
    lu = LuCA(vit.num_features).num_parameters()
    assert lu == param_count(768, 48) == 149_808
    print("\n[3] trainable parameters, ViT-B/16 (d=768), from module shapes")
    print(f"    TOSCA LuCA per task (r=48):                  {lu:>10,}")
    print(f"    layer-wise adapters, 12 blocks x r=64 (APER): {ad:>10,}")
    print(f"    ratio adapters / LuCA per task:               {ad / lu:>10.2f}x   (paper: ~8x)")
    print(f"    TOSCA keeps one LuCA per task: its total passes the adapters' at T = {ad / lu:.1f} tasks "
          f"(T=10: {10 * lu:,}; T=20: {20 * lu:,})")
    print(f"    (heads excluded on both sides; the backbone has {sum(p.numel() for p in vit.parameters()):,})")


def cpu_bench(args) -> None:
    from lab import backbones, data, features
    from lab.tosca.learner import ToscaConfig

    scn = data.scenario(args.dataset, init=args.init, inc=args.inc, seed=1993)
    bb = backbones.load(args.backbone)
    images = {s: scn.images(s) for s in ("train", "test")}
    n_all = sum(len(v) for v in images.values())
    n_pass = min(n_all, args.pass_images or n_all)
    import numpy as np

    sample = np.concatenate([images["train"], images["test"]])[:n_pass]
    t0 = time.perf_counter()
    bb.embed(sample, batch_size=128, progress=False)
    t_pass = (time.perf_counter() - t0) * n_all / n_pass
    per_img = t_pass / n_all
    feats = features.scenario_features(scn, bb, progress=False)  # the cache holds this very pass
    tr_task, te_task = (torch.from_numpy(scn.train_task_ids), torch.from_numpy(scn.test_task_ids))
    cfg = ToscaConfig(epochs=args.epochs, engine=args.engines.split(",")[0])
    tasks = [list(t.classes) for t in scn.tasks]
    t_train, t_eval, acc, _ = train_and_eval(feats["train_x"], feats["train_y"], tr_task, feats["test_x"],
                                             feats["test_y"], te_task, tasks, cfg)
    ours = t_pass + t_train + t_eval
    print(f"{scn.name}, {bb.name}@{bb.resolution}px, {scn.num_tasks} tasks, {len(scn.train_labels)} train + "
          f"{len(scn.test_labels)} test images, {torch.get_num_threads()} torch threads, engine {cfg.engine}, "
          f"TOSCA training threads {cfg.threads}")
    _report(t_pass, n_all, n_pass, t_train, t_eval, acc, per_img, len(scn.train_labels), args.epochs,
            [len(scn.task_indices(t, "test")) for t in range(scn.num_tasks)], ours, target=1.2)


def _report(t_pass, n_all, n_pass, t_train, t_eval, acc, per_img, n_train, epochs, test_per_task, ours, target):
    how = "measured" if n_pass == n_all else f"measured on {n_pass} images, scaled to {n_all}"
    print(f"\n[1] one backbone feature pass over all {n_all} images: {t_pass:.2f} s ({how}; "
          f"{1e3 * per_img:.2f} ms/image)")
    print(f"    TOSCA training, all tasks x {epochs} epochs:   {t_train:.2f} s")
    print(f"    TOSCA evaluation, every stage, 3 routings:     {t_eval:.2f} s   (final A_B: " +
          ", ".join(f"{k} {v:.1f}" for k, v in acc.items()) + ")")
    print(f"    end-to-end / feature pass = ({t_pass:.2f} + {t_train:.2f} + {t_eval:.2f}) / {t_pass:.2f} = "
          f"{ours / t_pass:.3f}   (target <= {target}); training+evaluation alone = {(t_train + t_eval) / t_pass:.3f}")
    counts = reference_passes(n_train, epochs, test_per_task)
    ref = per_img * sum(counts.values()) + t_train + t_eval
    print(f"\n[2] reference-style run, from counts x {1e3 * per_img:.2f} ms per image pass (inference cost; the "
          f"reference's augmentation and autograd overhead are not added, so this favours it):")
    for k, v in counts.items():
        print(f"    {k:<48} {v:>10,} passes")
    print(f"    {'ours: 1 pass per image':<48} {n_all:>10,} passes")
    print(f"    reference ~ {ref:.1f} s vs ours {ours:.1f} s -> speed-up {ref / ours:.1f}x")


def gpu_bench(args) -> None:
    import timm
    import torch.nn.functional as F

    from lab.tosca.learner import ToscaConfig

    dev = args.device
    torch.manual_seed(0)
    n_tr, n_te, C, inc = args.gpu_train, args.gpu_test, 100, 5
    vit = timm.create_model(args.vit, pretrained=False, num_classes=0, img_size=args.res).to(dev).eval().requires_grad_(False)
    if args.compile:
        vit = torch.compile(vit)
    g = torch.Generator(device=dev).manual_seed(0)
    imgs = torch.randint(0, 256, (n_tr + n_te, 3, 32, 32), dtype=torch.uint8, device=dev, generator=g)
    y = torch.arange(n_tr + n_te, device=dev) % C
    mean = torch.full((1, 3, 1, 1), 0.5, device=dev)

    @torch.inference_mode()
    def feature_pass(images, batch=512):
        out = []
        for i in range(0, len(images), batch):
            x = F.interpolate(images[i:i + batch].float() / 255, size=args.res, mode="bilinear", align_corners=False)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.startswith("cuda")):
                out.append(vit((x - mean) / mean).float())
        return torch.cat(out)

    feature_pass(imgs[:2048])  # warm-up (cuBLAS/cuDNN autotune, compile) outside the timing
    _sync(dev)
    t0 = time.perf_counter()
    feats = feature_pass(imgs)
    _sync(dev)
    t_pass = time.perf_counter() - t0
    task = y // inc
    tasks = [list(range(t * inc, (t + 1) * inc)) for t in range(C // inc)]
    where = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "CPU (dry run)"
    print(f"{where}: {args.vit} random weights, {'bf16 autocast' if dev.startswith('cuda') else 'fp32'}{' + compile' if args.compile else ''}, "
          f"{n_tr} train + {n_te} test images (32 px -> {args.res}), {len(tasks)} tasks, {len(imgs) / t_pass:,.0f} images/s")
    for engine in args.engines.split(","):
        cfg = ToscaConfig(epochs=args.epochs, device=dev, engine=engine)
        x_tr, x_te = feats[:n_tr], feats[n_tr:]
        t_train, t_eval, acc, _ = train_and_eval(x_tr, y[:n_tr], task[:n_tr].cpu(), x_te, y[n_tr:], task[n_tr:].cpu(),
                                                 tasks, cfg)
        print(f"\n=== engine {engine} ===")
        _report(t_pass, len(imgs), len(imgs), t_train, t_eval, acc, t_pass / len(imgs), n_tr, args.epochs,
                [n_te // len(tasks)] * len(tasks), t_pass + t_train + t_eval, target=1.5)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dataset", nargs="+", default=["fashion_mnist_mini"])
    p.add_argument("--backbone", default="efficientnet_lite0")
    p.add_argument("--init", type=int, default=0)
    p.add_argument("--inc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--engines", default="eager", help="comma-separated TOSCA engines: eager, static, cuda_graph")
    p.add_argument("--pass-images", type=int, default=0,
                   help="time the feature pass on this many images and scale to all (0 = all)")
    p.add_argument("--gpu-train", type=int, default=50_000)
    p.add_argument("--gpu-test", type=int, default=10_000)
    p.add_argument("--compile", action="store_true", help="torch.compile the backbone (GPU path)")
    p.add_argument("--synthetic", action="store_true",
                   help="the GPU path's synthetic CIFAR-100-sized setup on any device (implied by --device cuda)")
    p.add_argument("--vit", default="vit_base_patch16_224", help="backbone of the synthetic path (random weights)")
    p.add_argument("--res", type=int, default=224, help="input resolution of the synthetic path")
    p.add_argument("--skip-params", action="store_true")
    args = p.parse_args(argv)
    gpu_bench(args) if (args.synthetic or args.device != "cpu") else cpu_bench(args)
    if not args.skip_params:
        param_ratio()


if __name__ == "__main__":
    main()
