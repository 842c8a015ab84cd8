"""The TOSCA notebook's panel: re-train TOSCA on cached features and route its test set live."""
from __future__ import annotations

from lab.tosca.routing import list_routings
from lab.widgets import Panel


def _routing_choices() -> tuple[str, ...]:
    """Every routing of :mod:`lab.tosca.routing`'s registry; its per-batch protocol in both test orders."""
    out: list[str] = []
    for r in list_routings():
        out += ["per-batch (class-ordered)", "per-batch (shuffled)"] if r == "per-batch" else [r]
    return tuple(out)


ROUTING_CHOICES = _routing_choices()
BATCHED = ("per-batch (class-ordered)", "per-batch (shuffled)")   # the routings that read a test batch
BASELINES = ("none", "simplecil", "finetune", "joint")  # lab.experiments.tosca.methods on the same cached features


class ToscaPanel(Panel):
    """Re-train TOSCA on cached features for an L1 coefficient, a number of epochs and a head-scale
    parametrisation, then route the test set: accuracy, routing accuracy, gate sparsity per task,
    the task x task gate overlap, and final accuracy next to a baseline trained on the same
    features. Trained models are memoised per (l1, epochs, σ), baselines per (name, epochs), so
    switching routing, test batch or a baseline already trained is instant.

    ``data``: a :class:`lab.experiments.tosca.methods.ScenarioData`. ``config``: the other TOSCA settings.
    The status line warns when the head's scale σ ended <= 0 (possible with ``sigma="free"``).
    """

    title = "Re-train TOSCA: L1 coefficient, epochs, head scale, routing, baseline"

    def __init__(self, data, *, l1: float = 5e-4, epochs: int = 3, routing: str = "per-sample",
                 batch_size: int = 48, sigma: str | None = None, baseline: str = "simplecil", config=None,
                 seed: int = 0, gate_samples: int = 300):
        import ipywidgets as w
        import torch

        from lab.tosca.head import SCALE_PARAMS
        from lab.tosca.learner import ToscaConfig

        self.data, self.config, self.seed = data, config or ToscaConfig(), seed
        if routing not in ROUTING_CHOICES:
            raise ValueError(f"unknown routing {routing!r}; valid: {', '.join(ROUTING_CHOICES)}")
        if baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(BASELINES)}")
        # gate statistics on at most `gate_samples` training images per task: they describe the
        # modules as well as all images do, at a fraction of the cost (the panel must feel live)
        g = torch.Generator().manual_seed(seed)
        self._gate_idx = torch.cat([idx[torch.randperm(len(idx), generator=g)[:gate_samples]]
                                    for idx in (torch.nonzero(data.train_task == t).squeeze(1)
                                                for t in range(data.num_tasks))])
        self._models: dict[tuple[float, int, str], tuple] = {}
        self._methods: dict[tuple[float, int, str], object] = {}  # the same keys: the harness's ToscaMethod
        self._baselines: dict[tuple[str, int], float] = {}
        super().__init__({
            "l1": w.FloatLogSlider(value=l1, base=10, min=-6, max=-1, step=0.25, description="L1",
                                   readout_format=".1e", continuous_update=False),
            "epochs": w.IntSlider(value=epochs, min=1, max=20, description="epochs", continuous_update=False),
            "sigma": w.Dropdown(options=SCALE_PARAMS, value=sigma or self.config.head_scale_param,
                                description="head σ"),
            "routing": w.Dropdown(options=ROUTING_CHOICES, value=routing, description="routing"),
            "batch_size": w.IntSlider(value=batch_size, min=1, max=256, description="test batch",
                                      continuous_update=False),
            "baseline": w.Dropdown(options=BASELINES, value=baseline, description="baseline"),
        })

    def sync_controls(self) -> None:
        """The test batch matters only to the per-batch routings: disabled (and said why) for the others."""
        routing = self.controls["routing"].value
        self.inactive = {} if routing in BATCHED else {
            "batch_size": f"not used by {routing}: it routes each image on its own"}

    def _train(self, l1: float, epochs: int, sigma: str):
        from dataclasses import replace

        from lab.experiments.tosca import analysis as TA
        from lab.experiments.tosca import methods

        key = (float(l1), int(epochs), sigma)
        if key not in self._models:
            d = self.data
            cfg = replace(self.config, l1=float(l1), epochs=int(epochs), head_scale_param=sigma)
            method = methods.fit(methods.create("tosca", d.dim, cfg), d)
            self._methods[key] = method  # its route_context serves every router (the ridge on demand)
            model = method.model
            x, task = d.train_x[self._gate_idx], d.train_task[self._gate_idx]
            gates = TA.gate_sparsity(model, x, task)
            ov = TA.overlap(model, x, task).pivot(index="task_i", columns="task_j", values="cosine")
            self._models[key] = (model, model.all_logits(d.test_x).cpu(), gates, ov)
        return self._models[key]

    def _baseline(self, name: str, epochs: int) -> float:
        """Final accuracy (%) of a baseline after the last task, trained with the same epochs."""
        from dataclasses import replace

        from lab.experiments.tosca import methods

        key = (name, int(epochs))
        if key not in self._baselines:
            d = self.data
            m = methods.fit(methods.create(name, d.dim, replace(self.config, epochs=int(epochs))), d)
            logits = m.logits(d, slice(None))[0]
            self._baselines[key] = float((logits.argmax(1) == d.test_y).float().mean() * 100)
        return self._baselines[key]

    def _route(self, method, logits, routing: str, batch_size: int):
        import torch

        from lab import analysis
        from lab.tosca.routing import choose

        d = self.data
        if routing == "per-batch (shuffled)":
            order = torch.randperm(len(d.test_y), generator=torch.Generator().manual_seed(self.seed))
            return analysis.route_in_order(logits, order, batch_size)
        if routing == "per-batch (class-ordered)":
            # the reference's order: stable sort by label (lab.tosca.routing's per-batch)
            return analysis.route_in_order(logits, torch.sort(d.test_y, stable=True).indices, batch_size)
        ctx = method.route_context(d, torch.arange(len(d.test_y)))  # the ridge router's statistics on demand
        ctx.task_ids = d.test_task
        return choose(logits, routing, ctx)

    def compute(self, l1: float, epochs: int, sigma: str, routing: str, batch_size: int, baseline: str):
        import pandas as pd
        import torch

        from lab import plots
        from lab.tosca.head import scale_warning
        from lab.tosca.routing import predict

        if routing not in ROUTING_CHOICES:
            raise ValueError(f"unknown routing {routing!r}; valid: {', '.join(ROUTING_CHOICES)}")
        model, logits, gates, ov = self._train(l1, epochs, sigma)
        d = self.data
        choice = self._route(self._methods[float(l1), int(epochs), sigma], logits, routing, batch_size)
        acc = float((predict(logits, choice) == d.test_y).float().mean() * 100)
        racc = float((choice == d.test_task).float().mean() * 100)
        oracle = float((predict(logits, d.test_task.long()) == d.test_y).float().mean() * 100)
        result = {"l1": float(l1), "epochs": int(epochs), "sigma": sigma, "routing": routing,
                  "batch_size": int(batch_size), "accuracy": acc, "routing_accuracy": racc,
                  "oracle_accuracy": oracle, "head_scale": model.head.scale,
                  "warning": scale_warning(model.head.scale),
                  "gate_frac_closed": float(gates.frac_closed.mean()),
                  "gate_mean_departure": float(gates.mean_departure.mean()),
                  "mean_offdiag_overlap": float(ov.values[~torch.eye(len(ov), dtype=torch.bool).numpy()].mean())
                  if len(ov) > 1 else float("nan"),
                  "gates": gates, "overlap": ov, "baseline": baseline,
                  "baseline_accuracy": self._baseline(baseline, epochs) if baseline != "none" else None}
        bars = pd.DataFrame([{"method": f"TOSCA ({routing})", "accuracy": acc},
                             {"method": "TOSCA (oracle routing)", "accuracy": oracle}]
                            + ([{"method": baseline, "accuracy": result["baseline_accuracy"]}]
                               if baseline != "none" else []))
        figs = [plots.heatmap(ov, title=f"gate overlap (cosine of centred mean gates), L1={l1:.1e}", zmin=-1, zmax=1,
                              colorscale="RdBu_r", x_title="task", y_title="task", height=360),
                plots.bar(gates, x="task", y="mean_departure", range_y=None,
                          title=f"how far each task's gates move from the neutral 0.5 (mean |gate - 0.5|), L1={l1:.1e}"),
                plots.bar(bars, x="method", y="accuracy", range_y=(0, 100),
                          title=f"final accuracy (%): TOSCA, {epochs} epochs, L1={l1:.1e}, σ {sigma}"
                                + (f" vs {baseline}" if baseline != "none" else ""))]
        return result, figs

    def describe(self, r) -> str:
        how = f"{r['routing']}, batch {r['batch_size']}" if r["routing"] in BATCHED else r["routing"]
        base = (f"; {r['baseline']} {r['baseline_accuracy']:.1f}%" if r["baseline_accuracy"] is not None else "")
        line = (f"accuracy <b>{r['accuracy']:.1f}%</b>, routing accuracy {r['routing_accuracy']:.1f}% ({how}), "
                f"oracle {r['oracle_accuracy']:.1f}%{base}; mean |gate-0.5| {r['gate_mean_departure']:.3f}, "
                f"off-diagonal overlap {r['mean_offdiag_overlap']:.2f}, head scale σ {r['head_scale']:.2f}")
        if r["warning"]:
            line += f"<br><b style='color:#b00'>{r['warning']}</b>"
        return line
