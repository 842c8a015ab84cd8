"""Three pictures of the methods, drawn with plotly shapes (no image files): what the notebooks'
prose describes, in one glance each.

* :func:`luca` — one LuCA module (``lab/tosca/luca.py``): the adapter, then the calibrator's gate,
  on the frozen backbone's decision-point feature;
* :func:`tosca_inference` — TOSCA at test time (``lab/tosca/learner.py``, ``lab/tosca/routing.py``):
  one backbone pass, every task's module on the same feature, a router picking one module's answer;
* :func:`aware_pipeline` — AWARe (``lab/aware``): profile the salient output neurons on a calibration
  set, freeze the top-ρ rows, fine-tune the rest, merge back into a standard model.

Each returns a ``plotly.graph_objects.Figure`` of fixed size (its boxes and text are laid out for it).
"""
from __future__ import annotations

from dataclasses import dataclass

WIDTH = 760
FROZEN, TRAINED, DATA, ROUTE = "#d0d7de", "#ffd8b5", "#ddf4ff", "#dafbe1"   # fills: frozen / trained / data / routing
_EDGE = "#57606a"


@dataclass(frozen=True)
class _Box:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str
    fill: str = DATA

    @property
    def left(self) -> tuple[float, float]:
        return self.x0, (self.y0 + self.y1) / 2

    @property
    def right(self) -> tuple[float, float]:
        return self.x1, (self.y0 + self.y1) / 2

    @property
    def top(self) -> tuple[float, float]:
        return (self.x0 + self.x1) / 2, self.y1

    @property
    def bottom(self) -> tuple[float, float]:
        return (self.x0 + self.x1) / 2, self.y0


def _figure(boxes: list[_Box], arrows: list[tuple[tuple, tuple]], title: str, height: int,
            notes: list[tuple[float, float, str]] = (), legend: bool = True):
    """Boxes (rounded look: a rectangle and its centred text), arrows from point to point, notes (small
    text), on a 0..100 x 0..100 canvas with no axes."""
    import plotly.graph_objects as go

    from lab.report.readable import text_width

    inner = WIDTH - 20   # the canvas: the figure less its side margins
    for b in boxes:      # every line of a box's text inside the box (a diagram that does not fit fails here)
        room = (b.x1 - b.x0) / 100 * inner - 8
        wide = [ln for ln in b.text.split("<br>") if text_width(ln, 12) > room]
        if wide:
            raise ValueError(f"diagram box text {wide[0]!r} is wider than its box ({room:.0f} px)")
    fig = go.Figure()
    for b in boxes:
        fig.add_shape(type="rect", x0=b.x0, y0=b.y0, x1=b.x1, y1=b.y1, fillcolor=b.fill,
                      line=dict(color=_EDGE, width=1.2), layer="below")
        fig.add_annotation(x=(b.x0 + b.x1) / 2, y=(b.y0 + b.y1) / 2, text=b.text, showarrow=False,
                           font=dict(size=12, color="#1f2328"), align="center")
    for (x0, y0), (x1, y1) in arrows:
        fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="",
                           showarrow=True, arrowhead=3, arrowsize=1.2, arrowwidth=1.5, arrowcolor=_EDGE)
    for x, y, text in notes:
        fig.add_annotation(x=x, y=y, text=text, showarrow=False, font=dict(size=11, color="#57606a"))
    if legend:   # what the colours mean: one invisible marker per fill
        for name, colour in (("frozen", FROZEN), ("trained", TRAINED), ("data / features", DATA),
                             ("routing / selection", ROUTE)):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                     marker=dict(symbol="square", size=14, color=colour,
                                                 line=dict(color=_EDGE, width=1))))
    fig.update_xaxes(range=[0, 100], visible=False, fixedrange=True)
    fig.update_yaxes(range=[0, 100], visible=False, fixedrange=True)
    fig.update_layout(title=title, width=WIDTH, height=height, plot_bgcolor="white", margin=dict(l=10, r=10, t=60, b=40),
                      legend=dict(orientation="h", x=0, y=-0.02, yanchor="top"), showlegend=legend)
    return fig


