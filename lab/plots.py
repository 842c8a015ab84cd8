"""Plotly figures used by the notebooks. Each function takes tidy data and returns a Figure;
nothing here computes results (that is lab's other modules' job)."""
from __future__ import annotations


def scatter_2d(z, labels, class_names: list[str], title: str = "", max_points: int | None = None, seed: int = 0):
    """2-D embedding coloured by class. ``z`` [N,2], ``labels`` [N] ints."""
    import numpy as np
    import pandas as pd
    import plotly.express as px

    z, labels = np.asarray(z), np.asarray(labels)
    if max_points and len(z) > max_points:
        keep = np.sort(np.random.RandomState(seed).choice(len(z), max_points, replace=False))
        z, labels = z[keep], labels[keep]
    df = pd.DataFrame({"x": z[:, 0], "y": z[:, 1], "class": [class_names[i] for i in labels]})
    fig = px.scatter(df, x="x", y="y", color="class", title=title, opacity=0.7,
                     category_orders={"class": list(class_names)})
    fig.update_traces(marker=dict(size=4))
    fig.update_layout(height=480, legend_title_text="class")
    return fig


def bar(df, x: str, y: str, title: str = "", color: str | None = None, range_y=(0, 1)):
    import plotly.express as px

    fig = px.bar(df, x=x, y=y, color=color, title=title, range_y=range_y, text_auto=".3f")
    fig.update_layout(height=380)
    return fig
