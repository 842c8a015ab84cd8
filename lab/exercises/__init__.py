"""Exercises with checked answers: each notebook ends with a few, and a student checks an answer in
the notebook itself::

    from lab import exercises
    answer = 0.71                      # the student's answer
    exercises.check("00.3", answer, train=train, test=test)

``check`` says *right* or *not yet* with a hint, and never shows the answer: the right answer is
computed from the notebook's own objects (passed by name: the ones the exercise's answer function
takes), with the exercise's tolerance, so a different run (another seed, the smoke parameters)
checks against its own numbers. Each exercise is a small record — an id (``"NN.k"``: notebook and
number), its prompt, a hint, the function computing the answer, a tolerance — registered with
:func:`register` by the module of its notebook (``_nb00.py`` ...). Three kinds: ``compute`` (a
value to compute), ``predict`` (a guess written down before running the cell that measures it),
``read`` (a value or a name read off a table or figure).

Solutions show only where ``lab report --solutions`` runs the notebook (``$LAB_REPORT_SOLUTIONS``):
``check`` then also displays the solution, as an output marked for the solution pages (the
pipeline leaves it out of the reports beside the index), and first checks that the solution passes
its own checker and that a wrong answer does not (a broken exercise fails that run).
"""
from __future__ import annotations

import html
import inspect
import math
import os
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable

KINDS = ("compute", "predict", "read")
MODULES = ("_nb00", "_nb01", "_nb02", "_nb03", "_nb04", "_nb05")
_EXERCISES: dict[str, "Exercise"] = {}
_loaded = False


@dataclass(frozen=True)
class Exercise:
    """One exercise. ``answer(**data)`` computes the right answer from the notebook's objects (its
    parameter names are the names :func:`check` needs); a number is right within ``tol + rtol·|x|``,
    a word when it equals the answer (case and spaces ignored). ``options(**data)`` (or a tuple):
    the words a word answer may take (a student's answer outside them is told so)."""

    id: str
    notebook: str
    kind: str
    prompt: str
    hint: str
    answer: Callable[..., Any]
    tol: float = 0.0
    rtol: float = 0.0
    options: Any = ()
    unit: str = ""
    why: str = ""
    needs: tuple[str, ...] = field(default=())

    def solve(self, **data) -> Any:
        """The right answer, from the notebook's objects (every name in :attr:`needs`)."""
        missing = [n for n in self.needs if n not in data]
        if missing:
            raise TypeError(f"exercise {self.id} needs {', '.join(missing)} (the notebook's objects of "
                            f"those names): exercises.check({self.id!r}, answer, "
                            + ", ".join(f"{n}={n}" for n in self.needs) + ")")
        return self.answer(**{n: data[n] for n in self.needs})

    def valid(self, **data) -> tuple[str, ...]:
        opts = self.options(**{n: data[n] for n in inspect.signature(self.options).parameters}) \
            if callable(self.options) else self.options
        return tuple(str(o) for o in opts)


def register(id: str, *, notebook: str, kind: str, prompt: str, hint: str, tol: float = 0.0, rtol: float = 0.0,
             options: Any = (), unit: str = "", why: str = "") -> Callable:
    """Record the decorated function as the answer of exercise ``id`` (``"NN.k"``)."""
    if kind not in KINDS:
        raise ValueError(f"exercise {id}: kind {kind!r}; valid: {', '.join(KINDS)}")
    if not id.startswith(notebook[:2] + "."):
        raise ValueError(f"exercise {id}: its number must start with its notebook's, {notebook[:2]}.")

    def deco(fn: Callable) -> Callable:
        if id in _EXERCISES and _EXERCISES[id].answer.__qualname__ != fn.__qualname__:
            raise ValueError(f"exercise {id} is registered twice")
        _EXERCISES[id] = Exercise(id, notebook, kind, prompt.strip(), hint.strip(), fn, tol, rtol, options, unit,
                                  why.strip(), tuple(inspect.signature(fn).parameters))
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for m in MODULES:
            import_module(f"lab.exercises.{m}")


def get(id: str) -> Exercise:
    """The exercise ``id``; an unknown id lists the valid ones."""
    _load()
    if id not in _EXERCISES:
        raise KeyError(f"no exercise {id!r}; valid: {', '.join(list_exercises())}")
    return _EXERCISES[id]


def list_exercises(notebook: str | None = None) -> list[str]:
    """Every exercise id (of one notebook: ``"00"`` or ``"00_quickstart"``), in order."""
    _load()
    key = lambda i: tuple(int(p) for p in i.split("."))  # noqa: E731
    return sorted((i for i, e in _EXERCISES.items() if notebook is None or e.notebook.startswith(notebook)), key=key)


# --- judging an answer -------------------------------------------------------------------------------
def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if hasattr(x, "item") and getattr(x, "size", 1) == 1:
        x = x.item()
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.strip().rstrip("%").replace(",", ""))
        except ValueError:
            return None
    return None


def _word(x: Any) -> str:
    return " ".join(str(x).strip().strip("\"'").lower().replace("_", " ").replace("-", " ").split())


