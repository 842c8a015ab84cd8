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


def heatmap(matrix, x=None, y=None, title: str = "", *, zmin=None, zmax=None, colorscale: str = "Viridis",
            fmt: str = ".2f", x_title: str = "", y_title: str = "", height: int = 460):
    """Annotated heatmap of a DataFrame (index = rows, columns = columns) or a 2-D array; NaN cells
    stay blank."""
    import numpy as np
    import plotly.express as px

    if hasattr(matrix, "columns"):
        x = list(map(str, matrix.columns)) if x is None else x
        y = list(map(str, matrix.index)) if y is None else y
        matrix = matrix.to_numpy(dtype=float)
    z = np.asarray(matrix, dtype=float)
    fig = px.imshow(z, x=x, y=y, zmin=zmin, zmax=zmax, color_continuous_scale=colorscale, aspect="auto",
                    text_auto=fmt, title=title, labels=dict(x=x_title, y=y_title, color=""))
    fig.update_xaxes(side="bottom", type="category")
    fig.update_yaxes(type="category")
    fig.update_layout(height=height)
    return fig


def lines(df, x: str, y: str, color: str | None = None, title: str = "", *, range_y=None, log_x: bool = False,
          y_title: str | None = None, x_title: str | None = None, hover_data=None, dash: str | None = None,
          categorical_x: bool = False, height: int = 400):
    """Line plot with markers from tidy data (one line per ``color`` value); ``categorical_x``
    spaces the x values evenly in order of appearance (e.g. L1 coefficients including 0)."""
    import plotly.express as px

    fig = px.line(df, x=x, y=y, color=color, line_dash=dash, markers=True, title=title, range_y=range_y,
                  log_x=log_x, hover_data=hover_data)
    fig.update_layout(height=height, yaxis_title=y_title or y, xaxis_title=x_title or x)
    if categorical_x:
        fig.update_xaxes(type="category")
    return fig


def grouped_bar(df, x: str, y: str, color: str, title: str = "", *, range_y=None, fmt: str = ".3g",
                y_title: str | None = None, height: int = 400):
    """Side-by-side bars, one group per ``x`` value and one bar per ``color`` value."""
    import plotly.express as px

    fig = px.bar(df, x=x, y=y, color=color, barmode="group", title=title, range_y=range_y, text_auto=fmt)
    fig.update_layout(height=height, yaxis_title=y_title or y)
    return fig


def distributions(df, x: str, color: str, title: str = "", *, facet_col: str | None = None, nbins: int = 40,
                  facet_col_wrap: int = 0, height: int = 380):
    """Overlaid, normalised histograms of ``x`` per ``color`` value (optionally one panel per facet)."""
    import plotly.express as px

    fig = px.histogram(df, x=x, color=color, facet_col=facet_col, facet_col_wrap=facet_col_wrap, nbins=nbins,
                       histnorm="probability density", barmode="overlay", opacity=0.6, title=title)
    fig.update_layout(height=height)
    return fig


def image_grid(images, titles: list[str], title: str = "", *, cols: int = 6, height: int | None = None):
    """uint8 images ``[N, H, W, 3]`` (or grey ``[N, H, W]``) in a grid, one caption each. Photographs
    (sides above 64 px) are embedded as JPEG, which keeps a report light (12 photos of 224 px: 0.17 MB
    against 1.2 MB as PNG); small images stay PNG, pixel for pixel."""
    import numpy as np
    import plotly.express as px

    images = np.asarray(images)
    if images.ndim == 3:
        images = np.repeat(images[..., None], 3, -1)
    cols = min(cols, len(images))
    fmt = "jpg" if max(images.shape[1:3]) > 64 else "png"
    fig = px.imshow(images, facet_col=0, facet_col_wrap=cols, binary_string=True, binary_format=fmt, title=title,
                    facet_col_spacing=0.01, facet_row_spacing=0.08)
    for ann in fig.layout.annotations:  # facet labels "facet_col=i" -> the captions
        ann.text = titles[int(ann.text.split("=")[1])]
        ann.font.size = 10
    fig.update_xaxes(showticklabels=False).update_yaxes(showticklabels=False)
    rows = -(-len(images) // cols)
    fig.update_layout(height=height or 60 + 170 * rows, margin=dict(l=10, r=10, t=60, b=10))
    return fig
