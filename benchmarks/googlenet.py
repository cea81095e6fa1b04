"""GoogLeNet (Szegedy et al. 2014, Inception v1 as BVLC trained it in Caffe) as netrun's model
YAML: the deploy net's architecture without the two auxiliary classifiers, for the memory and
executor benchmarks (its inception modules are four branches each, a shape the ResNets lack).

Caffe pools in ceil mode (legacy_pad 3), so 224 → 112 → 56 → 28 → 14 → 7 as in the paper;
LRN after the first two stages; every conv has a bias and a ReLU. `googlenet_yaml()` writes
zoo/googlenet.yaml (tests check the shipped file against it).
"""
from __future__ import annotations

# Inception modules: (name, 1×1, 3×3 reduce, 3×3, 5×5 reduce, 5×5, pool projection), with
# "pool" marking the 3×3 stride-2 max pools between stages.
INCEPTION = (("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "pool",
             ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64),
             ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64),
             ("4e", 256, 160, 320, 32, 128, 128), "pool",
             ("5a", 256, 160, 320, 32, 128, 128), ("5b", 384, 192, 384, 48, 128, 128))
FILLERS = "weight_filler: xavier, bias_filler: {type: constant, value: 0.2}"


def _conv_relu(name: str, source: str, out: int, kernel: int, stride: int = 1,
               pad: int = 0) -> list[str]:
    stride_s = f", stride: {stride}" if stride != 1 else ""
    pad_s = f", pad: {pad}" if pad else ""
    return [f"  - {{type: conv, name: {name}, input: {source}, num_output: {out}, "
            f"kernel: {kernel}{stride_s}{pad_s}, {FILLERS}}}",
            f"  - {{type: relu, name: {name}_relu, output: {name}}}"]


def _pool(name: str, source: str) -> str:
    return (f"  - {{type: max_pool, name: {name}, input: {source}, kernel: 3, stride: 2, "
            f"legacy_pad: 3}}")


def googlenet_yaml() -> str:
    """The text of zoo/googlenet.yaml (netrun's layer form)."""
    lines = [
        "# GoogLeNet (Inception v1, Szegedy et al. 2014) as BVLC trained it in Caffe, without the",
        "# auxiliary classifiers; Caffe's ceil-mode pooling (legacy_pad: 3). Written by",
        "# benchmarks/googlenet.py (googlenet_yaml); tests/test_bench_resnet.py keeps them equal.",
        "name: GoogLeNet",
        "inputs: {data: [3, 224, 224], label: []}",
        "layers:",
        *_conv_relu("conv1", "data", 64, 7, 2, 3),
        _pool("pool1", "conv1"),
        "  - {type: lrn, name: norm1, size: 5, alpha: 0.0001, beta: 0.75}",
        *_conv_relu("conv2_reduce", "norm1", 64, 1),
        *_conv_relu("conv2", "conv2_reduce", 192, 3, pad=1),
        "  - {type: lrn, name: norm2, input: conv2, size: 5, alpha: 0.0001, beta: 0.75}",
        _pool("pool2", "norm2"),
    ]
    x, pools = "pool2", 2
    for module in INCEPTION:
        if module == "pool":
            pools += 1
            lines.append(_pool(f"pool{pools}", x))
            x = f"pool{pools}"
            continue
        name, c1, r3, c3, r5, c5, proj = module
        p = f"inception_{name}"
        lines += [*_conv_relu(f"{p}_1x1", x, c1, 1),
                  *_conv_relu(f"{p}_3x3_reduce", x, r3, 1),
                  *_conv_relu(f"{p}_3x3", f"{p}_3x3_reduce", c3, 3, pad=1),
                  *_conv_relu(f"{p}_5x5_reduce", x, r5, 1),
                  *_conv_relu(f"{p}_5x5", f"{p}_5x5_reduce", c5, 5, pad=2),
                  f"  - {{type: max_pool, name: {p}_pool, input: {x}, kernel: 3, stride: 1, "
                  f"pad: 1}}",
                  *_conv_relu(f"{p}_pool_proj", f"{p}_pool", proj, 1),
                  f"  - {{type: concat, name: {p}_output, input: [{p}_1x1, {p}_3x3, "
                  f"{p}_5x5, {p}_pool_proj]}}"]
        x = f"{p}_output"
    lines += [
        f"  - {{type: average_pool, name: pool5, input: {x}, kernel: 7, stride: 1}}",
        "  - {type: dropout, name: pool5_drop, ratio: 0.4}",
        "  - {type: fc, name: classifier, num_output: 1000, weight_filler: xavier, "
        "bias_filler: {type: constant, value: 0}}",
        "loss: {type: softmax_cross_entropy, input: classifier, label: label}",
        "metrics: [{type: accuracy, input: classifier, label: label, top_k: 1}]",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(googlenet_yaml(), end="")
