"""Upstream skills, downstream tasks and calibration sets for the mini-LLaVA (data cards:
``data_cards/easy_vqa.md``, ``general_knowledge_probe.md``, ``aware_tasks.md``).

Upstream (learned before any fine-tuning, measured before and after):
- ``easy_vqa``: colour/shape questions on synthetic images (PyPI ``easy-vqa``); the projector is
  aligned on its train split with the language model frozen (LLaVA stage-1 "pre-training").
- ``probe``: a text-only general-knowledge probe of SmolLM2 (320 questions written for this
  project, ``lab/experiments/aware/run/data/general_knowledge_probe.json``), scored by answer log-likelihood over
  4 options and by exact match of a greedy answer.

Downstream (templated questions on real images): ``fashion`` (Fashion-MNIST mini), ``digits``
(MNIST-5k) and ``even`` (MNIST-5k, needs reasoning over the recognised digit).

Calibration: ``upstream`` (easy-VQA train questions *with* their answers, disjoint from the
test questions used for evaluation) or ``proxy`` (crops of scikit-image's sample photos with generic questions —
not drawn from any upstream task, the MMMU role in the paper).
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from torch import Tensor

PROBE_FILE = Path(__file__).with_name("data") / "general_knowledge_probe.json"
FASHION_ANSWERS = ("t-shirt", "trousers", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
                   "bag", "ankle boot")
_FIELDS = {"name", "label", "even"}


@dataclass(frozen=True)
class QuestionTemplate:
    """A downstream question and how its answer is made from the label.

    ``answer`` is a format string over ``{name}`` (the class's answer word), ``{label}`` (the class
    index) or ``{even}`` (``yes``/``no`` for an even/odd label). A template without an answer
    field cannot teach or score anything and is rejected on construction.
    """

    question: str
    answer: str

    def __post_init__(self):
        if not self.question or not self.question.strip():
            raise ValueError("question template is empty")
        fields = {f for _, f, _, _ in string.Formatter().parse(self.answer or "") if f is not None}
        if not fields:
            raise ValueError(f"template {self.question!r} has no answer: give answer='{{name}}', "
                             f"'{{label}}' or '{{even}}'")
        if fields - _FIELDS:
            raise ValueError(f"unknown answer fields {sorted(fields - _FIELDS)}; use {sorted(_FIELDS)}")

    def render(self, label: int, names: Sequence[str]) -> str:
        return self.answer.format(name=names[label], label=label, even="yes" if label % 2 == 0 else "no")


TEMPLATES = {
    "fashion": ("fashion_mnist_mini", QuestionTemplate("Which item of clothing is this?", "{name}"), FASHION_ANSWERS),
    "digits": ("mnist_5k", QuestionTemplate("Which digit is this?", "{label}"), tuple("0123456789")),
    "even": ("mnist_5k", QuestionTemplate("Is this digit even?", "{even}"), tuple("0123456789")),
}
DOWNSTREAM = tuple(TEMPLATES)


@dataclass
class QASet:
    """Questions with answers, per-sample options and (optionally) visual tokens."""

    name: str
    questions: list[str]
    answers: list[str]
    options: list[tuple[str, ...]]                 # candidates scored for each sample
    image_index: np.ndarray                        # row of ``tokens`` per sample, -1 = text only
    tokens: Tensor | None = None                   # (N_images, n_tokens, C)
    aliases: list[tuple[str, ...]] = field(default_factory=list)
    source: str = ""                               # identity of ``tokens`` (visual-token cache key)

    def __len__(self) -> int:
        return len(self.questions)

    def subset(self, idx: Sequence[int]) -> "QASet":
        idx = list(map(int, idx))
        pick = lambda xs: [xs[i] for i in idx] if xs else xs  # noqa: E731
        return replace(self, questions=pick(self.questions), answers=pick(self.answers),
                       options=pick(self.options), image_index=self.image_index[idx],
                       aliases=pick(self.aliases))

    def majority_rate(self) -> float:
        _, counts = np.unique(np.asarray(self.answers), return_counts=True)
        return float(counts.max() / len(self))

    def chance_rate(self) -> float:
        return float(np.mean([1.0 / len(o) for o in self.options]))


@dataclass
class Task:
    name: str
    train: QASet | None
    test: QASet


def shuffled_options(qa: QASet, seed: int = 0) -> QASet:
    """``qa`` with every question's options in their own seeded order (the gold option's position
    drawn per question): no position is right more often than chance, so a model that always picks
    one position, or an argmax over tied scores, scores at chance."""
    import zlib

    rng = np.random.RandomState((zlib.crc32(qa.name.encode()) + 7919 * seed) % 2**32)
    qa.options = [tuple(o[k] for k in rng.permutation(len(o))) for o in qa.options]
    return qa


def _pick(n_total: int, n: int, seed: int) -> np.ndarray:
    n = min(n, n_total)
    return np.sort(np.random.RandomState(seed).choice(n_total, n, replace=False))


# --- downstream --------------------------------------------------------------------------------
def downstream(name: str, *, n_train: int, n_test: int, seed: int = 0, grid: int = 2,
               cache_dir=None, progress: bool = True, vision=None) -> Task:
    """A downstream task from real images; test questions are a fixed (seed-independent) subset.
    ``vision``: what turns images into the model's visual input (default: the mini-LLaVA's
    :func:`~lab.experiments.aware.run.minillava.visual_tokens`; a hub LLaVA keeps the raw images,
    :func:`lab.experiments.aware.run.hub_llava.raw_images`); every task builder takes it."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown downstream task {name!r}; choose from {list(TEMPLATES)}")
    from lab.experiments.aware.run.minillava import visual_tokens
    from lab.data import load_dataset

    dataset, tmpl, names = TEMPLATES[name]
    ds = load_dataset(dataset)
    options = tuple(dict.fromkeys(tmpl.render(c, names) for c in range(len(names))))
    out = {}
    for split, n, s in (("train", n_train, seed + 1), ("test", n_test, 12345)):
        sp = getattr(ds, split)
        idx = _pick(len(sp.labels), n, s)
        tokens, key = (vision or visual_tokens)(sp.images[idx], grid=grid, cache_dir=cache_dir, progress=progress,
                                                return_key=True)  # only the images used
        out[split] = shuffled_options(QASet(f"{name}/{split}", [tmpl.question] * len(idx),
                                            [tmpl.render(int(sp.labels[i]), names) for i in idx], [options] * len(idx),
                                            np.arange(len(idx), dtype=np.int64), tokens, source=key), seed)
    return Task(name, out["train"], out["test"])


