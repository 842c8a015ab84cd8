"""AWARe across processes with Hugging Face accelerate: ``accelerate launch ... -m lab aware finetune``.

When a launcher started several processes (``WORLD_SIZE`` > 1), :func:`session` returns a
:class:`Session` on accelerate's ``Accelerator`` (DDP by default — gloo on CPU, NCCL on GPUs — or
DeepSpeed ZeRO-2 from ``configs/accelerate/``; FSDP is refused in one line: it shards the weights
AWARe merges its rows into); in one process it returns None and nothing
changes. A session:

- **profiles saliency sharded**: rank r hooks calibration batches r, r+W, ...; the per-layer sums
  and counts are all-reduced (float64), so the profile is the one a single process computes;
- **trains data-parallel with the single-process recipe**: every rank draws the same shuffled order,
  step s's global batch (``cfg.batch_size``) is split across ranks, and each rank's answer-token loss
  is weighted by its share of the global answer tokens, so the averaged gradient is the gradient of
  the global batch's mean loss (the same trained weights as one process, within float tolerance);
- **keeps frozen rows frozen**: AWARe's retained rows live in ``RowSplitLinear.base_layer`` with
  ``requires_grad=False``, so they have no optimizer state and DDP puts them in no gradient bucket
  (a communication hook counts the elements all-reduced per step: exactly the trainable ones); after
  training, a sha256 of every frozen tensor is compared across ranks and with the one before training.

Only rank 0 prints and writes (``Session.is_main``). The ranks meet first (:func:`rendezvous`): a rank
waits at most ``$LAB_DIST_TIMEOUT`` seconds (default 60) for the others, then stops with one line.
"""
from __future__ import annotations

import hashlib
import os
import time
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn


def launched() -> bool:
    """Whether a launcher (accelerate launch, torchrun) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


TIMEOUT_ENV = "LAB_DIST_TIMEOUT"   # seconds a rank waits for the others to join (default below)
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 24 * 3600.0


def rendezvous_timeout() -> float:
    """``$LAB_DIST_TIMEOUT`` (seconds, default 60): how long a rank waits for every other rank."""
    from lab import _validate as V

    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = raw
    return float(V.number(f"${TIMEOUT_ENV}", value, gt=0, le=MAX_TIMEOUT_S))


_HOW = ("start every rank with `accelerate launch --num_processes {world} -m lab aware finetune ...` (or torchrun), "
        "or unset WORLD_SIZE for one process")


def launch_env() -> tuple[int, int, str, int, float]:
    """``(world, rank, master address, port, timeout)`` from the launcher's environment, checked
    (one line naming what is missing or bad): what :func:`rendezvous` needs, before any work."""
    from lab import _validate as V

    env = os.environ
    world = V.count("$WORLD_SIZE", _int(env.get("WORLD_SIZE", "1")), maximum=65536)
    missing = [f"${k}" for k in ("RANK", "MASTER_ADDR") if not env.get(k)]
    if missing:
        raise V.BadInput(f"$WORLD_SIZE {world}: one of {world} launched processes, but {' and '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not set; {_HOW.format(world=world)}")
    rank = V.count("$RANK", _int(env["RANK"]), minimum=0, maximum=world - 1)
    port = V.count("$MASTER_PORT", _int(env.get("MASTER_PORT") or "29500"), maximum=65535)
    return world, rank, env["MASTER_ADDR"], port, rendezvous_timeout()


def _int(raw: str):
    try:
        return int(raw)
    except ValueError:
        return raw


@contextmanager
def _c10d_quiet():
    """The c10d store logs every failed connect (and a C++ stack) on fd 2: kept out of the one-line
    error (they are written to a temporary file, dropped unless the join succeeds)."""
    import tempfile

    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def rendezvous(cpu: bool) -> None:
    """Join the launcher's process group, waiting at most :func:`rendezvous_timeout` seconds for
    the other ranks (a ``WORLD_SIZE`` > 1 with no other process waited forever before): one line
    naming what is missing otherwise. Collectives after it keep torch's default timeout."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized() or not launched():
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return      # torchrun / accelerate launch: its agent started every rank and holds the store they join
    world, rank, addr, port, timeout = launch_env()
    how = _HOW.format(world=world)
    try:
        with _c10d_quiet():
            store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=timeout),
                                  wait_for_workers=True)
    except (RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"$WORLD_SIZE {world}: rank {rank} waited {timeout:g} s at {addr}:{port} and the other "
                           f"{world - 1} process(es) did not join ({first}); {how} (the wait: ${TIMEOUT_ENV})") from None
    dist.init_process_group("gloo" if cpu else "nccl", store=store, rank=rank, world_size=world)


