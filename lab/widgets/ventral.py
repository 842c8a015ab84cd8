"""Stage picker for the ventral-stream notebook: one stage of the frozen backbone at a time."""
from __future__ import annotations

from lab.widgets import Panel

PROJECTION_NAMES = {"pca": "PCA", "tsne": "t-SNE"}  # lab.probes.project_2d's methods, as a reader names them


def _project(x, projection: str):
    """:func:`lab.probes.project_2d`; t-SNE on one OpenMP thread. scikit-learn's t-SNE and torch each
    bring their own OpenMP runtime; once torch has run in the kernel, two runtimes spin on the same
    cores and a 500-point t-SNE took 5-13 s instead of 1.3 s on one thread (2-core machine)."""
    from lab import probes

    if projection != "tsne":
        return probes.project_2d(x, projection)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return probes.project_2d(x, projection)


class StagePanel(Panel):
    """Pick a stage (and a 2-D projection): its linear-probe and nearest-prototype accuracy, the
    test features of that stage projected to 2-D, and its linear CKA with every other stage.

    ``train`` / ``test``: ``{stage: [N, C]}`` pooled stage features (``lab.analysis.stage_features``
    or the feature cache); labels ``[N]``. Probe results are memoised per stage.
    """

    title = "Explore one stage of the frozen stream"

    def __init__(self, train: dict, train_y, test: dict, test_y, class_names: list[str], *,
                 stage: str | None = None, projection: str = "pca", epochs: int = 20, max_points: int = 600):
        import ipywidgets as w

        self.train, self.train_y, self.test, self.test_y = train, train_y, test, test_y
        self.class_names, self.epochs, self.max_points = list(class_names), epochs, max_points
        self._probe: dict[str, tuple[float, float]] = {}
        self._cka: dict[str, dict[str, float]] = {}
        self._proj: dict[tuple[str, str], object] = {}  # (stage, projection) -> [N, 2]
        stages = list(train)
        super().__init__({
            "stage": w.Dropdown(options=stages, value=stage or stages[-1], description="stage"),
            "projection": w.ToggleButtons(options=[(v, k) for k, v in PROJECTION_NAMES.items()], value=projection,
                                          description="projection"),
        })

    def compute(self, stage: str, projection: str):
        from lab import analysis, plots, probes

        if stage not in self._probe:
            self._probe[stage] = (
                probes.linear_probe_accuracy(self.train[stage], self.train_y, self.test[stage], self.test_y,
                                             epochs=self.epochs),
                probes.prototype_accuracy(self.train[stage], self.train_y, self.test[stage], self.test_y))
            self._cka[stage] = {s: analysis.linear_cka(self.test[stage], self.test[s]) for s in self.test}
        lin, proto = self._probe[stage]
        if (stage, projection) not in self._proj:  # t-SNE takes a second or more: computed once per stage
            self._proj[stage, projection] = _project(self.test[stage], projection)
        z = self._proj[stage, projection]
        scatter = plots.scatter_2d(z, self.test_y, self.class_names, max_points=self.max_points,
                                   title=f"{stage} ({self.test[stage].shape[1]} channels), "
                                         f"{PROJECTION_NAMES[projection]} of test features")
        import pandas as pd

        cka = pd.DataFrame({"stage": list(self._cka[stage]), "cka": list(self._cka[stage].values())})
        bar = plots.bar(cka, x="stage", y="cka", title=f"linear CKA of {stage} with every stage (test images)")
        result = {"stage": stage, "projection": projection, "dim": int(self.test[stage].shape[1]),
                  "linear_probe": lin, "prototype": proto,
                  "cka": dict(self._cka[stage])}
        return result, [scatter, bar]

    def describe(self, r) -> str:
        return (f"<b>{r['stage']}</b> ({PROJECTION_NAMES[r['projection']]}): linear probe {r['linear_probe']:.3f}, nearest prototype "
                f"{r['prototype']:.3f} ({r['dim']} channels)")