def validation_index(n_total: int, n_train: int, n: int, seed: int = 0) -> np.ndarray:
    """Rows of a train split for validation: ``n`` of those :func:`downstream`'s training pool
    (``n_train`` rows, same ``seed``) leaves out."""
    rest = np.setdiff1d(np.arange(n_total), _pick(n_total, n_train, seed + 1))
    if len(rest) == 0:
        raise ValueError(f"the training pool ({n_train}) uses the whole train split; nothing left to validate on")
    return rest[_pick(len(rest), n, seed + 2)]


def downstream_validation(name: str, *, n: int, n_train: int, seed: int = 0, grid: int = 2,
                          cache_dir=None, progress: bool = True, vision=None) -> QASet:
    """``n`` validation questions of a downstream task: from its *train* split, disjoint from the
    training pool :func:`downstream` draws with the same ``n_train`` and ``seed`` (and from every
    test question). Hyper-parameters are chosen on these, never on the test questions."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown downstream task {name!r}; choose from {list(TEMPLATES)}")
    if n < 1:
        raise ValueError(f"the validation set is empty (n={n})")
    from lab.experiments.aware.run.minillava import visual_tokens
    from lab.data import load_dataset

    dataset, tmpl, names = TEMPLATES[name]
    sp = load_dataset(dataset).train
    idx = validation_index(len(sp.labels), n_train, n, seed)
    tokens, key = (vision or visual_tokens)(sp.images[idx], grid=grid, cache_dir=cache_dir, progress=progress,
                                            return_key=True)
    options = tuple(dict.fromkeys(tmpl.render(c, names) for c in range(len(names))))
    return shuffled_options(QASet(f"{name}/validation", [tmpl.question] * len(idx),
                                  [tmpl.render(int(sp.labels[i]), names) for i in idx], [options] * len(idx),
                                  np.arange(len(idx), dtype=np.int64), tokens, source=key), seed)


# --- upstream ----------------------------------------------------------------------------------
def _easy_vqa_split(split: str, n: int, seed: int, grid: int, cache_dir, progress: bool, *,
                    rows=None, name: str | None = None, vision=None, lazy: bool = False) -> QASet:
    """``n`` seeded questions of one split (or ``rows(image_ids)``'s); visual tokens only for the
    images they ask about (``lazy``: computed when a row is first read, unless cached)."""
    import easy_vqa
    from PIL import Image

    from lab.experiments.aware.run.minillava import visual_tokens

    qs, ans, img_ids = (easy_vqa.get_train_questions() if split == "train" else easy_vqa.get_test_questions())
    paths = easy_vqa.get_train_image_paths() if split == "train" else easy_vqa.get_test_image_paths()
    pick = _pick(len(qs), n, seed) if rows is None else rows(img_ids)
    used = sorted({img_ids[i] for i in pick})
    row = {img: r for r, img in enumerate(used)}
    images = np.stack([np.asarray(Image.open(paths[i]).convert("RGB")) for i in used])   # (N, 64, 64, 3)
    options = tuple(easy_vqa.get_answers())
    lazy_kw = {"lazy": True} if lazy and vision is None else {}
    tokens, key = (vision or visual_tokens)(images, grid=grid, cache_dir=cache_dir, progress=progress, return_key=True,
                                            **lazy_kw)
    return shuffled_options(QASet(name or f"easy_vqa/{split}", [qs[i] for i in pick], [ans[i] for i in pick],
                                  [options] * len(pick), np.array([row[img_ids[i]] for i in pick], dtype=np.int64),
                                  tokens, source=key), seed)


def easy_vqa(*, n_train: int, n_test: int, seed: int = 0, grid: int = 2, cache_dir=None,
             progress: bool = True, vision=None, lazy_train: bool = False) -> Task:
    """easy-VQA questions; ``n_train`` from the train split, ``n_test`` fixed from the test split.
    ``lazy_train``: the train split's visual tokens computed only for the rows read (unless cached)."""
    return Task("easy_vqa", _easy_vqa_split("train", n_train, seed, grid, cache_dir, progress, vision=vision,
                                            lazy=lazy_train),
                _easy_vqa_split("test", n_test, 7, grid, cache_dir, progress, vision=vision))


def unseen_image_index(image_ids: Sequence[int], n_align: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` question rows whose image none of the ``n_align`` alignment questions (picked as
    :func:`easy_vqa` picks them, same ``seed``) shows."""
    seen = {image_ids[i] for i in _pick(len(image_ids), n_align, seed)}
    free = np.array([i for i in range(len(image_ids)) if image_ids[i] not in seen], dtype=np.int64)
    if len(free) == 0:
        raise ValueError(f"the {n_align} alignment questions show every train image; nothing left to validate on")
    return free[_pick(len(free), n, seed + 3)]


def easy_vqa_validation(*, n: int, n_align: int, seed: int = 0, grid: int = 2, cache_dir=None,
                        progress: bool = True, vision=None) -> QASet:
    """``n`` easy-VQA validation questions: from the train split, about images that none of the
    ``n_align`` alignment questions (:func:`easy_vqa` with the same ``seed``) shows — so neither
    the question nor the image was seen upstream; the test questions stay untouched."""
    if n < 1:
        raise ValueError(f"the validation set is empty (n={n})")
    return _easy_vqa_split("train", n, seed, grid, cache_dir, progress, name="easy_vqa/validation",
                           rows=lambda image_ids: unseen_image_index(image_ids, n_align, n, seed), vision=vision)


def probe(path: str | Path = PROBE_FILE) -> Task:
    """The text-only general-knowledge probe (held out: never used for training or calibration). A
    damaged file is one line naming it."""
    from lab._io import CorruptFile, read_json

    data = read_json(path)
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(it, dict) and {"question", "answer", "distractors"} <= set(it)
                                              for it in items):
        raise CorruptFile(f"{path}: not a probe file (a JSON object whose 'items' each have a question, an answer "
                          "and distractors); reinstall the package to restore it")
    if not items:
        raise ValueError(f"{path} holds no questions")
    qa = QASet("probe", [it["question"] for it in items], [it["answer"] for it in items],
               [tuple([it["answer"], *it["distractors"]]) for it in items],
               np.full(len(items), -1, dtype=np.int64), None,
               [tuple([it["answer"], *it.get("aliases", [])]) for it in items])
    return Task("probe", None, shuffled_options(qa))   # the file lists the answer first


def exact_match(generated: str, aliases: Sequence[str]) -> bool:
    """Does the greedy answer contain the gold answer (or an alias) as whole words (case-insensitive)?"""
    norm = lambda s: " ".join(re.findall(r"[a-z0-9]+", s.lower()))  # noqa: E731
    text = f" {norm(generated)} "
    return any(f" {norm(a)} " in text for a in aliases if norm(a))


# --- calibration -------------------------------------------------------------------------------
_PROXY_PHOTOS = {  # scikit-image sample photos bundled with the wheel, with a one-word answer
    "astronaut": "astronaut", "camera": "photographer", "cat": "cat", "coffee": "coffee",
    "rocket": "rocket", "hubble_deep_field": "galaxies", "immunohistochemistry": "cells",
    "moon": "moon", "page": "text", "clock": "clock", "coins": "coins", "colorwheel": "colors",
    "grass": "grass", "gravel": "gravel", "brick": "bricks", "retina": "eye", "logo": "logo",
    "checkerboard": "checkerboard", "horse": "horse", "microaneurysms": "vessels",
}
_PROXY_QUESTIONS = ("What is shown in this picture?", "What is the main subject of the image?",
                    "Describe the image in one word.", "What do you see?")


def _proxy_images(n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    import skimage.data as skd
    from PIL import Image

    rng = np.random.RandomState(seed)
    names = list(_PROXY_PHOTOS)
    photos = {}
    for nm in names:
        x = np.asarray(getattr(skd, nm)())
        if x.dtype == bool:
            x = x.astype(np.uint8) * 255
        if x.ndim == 2:
            x = np.repeat(x[..., None], 3, -1)
        photos[nm] = x[..., :3].astype(np.uint8)
    out, answers = [], []
    for i in range(n):
        nm = names[i % len(names)]
        x = photos[nm]
        side = int(min(x.shape[:2]) * rng.uniform(0.6, 1.0))        # random square crop
        r0, c0 = rng.randint(0, x.shape[0] - side + 1), rng.randint(0, x.shape[1] - side + 1)
        crop = Image.fromarray(x[r0:r0 + side, c0:c0 + side]).resize((64, 64), Image.BILINEAR)
        out.append(np.asarray(crop))
        answers.append(_PROXY_PHOTOS[nm])
    return np.stack(out), answers


def calibration(kind: str, n: int, *, upstream: Task | None = None, seed: int = 0, grid: int = 2,
                cache_dir=None, progress: bool = True, vision=None) -> QASet:
    """``n`` calibration samples whose prompts include the ground-truth answer (as the reference)."""
    if n < 1:
        raise ValueError(f"the calibration set is empty (n={n}): profiling needs at least one sample")
    if kind == "upstream":
        if upstream is None or upstream.train is None:
            raise ValueError("upstream calibration needs the easy-VQA task (its train split)")
        # a seeded sample of the questions the upstream skill was learned from (as the reference)
        idx = np.random.RandomState(seed + 99).permutation(len(upstream.train))[-n:]
        return upstream.train.subset(np.sort(idx))
    if kind == "proxy":
        from lab.experiments.aware.run.minillava import visual_tokens

        images, answers = _proxy_images(n, seed)
        tokens = (vision or visual_tokens)(images, grid=grid, cache_dir=cache_dir, progress=progress)
        rng = np.random.RandomState(seed)
        qs = [_PROXY_QUESTIONS[rng.randint(len(_PROXY_QUESTIONS))] for _ in range(n)]
        return QASet("proxy", qs, answers, [tuple(sorted(set(answers)))] * n, np.arange(n), tokens)
    raise ValueError(f"unknown calibration set {kind!r}; choose 'upstream' or 'proxy'")