def luca():
    """One LuCA on the decision-point feature ``x``: adapter ``h = LN(x + a(x))``, calibrator gate
    ``s(h) = σ(W₂ ReLU(W₁ h))``, output ``h ⊙ s(h)`` (the 'tosca' flow of ``lab/tosca/luca.py``)."""
    img = _Box(0, 38, 9, 62, "image", DATA)
    bb = _Box(12, 30, 26, 70, "frozen<br>backbone", FROZEN)
    x = _Box(29, 40, 37, 60, "x<br>(d)", DATA)
    ad = _Box(41, 58, 67, 88, "adapter<br>h = LN(x + a(x))<br>a: d → r → d", TRAINED)
    cal = _Box(41, 12, 67, 42, "calibrator<br>s(h) = σ(W₂ ReLU(W₁h))<br>a gate per dimension", TRAINED)
    out = _Box(71, 40, 83, 60, "h ⊙ s(h)", DATA)
    head = _Box(87, 38, 100, 62, "cosine<br>head", TRAINED)
    arrows = [(img.right, bb.left), (bb.right, x.left), (x.right, ad.left), (ad.bottom, cal.top),
              (ad.right, out.left), (cal.right, out.left), (out.right, head.left)]
    notes = [(33, 32, "decision point"), (54, 95, "LuCA: one per task, r = d/16")]
    return _figure([img, bb, x, ad, cal, out, head], arrows,
                   "LuCA: an adapter, then a gate, on the decision-point feature",
                   340, notes)


def tosca_inference(n_modules: int = 3):
    """TOSCA at test time: one backbone pass gives ``x``; every task's LuCA and the shared head score it
    (logits ``[T, N, C]``); the router (per-sample entropy: the surest module) picks whose prediction counts."""
    img = _Box(0, 40, 8, 60, "test<br>image", DATA)
    bb = _Box(11, 30, 25, 70, "frozen<br>backbone<br>(one pass)", FROZEN)
    x = _Box(28, 42, 33, 58, "x", DATA)
    step = 70 / n_modules
    mods = [_Box(38, 92 - (i + 1) * step + 3, 62, 92 - i * step - 3, f"LuCA of task {i} + head<br>logits of task {i}",
                 TRAINED) for i in range(n_modules)]
    router = _Box(67, 33, 86, 67, "router<br>per-sample<br>entropy: the<br>surest module", ROUTE)
    pred = _Box(89, 42, 100, 58, "class", DATA)
    arrows = [(img.right, bb.left), (bb.right, x.left)] + [(x.right, m.left) for m in mods] + \
             [(m.right, router.left) for m in mods] + [(router.right, pred.left)]
    notes = [(50, 10, "every module reads the same x: the backbone runs once"), (77, 26, "its module's answer")]
    return _figure([img, bb, x, *mods, router, pred], arrows,
                   "TOSCA at inference: one backbone pass, every task's module, a router picks one", 360, notes)


def aware_pipeline(rho: float = 0.3):
    """AWARe: profile each output neuron (row) of q/k/v and the projector on a calibration set, freeze the
    top-ρ rows by saliency, fine-tune the other rows on the new task, merge them back into the Linears."""
    cal = _Box(0, 38, 13, 62, "calibration<br>set (upstream<br>or proxy)", DATA)
    prof = _Box(17, 30, 35, 70, "profile<br>saliency of every<br>output row of q/k/v<br>and the projector", FROZEN)
    sel = _Box(39, 30, 57, 70, f"select<br>the top-ρ rows<br>(ρ = {rho:g}): frozen", ROUTE)
    ft = _Box(61, 30, 79, 70, "masked fine-tuning<br>of the other rows<br>on the new task", TRAINED)
    merge = _Box(83, 30, 100, 70, "merge back:<br>a standard model,<br>the frozen rows<br>bit-identical", DATA)
    arrows = [(cal.right, prof.left), (prof.right, sel.left), (sel.right, ft.left), (ft.right, merge.left)]
    notes = [(26, 22, "forward passes only"), (48, 22, "a mask per Linear"), (70, 22, "the frozen rows never change")]
    return _figure([cal, prof, sel, ft, merge], arrows,
                   "AWARe: profile → select the top-ρ rows → fine-tune the rest, merged back", 300, notes)