def session(device: str | None = None) -> "Session | None":
    """A :class:`Session` when launched as one of several processes, else None. ``device`` cpu (or
    no CUDA): gloo on the CPU; otherwise each rank takes the GPU of its local rank."""
    if not launched():
        return None
    return Session(cpu=str(device or "").startswith("cpu") or not torch.cuda.is_available())


class Session:
    def __init__(self, cpu: bool = False):
        from accelerate import Accelerator

        # DDP's default find_unused_parameters=False: every trainable parameter takes part in every step
        # (the downstream tasks ask about images, so the projector always runs); a batch that left one
        # out would stop DDP with an error rather than all-reduce zeros one process never computed.
        rendezvous(cpu)      # every rank has joined within $LAB_DIST_TIMEOUT s, or one line says who is missing
        self.acc = Accelerator(cpu=cpu)
        if self.acc.distributed_type.name == "FSDP":
            raise ValueError("FSDP shards every weight, and AWARe merges its trained rows into the full weights after "
                             "training: not supported by lab aware finetune yet; use configs/accelerate/ddp.yaml or "
                             "deepspeed_zero2.yaml (weights replicated)")
        self.rank, self.world, self.is_main = self.acc.process_index, self.acc.num_processes, self.acc.is_main_process
        self.device = self.acc.device
        self.report: dict = {"world": self.world, "distributed_type": str(self.acc.distributed_type),
                             "backend": str(self.acc.state.backend)}

    @contextmanager
    def main_first(self):
        """Rank 0 builds (and caches) first; the others then read its cache."""
        with self.acc.main_process_first():
            yield

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        t = t.to(self.device)
        dist.all_reduce(t)
        return t.cpu()

    def shard_batch_size(self, n: int, batch_size: int = 8) -> int:
        """The calibration batch size that gives every rank at least one batch of ``n`` samples."""
        return max(1, min(batch_size, n // self.world))

    def profile(self, model: nn.Module, batches, **kw):
        """:func:`lab.aware.saliency.profile` with the batches sharded across ranks, sums reduced."""
        from lab.aware.saliency import Saliency, profile

        batches = list(batches)
        mine = batches[self.rank::self.world]
        if not mine:
            raise ValueError(f"{len(batches)} calibration batches for {self.world} processes: give more samples")
        local = profile(model, mine, **kw)
        names = list(local.scores)
        counts = torch.tensor([local.meta["counts"][n] for n in names] + [local.n_samples], dtype=torch.float64)
        sums = [local.scores[n].double() * local.meta["counts"][n] for n in names]
        flat = self._all_reduce(torch.cat([*sums, counts]))
        counts = flat[-len(counts):]
        out, at = {}, 0
        for i, n in enumerate(names):
            d = local.scores[n].numel()
            out[n] = (flat[at:at + d] / max(counts[i].item(), 1)).float()
            at += d
        c = {n: int(counts[i]) for i, n in enumerate(names)}
        self.report["profile"] = {"batches_per_rank": len(mine), "samples": int(counts[-1])}
        return Saliency(out, int(counts[-1]), local.seconds,
                        meta={"never_called": [n for n in names if c[n] == 0], "counts": c, "ranks": self.world})

    def frozen_digest(self, model: nn.Module) -> str:
        """sha256 over every frozen tensor: parameters that do not train and, for row-split layers,
        the retained rows of ``base_layer`` (what must never move)."""
        from lab.aware.freeze import RowSplitLinear

        h = hashlib.sha256()
        for name, p in model.named_parameters():
            if not p.requires_grad:
                h.update(name.encode())
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
        for name, m in model.named_modules():
            if isinstance(m, RowSplitLinear):
                rows = m.frozen_rows.cpu()
                h.update(m.base_layer.weight.detach().cpu()[rows].contiguous().numpy().tobytes())
        return h.hexdigest()

    def train(self, model: nn.Module, groups: list[dict], qa, enc, cfg, *, progress: bool = True,
              desc: str = "fine-tuning") -> dict:
        """:func:`lab.experiments.aware.run.finetune.train`'s recipe, data-parallel (same global batch)."""
        import torch.distributed as dist
        from tqdm.auto import tqdm

        from lab.experiments.aware.run.finetune import _schedule, iterate
        from lab.experiments.aware.run.scoring import answer_loss

        if not groups or cfg.steps == 0:
            return {"losses": [], "step_seconds": []}
        if len(qa) == 0:
            raise ValueError(f"{qa.name}: no training samples")
        if cfg.batch_size < self.world:
            raise ValueError(f"batch size {cfg.batch_size} < {self.world} processes: every rank needs a sample")
        before = self.frozen_digest(model)
        torch.manual_seed(cfg.seed)
        rng = np.random.RandomState(cfg.seed)                         # the same order on every rank
        opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        base = [g["lr"] for g in opt.param_groups]
        params = [p for g in groups for p in g["params"]]
        trainable = sum(p.numel() for p in params)
        wrapped, opt = self.acc.prepare(model, opt)
        reduced = [0]
        if isinstance(wrapped, nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting_hook(state, bucket):
                reduced[0] += bucket.buffer().numel()
                return allreduce_hook(state, bucket)

            wrapped.register_comm_hook(None, counting_hook)
        order = np.concatenate([rng.permutation(len(qa)) for _ in range(cfg.steps * cfg.batch_size // len(qa) + 1)])
        losses, times = [], []
        wrapped.train()
        for step in tqdm(range(cfg.steps), desc=desc, unit="step", disable=not (progress and self.is_main), leave=False):
            t0 = time.perf_counter()
            for g, lr in zip(opt.param_groups, base):
                g["lr"] = lr * _schedule(step, cfg.steps, cfg.warmup)
            mine = order[step * cfg.batch_size:(step + 1) * cfg.batch_size][self.rank::self.world]
            batch = next(iterate(qa, enc, len(mine), answers=True, order=mine))
            batch.pop("prefix_len", None)                             # one forward through the DDP wrapper
            n_local = (batch["labels"] != -100).sum().double()
            n_global = self._all_reduce(n_local.clone())
            loss = answer_loss(wrapped, batch)                        # mean over this rank's answer tokens
            self.acc.backward(loss * (n_local * self.world / n_global).to(loss.device, loss.dtype))   # DDP averages
            self.acc.clip_grad_norm_([p for p in wrapped.parameters() if p.requires_grad], cfg.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(self._all_reduce((loss.detach().double() * n_local).cpu()) / n_global))
            times.append(time.perf_counter() - t0)
        model.eval()
        after = self.frozen_digest(model)
        digests = [None] * self.world
        dist.all_gather_object(digests, after)
        state = sum(t.numel() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        steps = max(cfg.steps, 1)
        self.report["train"] = {
            "trainable": trainable, "optimizer_state_elements": int(state),
            "grad_elements_reduced_per_step": reduced[0] / steps if reduced[0] else None,
            "frozen_sha256": after, "frozen_unchanged": after == before,
            "frozen_identical_on_ranks": len(set(digests)) == 1}
        if not (after == before and len(set(digests)) == 1):
            raise RuntimeError(f"frozen weights moved or differ across ranks: {self.report['train']}")
        self.acc.free_memory()                                        # unwrap: the model is a plain module again
        return {"losses": losses, "step_seconds": times}

    def summary(self) -> str:
        """One line: processes, backend, and what the last training reduced, kept and checked."""
        head = f"{self.world} processes ({self.acc.distributed_type.name}, {self.report['backend']})"
        t = self.report.get("train")
        if not t:
            return head
        reduced = t["grad_elements_reduced_per_step"]
        return (f"{head}: {t['trainable']:,} trainable; "
                + (f"{reduced:,.0f} gradient elements all-reduced per step; " if reduced is not None else "")
                + f"optimizer state {t['optimizer_state_elements']:,} elements; frozen weights unchanged and "
                  f"identical on every rank (sha256 {t['frozen_sha256'][:12]})")

    def barrier(self) -> None:
        self.acc.wait_for_everyone()

