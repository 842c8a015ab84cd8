"""A LuCA, a cosine head and a batch for the step tests (test_step.py, test_fused.py)."""
import torch

from lab.tosca.head import CosineHead
from lab.tosca.luca import LuCA


def luca_head_batch(d, k, batch, param, seed, zero_rows=0):
    """Xavier LuCA with every parameter nudged (a non-trivial LayerNorm and biases), a head with
    ``k`` uniform rows plus ``zero_rows`` zero rows (a later task's, F.normalize's eps path), and a
    random batch ``x [batch, d]`` with labels over every row."""
    g = torch.Generator().manual_seed(seed)
    luca, head = LuCA(d), CosineHead(d, k, scale=1.3, param=param)
    luca.reset_parameters(generator=g, init="xavier")
    head.grow(zero_rows, init="zeros")
    with torch.no_grad():
        for p in luca.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    x, y = torch.randn(batch, d, generator=g), torch.randint(0, k + zero_rows, (batch,), generator=g)
    return luca, head, x, y


def train_tosca(data, epochs: int, **kw):
    """A TOSCA model trained on every task of a synthetic scenario (``ToscaConfig(epochs=epochs, **kw)``)."""
    from lab.tosca.learner import Tosca, ToscaConfig

    model = Tosca(data.dim, ToscaConfig(epochs=epochs, **kw))
    for t, classes in enumerate(data.task_classes):
        m = data.train_task == t
        model.learn_task(classes, data.train_x[m], data.train_y[m])
    return model