def is_right(id: str, answer: Any, **data) -> bool:
    """Whether ``answer`` is right for exercise ``id`` on the notebook's objects ``data`` (pure: shows
    nothing)."""
    ex = get(id)
    return _judge(ex, answer, ex.solve(**data))


def _judge(ex: Exercise, answer: Any, right: Any) -> bool:
    if answer is None:
        return False
    r = _number(right) if not isinstance(right, str) else None
    if r is not None:
        a = _number(answer)
        return a is not None and math.isfinite(a) and abs(a - r) <= ex.tol + ex.rtol * abs(r) + 1e-12
    return _word(answer) == _word(right)


def wrong_answer(id: str, **data) -> Any:
    """An answer that must fail (for tests and the solution runs' self-check): a number beyond the
    tolerance, or another of the options."""
    ex = get(id)
    right = ex.solve(**data)
    if isinstance(right, str):
        others = [o for o in ex.valid(**data) if _word(o) != _word(right)]
        return others[0] if others else right + " (not it)"
    r = float(_number(right))
    return r + 3 * (ex.tol + ex.rtol * abs(r)) + 1.0


def solution(id: str, **data) -> Any:
    """The right answer of ``id`` on ``data`` (what the solution pages show)."""
    return get(id).solve(**data)


def _shown(value: Any, ex: Exercise) -> str:
    if isinstance(value, str):
        return value
    v = float(_number(value))
    if ex.rtol:
        text = f"{v:.3g}"
    elif ex.tol == 0 and v == int(v):
        text = f"{int(v):,}"
    else:   # the decimals the tolerance asks for
        text = f"{v:.{max(0, math.ceil(-math.log10(ex.tol))) if ex.tol else 3}f}"
    return f"{text} {ex.unit}".strip()


def _display(bundle: dict, metadata: dict | None = None) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(bundle, raw=True, metadata=metadata or {})
    else:
        print(bundle["text/plain"])


def _box(colour: str, text: str) -> str:
    return (f"<div class='lab-exercise' style='border-left:4px solid {colour};padding:.2rem .8rem;"
            f"margin:.2rem 0'>{text}</div>")


def check(id: str, answer: Any, **data) -> None:
    """Say whether ``answer`` is right for exercise ``id`` (a hint when it is not; never the answer).
    ``data``: the notebook's objects the exercise reads, by name (a missing one is named)."""
    ex = get(id)
    right = ex.solve(**data)
    if answer is None:
        text = (f"Exercise {ex.id}: no answer yet — put yours in place of <code>None</code> above and run "
                f"this cell again.")
        _display({"text/html": _box("#8c959f", text), "text/plain": html.unescape(text.replace("<code>", "")
                  .replace("</code>", ""))})
    elif _judge(ex, answer, right):
        _display({"text/html": _box("#1a7f37", f"<b>Right.</b> Exercise {ex.id}."),
                  "text/plain": f"Right. Exercise {ex.id}."})
    else:
        opts = ex.valid(**data) if isinstance(right, str) else ()
        outside = bool(opts) and _word(answer) not in {_word(o) for o in opts}
        note = f" Answer one of: {', '.join(opts)}." if outside else ""
        if isinstance(right, str) or _number(answer) is not None:
            text = f"<b>Not yet.</b> Exercise {ex.id}: {html.escape(ex.hint)}{html.escape(note)}"
        else:
            text = f"<b>Not yet.</b> Exercise {ex.id}: the answer is a number. {html.escape(ex.hint)}"
        _display({"text/html": _box("#cf222e", text), "text/plain": html.unescape(
            text.replace("<b>", "").replace("</b>", ""))})
    from lab.report.notebook import SOLUTIONS_ENV

    if os.environ.get(SOLUTIONS_ENV) == "1":
        _show_solution(ex, right, data)


def _show_solution(ex: Exercise, right: Any, data: dict) -> None:
    """The solution, marked for the solution pages; first a self-check of the exercise itself."""
    if not _judge(ex, right, right) or _judge(ex, wrong_answer(ex.id, **data), right):
        raise AssertionError(f"exercise {ex.id}: its checker does not accept its own solution or accepts a "
                             f"wrong answer")
    why = f" {html.escape(ex.why)}" if ex.why else ""
    text = f"<b>Solution {ex.id}:</b> {html.escape(_shown(right, ex))}.{why}"
    _display({"text/html": _box("#0969da", text), "text/plain": html.unescape(
        text.replace("<b>", "").replace("</b>", ""))},
        metadata={"continual-lab": {"solution": ex.id}})


def prompt_markdown(id: str) -> str:
    """The exercise as the notebook states it: ``**Exercise NN.k** (kind). prompt``."""
    ex = get(id)
    return f"**Exercise {ex.id}** ({ex.kind}). {ex.prompt}"


__all__ = ["Exercise", "KINDS", "check", "get", "is_right", "list_exercises", "prompt_markdown", "register",
           "solution", "wrong_answer"]
