"""The ResNets of bench_resnet.py: netrun's model YAML for ResNet-50, both nets in PyTorch.

ResNet-20 is zoo/resnet20.yaml (3 stages of 3 basic blocks, projection shortcuts where the
shape changes). ResNet-50 is He et al.'s ImageNet net as first published: bottleneck blocks
whose stride sits on the first 1×1 conv (torchvision's v1.5 moves it to the 3×3; the
parameter count is the same, the flops are not), BN after every conv, 224×224 input, 1000
classes. `resnet50_yaml()` writes zoo/resnet50.yaml (tests check the shipped file against it).

The PyTorch models are written separately, in PyTorch's idiom (modules, eager), rather than
translated from the YAML, so that the benchmark's fairness check (same parameter count and
output shape) compares two independent descriptions of one architecture.
"""
from __future__ import annotations

# Bottleneck stages of ResNet-50: (blocks, width of the 3×3 conv, stride of the first block).
RESNET50_STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
EXPANSION = 4      # a bottleneck's output has 4× the channels of its 3×3 conv


def _conv(name: str, source: str | None, out: int, kernel: int, stride: int = 1,
          pad: int = 0) -> str:
    src = f"input: {source}, " if source else ""
    stride_s = f", stride: {stride}" if stride != 1 else ""
    pad_s = f", pad: {pad}" if pad else ""
    return (f"  - {{type: conv, name: {name}, {src}num_output: {out}, kernel: {kernel}"
            f"{stride_s}{pad_s}, bias: false, weight_filler: msra}}")


def resnet50_yaml() -> str:
    """The text of zoo/resnet50.yaml (netrun's layer form)."""
    lines = [
        "# ResNet-50 for 224×224 ImageNet inputs (He et al. 2016, the original v1): bottleneck",
        "# blocks with the stride on the first 1×1 conv, BN after every conv, projection",
        "# shortcuts (1×1 conv + BN) at the first block of each stage. Written by",
        "# benchmarks/resnets.py (resnet50_yaml); tests/test_bench_resnet.py keeps them equal.",
        "name: ResNet50",
        "inputs: {data: [3, 224, 224], label: []}",
        "layers:",
        _conv("conv1", "data", 64, 7, 2, 3),
        "  - {type: spatial_bn, name: bn1}",
        "  - {type: relu, name: relu1}",
        "  - {type: max_pool, name: pool1, kernel: 3, stride: 2, pad: 1}",
    ]
    x, channels = "pool1", 64
    for s, (blocks, width, stride) in enumerate(RESNET50_STAGES, 1):
        for b in range(1, blocks + 1):
            p, first_stride = f"s{s}b{b}", (stride if b == 1 else 1)
            out = width * EXPANSION
            lines += [
                _conv(f"{p}_conv1", x, width, 1, first_stride),
                f"  - {{type: spatial_bn, name: {p}_bn1}}",
                f"  - {{type: relu, name: {p}_relu1}}",
                _conv(f"{p}_conv2", None, width, 3, 1, 1),
                f"  - {{type: spatial_bn, name: {p}_bn2}}",
                f"  - {{type: relu, name: {p}_relu2}}",
                _conv(f"{p}_conv3", None, out, 1),
                f"  - {{type: spatial_bn, name: {p}_bn3}}",
            ]
            shortcut = x
            if b == 1:   # the shape changes (channels always, the image from stage 2 on)
                lines += [_conv(f"{p}_proj", x, out, 1, first_stride),
                          f"  - {{type: spatial_bn, name: {p}_proj_bn}}"]
                shortcut = f"{p}_proj_bn"
            lines += [f"  - {{type: add, name: {p}_sum, input: [{p}_bn3, {shortcut}]}}",
                      f"  - {{type: relu, name: {p}_relu}}"]
            x, channels = f"{p}_relu", out
    lines += [
        "  - {type: average_pool, name: pool, global_pooling: true}",
        "  - {type: fc, name: fc, num_output: 1000, weight_filler: msra}",
        "loss: {type: softmax_cross_entropy, input: fc, label: label}",
        "metrics: [{type: accuracy, input: fc, label: label}]",
    ]
    return "\n".join(lines) + "\n"


# PyTorch ---------------------------------------------------------------------------------
def torch_resnet(torch, name: str):
    """(model, per-example input shape, classes) of 'resnet20' or 'resnet50' in PyTorch."""
    nn = torch.nn

    def conv_bn(cin, cout, kernel, stride=1, pad=0):
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, pad, bias=False),
                             nn.BatchNorm2d(cout))

    class Block(nn.Module):
        """body(x) + shortcut(x), then ReLU: the residual unit of both nets."""

        def __init__(self, body, shortcut):
            super().__init__()
            self.body, self.shortcut = body, shortcut

        def forward(self, x):
            s = x if self.shortcut is None else self.shortcut(x)
            return torch.relu(self.body(x) + s)

    def basic(cin, cout, stride):
        body = nn.Sequential(conv_bn(cin, cout, 3, stride, 1), nn.ReLU(),
                             conv_bn(cout, cout, 3, 1, 1))
        projected = stride != 1 or cin != cout
        return Block(body, conv_bn(cin, cout, 1, stride) if projected else None)

    def bottleneck(cin, width, stride):
        out = width * EXPANSION
        body = nn.Sequential(conv_bn(cin, width, 1, stride), nn.ReLU(),
                             conv_bn(width, width, 3, 1, 1), nn.ReLU(),
                             conv_bn(width, out, 1))
        projected = stride != 1 or cin != out
        return Block(body, conv_bn(cin, out, 1, stride) if projected else None)

    if name == "resnet20":
        layers, cin = [conv_bn(3, 16, 3, 1, 1), nn.ReLU()], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(3):
                layers.append(basic(cin, cout, stride if b == 0 else 1))
                cin = cout
        head, shape, classes = 64, (3, 32, 32), 10
    elif name == "resnet50":
        layers = [conv_bn(3, 64, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for blocks, width, stride in RESNET50_STAGES:
            for b in range(blocks):
                layers.append(bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * EXPANSION
        head, shape, classes = cin, (3, 224, 224), 1000
    else:
        raise ValueError(f"no PyTorch model named {name!r}")
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(head, classes)]
    return nn.Sequential(*layers), shape, classes
