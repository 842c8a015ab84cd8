"""lab/data/scenarios.py: class-incremental scenarios (B{init} Inc{inc}, chained domains)."""
import numpy as np
import pytest

from lab import data


def test_b0_inc2_scenario_is_seeded_and_partitions_classes():
    s1 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1993)
    s2 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1993)
    s3 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1)
    assert s1.class_order == s2.class_order != s3.class_order
    assert s1.num_tasks == 5 and [t.classes for t in s1.tasks][1] == (2, 3)
    # incremental labels are positions in the class order
    raw = s1.parts[0].train.labels
    assert np.array_equal(np.asarray(s1.class_order)[s1.train_labels], raw)
    # each task's samples are exactly its classes
    for t in s1.tasks:
        assert set(np.unique(s1.train_labels[s1.task_indices(t.index)])) == set(t.classes)
    assert s1.class_names[0] == data.load_dataset("fashion_mnist_mini").class_names[s1.class_order[0]]


def test_init_task_and_chained_domains():
    s = data.scenario("fashion_mnist_mini", init=4, inc=3)
    assert [len(t.classes) for t in s.tasks] == [4, 3, 3]
    c = data.scenario(["mnist_5k", "fashion_mnist_mini"], init=0, inc=2)
    assert c.num_classes == 20 and c.num_tasks == 10
    assert all(g < 10 for g in c.class_order[:10]) and all(g >= 10 for g in c.class_order[10:])
    assert c.class_names[0].startswith("mnist_5k:") and c.class_names[-1].startswith("fashion_mnist_mini:")
    assert len(c.images("train")) == len(c.train_labels) == 10000


@pytest.mark.parametrize("init,inc,msg", [(0, 3, "not a multiple"), (11, 1, "exceeds"), (-1, 2, "init >= 0"), (0, 0, "inc >= 1")])
def test_invalid_splits_rejected_before_loading(monkeypatch, init, inc, msg):
    monkeypatch.setattr(data.scenarios, "load_dataset", lambda *a, **k: pytest.fail("loaded data"))
    with pytest.raises(ValueError, match=msg):
        data.scenario("fashion_mnist_mini", init=init, inc=inc)
