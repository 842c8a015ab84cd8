"""Every size preset fits the data it draws from, checked from the registry's split sizes and
easy-VQA's question lists (no model, no visual tokens): a preset that asks for more training,
validation or test questions than a split holds would fail only after minutes of set-up."""
from __future__ import annotations

import easy_vqa
import pytest

from lab.data import dataset_info
from lab.experiments.aware.run.context import SIZES
from lab.experiments.aware.run.tasks import TEMPLATES

N_VAL = 100  # lab aware tune's default --n-val


@pytest.mark.parametrize("preset", sorted(SIZES))
@pytest.mark.parametrize("task", sorted(TEMPLATES))
def test_downstream_pools_fit_the_splits(preset, task):
    size, info = SIZES[preset], dataset_info(TEMPLATES[task][0])
    assert size.n_train + N_VAL <= info["train"], (
        f"{preset}: {size.n_train} training + {N_VAL} validation questions > {info['name']}'s {info['train']} train images")
    assert max(size.n_eval, size.n_continual_eval) <= info["test"]


@pytest.mark.parametrize("preset", sorted(SIZES))
def test_easy_vqa_pools_fit(preset):
    size = SIZES[preset]
    n_train_q, n_test_q = len(easy_vqa.get_train_questions()[0]), len(easy_vqa.get_test_questions()[0])
    assert size.n_align + max(size.n_calib, *size.calib_sizes) <= n_train_q
    assert size.n_easy_eval <= n_test_q


@pytest.mark.parametrize("preset", sorted(SIZES))
def test_easy_vqa_validation_has_unseen_images_left(preset):
    """Validation questions are about train images no alignment question shows; a preset that
    aligns on (nearly) every image would leave tune a handful of questions, silently."""
    from lab.experiments.aware.run.tasks import unseen_image_index

    image_ids = easy_vqa.get_train_questions()[2]
    assert len(unseen_image_index(image_ids, SIZES[preset].n_align, N_VAL, seed=0)) == N_VAL
