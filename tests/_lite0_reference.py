"""An independent EfficientNet-Lite0, written from the paper's architecture table and the key names
of the package's own state dict (``_conv_stem``, ``_blocks.N._depthwise_conv`` ...), used only to
prove that lab's timm mapping computes the same function as the package's weights intend.

Lite variants: ReLU6, no squeeze-excitation, TF "SAME" padding, BN eps 1e-3.
"""
import math

import torch
import torch.nn.functional as F

# (repeats, stride) per stage; kernel sizes and channels are read from the weights.
STAGES = [(1, 1), (2, 2), (2, 2), (3, 2), (3, 1), (4, 2), (1, 1)]


def _same_pad(x, k, s):
    ih, iw = x.shape[-2:]
    ph = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
    pw = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
    return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])


def _bn(x, sd, p):
    return F.batch_norm(x, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"], sd[p + ".bias"],
                        False, 0.0, 1e-3)


def _conv(x, w, stride=1, groups=1):
    return F.conv2d(_same_pad(x, w.shape[-1], stride), w, stride=stride, groups=groups)


def forward(sd, x):
    x = F.relu6(_bn(_conv(x, sd["_conv_stem.weight"], 2), sd, "_bn0"))
    i = 0
    for repeats, stride in STAGES:
        for r in range(repeats):
            p = f"_blocks.{i}."
            s = stride if r == 0 else 1
            inp = x
            if p + "_expand_conv.weight" in sd:
                x = F.relu6(_bn(_conv(x, sd[p + "_expand_conv.weight"]), sd, p + "_bn0"))
            w = sd[p + "_depthwise_conv.weight"]
            x = F.relu6(_bn(_conv(x, w, s, groups=w.shape[0]), sd, p + "_bn1"))
            x = _bn(_conv(x, sd[p + "_project_conv.weight"]), sd, p + "_bn2")
            if s == 1 and x.shape == inp.shape:
                x = x + inp
            i += 1
    x = F.relu6(_bn(_conv(x, sd["_conv_head.weight"]), sd, "_bn1"))
    feat = x.mean(dim=(2, 3))
    return feat, F.linear(feat, sd["_fc.weight"], sd["_fc.bias"])
