"""L1 / epochs / routing panel for the TOSCA notebook: re-train TOSCA on cached features."""
from __future__ import annotations

from lab.widgets import Panel

ROUTING_CHOICES = ("per-sample", "per-batch (class-ordered)", "per-batch (shuffled)", "oracle")


class ToscaPanel(Panel):
    """Re-train TOSCA on cached features for an L1 coefficient and a number of epochs, then route
    the test set: accuracy, routing accuracy, gate sparsity per task and the task x task gate
    overlap. Trained models are memoised per (l1, epochs), so switching routing is instant.

    ``data``: a :class:`lab.tosca.methods.ScenarioData`. ``config``: the other TOSCA settings.
    """

    title = "Re-train TOSCA: L1 coefficient, epochs, routing"

    def __init__(self, data, *, l1: float = 5e-4, epochs: int = 3, routing: str = "per-sample",
                 batch_size: int = 48, config=None, seed: int = 0, gate_samples: int = 300):
        import ipywidgets as w
        import torch

        from lab.tosca.learner import ToscaConfig

        self.data, self.config, self.seed = data, config or ToscaConfig(), seed
        # gate statistics on at most `gate_samples` training images per task: they describe the
        # modules as well as all images do, at a fraction of the cost (the panel must feel live)
        g = torch.Generator().manual_seed(seed)
        self._gate_idx = torch.cat([idx[torch.randperm(len(idx), generator=g)[:gate_samples]]
                                    for idx in (torch.nonzero(data.train_task == t).squeeze(1)
                                                for t in range(data.num_tasks))])
        self._models: dict[tuple[float, int], tuple] = {}
        super().__init__({
            "l1": w.FloatLogSlider(value=l1, base=10, min=-6, max=-1, step=0.25, description="L1",
                                   readout_format=".1e", continuous_update=False),
            "epochs": w.IntSlider(value=epochs, min=1, max=20, description="epochs", continuous_update=False),
            "routing": w.Dropdown(options=ROUTING_CHOICES, value=routing, description="routing"),
            "batch_size": w.IntSlider(value=batch_size, min=1, max=256, description="test batch",
                                      continuous_update=False),
        })

    def _train(self, l1: float, epochs: int):
        from dataclasses import replace

        from lab.tosca import analysis as TA
        from lab.tosca.learner import Tosca

        key = (float(l1), int(epochs))
        if key not in self._models:
            d = self.data
            model = Tosca(d.dim, replace(self.config, l1=float(l1), epochs=int(epochs)))
            for t, classes in enumerate(d.task_classes):
                m = d.train_task == t
                model.learn_task(classes, d.train_x[m], d.train_y[m])
            x, task = d.train_x[self._gate_idx], d.train_task[self._gate_idx]
            gates = TA.gate_sparsity(model, x, task)
            ov = TA.overlap(model, x, task).pivot(index="task_i", columns="task_j", values="cosine")
            self._models[key] = (model, model.all_logits(d.test_x).cpu(), gates, ov)
        return self._models[key]

    def compute(self, l1: float, epochs: int, routing: str, batch_size: int):
        import torch

        from lab import analysis, plots
        from lab.tosca.routing import choose, entropy, predict

        if routing not in ROUTING_CHOICES:
            raise ValueError(f"unknown routing {routing!r}; valid: {', '.join(ROUTING_CHOICES)}")
        model, logits, gates, ov = self._train(l1, epochs)
        d = self.data
        if routing == "per-batch (shuffled)":
            order = torch.randperm(len(d.test_y), generator=torch.Generator().manual_seed(self.seed))
            choice = analysis.route_in_order(logits, order, batch_size)
        elif routing == "per-batch (class-ordered)":
            # the reference's order: stable sort by label (lab.tosca.routing's per-batch)
            choice = analysis.route_in_order(logits, torch.sort(d.test_y, stable=True).indices, batch_size)
        else:
            choice = choose(entropy(logits), routing, task_ids=d.test_task)
        acc = float((predict(logits, choice) == d.test_y).float().mean() * 100)
        racc = float((choice == d.test_task).float().mean() * 100)
        result = {"l1": float(l1), "epochs": int(epochs), "routing": routing, "batch_size": int(batch_size),
                  "accuracy": acc, "routing_accuracy": racc, "head_scale": model.head.scale,
                  "gate_frac_closed": float(gates.frac_closed.mean()),
                  "gate_mean_departure": float(gates.mean_departure.mean()),
                  "mean_offdiag_overlap": float(ov.values[~torch.eye(len(ov), dtype=torch.bool).numpy()].mean())
                  if len(ov) > 1 else float("nan"),
                  "gates": gates, "overlap": ov}
        figs = [plots.heatmap(ov, title=f"gate overlap (cosine of centred mean gates), L1={l1:.1e}", zmin=-1, zmax=1,
                              colorscale="RdBu_r", x_title="task", y_title="task", height=360),
                plots.bar(gates, x="task", y="mean_departure", range_y=None,
                          title="how far each task's gates move from the neutral 0.5 (mean |gate - 0.5|)")]
        return result, figs

    def describe(self, r) -> str:
        how = r["routing"] if r["routing"] in ("per-sample", "oracle") else f"{r['routing']}, batch {r['batch_size']}"
        return (f"accuracy <b>{r['accuracy']:.1f}%</b>, routing accuracy {r['routing_accuracy']:.1f}% ({how}), "
                f"mean |gate-0.5| {r['gate_mean_departure']:.3f}, off-diagonal overlap "
                f"{r['mean_offdiag_overlap']:.2f}, head scale {r['head_scale']:.1f}")
