"""Audit of the operator library (issue 3): every op registered, with a gradient or a reason,
checked both ways (float64 finite differences and float32 PyTorch) or with a written reason.

The tables name the tests that check each op as "module::function" under tests/. Each test
records what it checks with `@checks_ops(*types, kind=...)` (tests/checks.py); the audit
imports the listed modules and verifies that each function exists and records a check of the
op of the kind it is listed as (finite differences, PyTorch with or without the gradient,
another reference), and that a test parametrized over op types runs that op. An op added
without a line here fails the audit with the table to extend. Gaps found by the audit are
filled by the `test_gap_*` tests at the end of this file.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import netrun
from netrun.core.gradient import gradient_ops, has_gradient
from netrun.core.registry import find_kernel
from netrun.core.schema import get_schema
from netrun.errors import SchemaError
from netrun.tools.ops_table import COMMAND, forward_of, netrun_schemas, op_rows, render, sample_def
from tests.checks import CHECKED, check_id, checks_ops
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward

REPO = Path(__file__).resolve().parents[2]

# The operator list of DESIGN.md and issue 3.
DESIGN_OPS = """
Conv ConvTranspose FC MatMul BatchMatMul MaxPool AveragePool Relu LeakyRelu PRelu Elu Sigmoid
Tanh Softplus Abs Exp Log Sqrt Clip Scale Softmax LogSoftmax SoftmaxWithLoss LabelCrossEntropy
SigmoidCrossEntropyWithLogits SquaredL2Distance AveragedLoss Accuracy SpatialBN LRN Dropout Add
Sub Mul Div Sum Concat Split Slice Flatten Reshape Transpose Copy StopGradient ReduceMean
ReduceSum XavierFill MSRAFill ConstantFill GaussianFill UniformFill GivenTensorFill WeightedSum
MomentumSGDUpdate Adam Adagrad RmsProp LearningRate Iter Save Load
""".split()

# Why no gradient flows through these ops (their schemas say no_gradient=True).
_FILLER = "filler: writes a blob from its arguments, no differentiable input"
_UPDATE = "update op: changes parameters or optimizer state after the backward pass"
NO_GRADIENT = {
    "StopGradient": "stops the gradient by definition",
    "Accuracy": "metric: a step function of the scores, zero gradient almost everywhere",
    "ConstantFill": _FILLER, "GaussianFill": _FILLER, "GivenTensorFill": _FILLER,
    "MSRAFill": _FILLER, "UniformFill": _FILLER, "XavierFill": _FILLER,
    "Iter": "update plumbing: the integer iteration counter",
    "LearningRate": "update plumbing: a schedule of the integer iteration",
    "WeightedSum": _UPDATE + " (the SGD step, weight decay); differentiable weighted sums "
                   "are Scale + Sum",
    "ClipGradientsByNorm": _UPDATE + " (rescales gradients)",
    "MomentumSGDUpdate": _UPDATE, "Adam": _UPDATE, "Adagrad": _UPDATE, "RmsProp": _UPDATE,
    "Save": "I/O: writes blobs to a file", "Load": "I/O: reads blobs from a file",
    "AllreduceStart": "update plumbing: sends gradients to the other ranks",
    "AllreduceWait": "update plumbing: averages gradients over the ranks",
    "BilinearFill": _FILLER, "SparseGaussianFill": _FILLER, "PositiveUnitballFill": _FILLER,
}

ACT, ELT, SHP, FC = "ops.test_activation", "ops.test_elementwise", "ops.test_shape", "ops.test_fc"
CONV, POOL, LOSS, NORM = "ops.test_conv", "ops.test_pool", "ops.test_loss", "ops.test_norm"
DROP, OPT, FILL, MET = "ops.test_dropout", "ops.test_optim", "ops.test_fill", "ops.test_metrics"
COV, CAFFE = "ops.test_coverage", "caffe.test_caffe_ops"
DIST, DIST_MPI = "dist.test_buckets", "dist.test_train_mpi"
_EXCHANGE = ("the gradient exchange between processes; one process must give its gradients "
             "back unchanged, two ranks what one process computes on the whole batch")
_EXCHANGE_TESTS = [f"{DIST}::test_the_exchange_ops_run_on_one_process_as_the_mean_of_one",
                   f"{DIST_MPI}::test_two_ranks_match_one_process_to_float32_rounding"]
_UNARY = ["Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Softplus", "Abs", "Exp", "Log", "Sqrt",
          "Clip", "Scale"]
_BINARY = ["Add", "Sub", "Mul", "Div"]

# Forward ops whose registered gradient is compared with float64 central differences.
FINITE_DIFFERENCES: dict[str, list[str]] = {
    **{t: [f"{ACT}::test_unary_gradient_and_reference"] for t in _UNARY},
    "PRelu": [f"{ACT}::test_prelu_gradient"],
    "HardSigmoid": ["ops.test_hard_sigmoid::test_gradient_matches_finite_differences"],
    **{t: [f"{ELT}::test_numpy_broadcasting_gradient",
           f"{ELT}::test_legacy_broadcast_axis_gradient"] for t in _BINARY},
    "Sum": [f"{ELT}::test_sum_forward_and_gradient"],
    "AddRelu": ["ops.test_fused_ops::test_add_relu_gradient"],
    "Concat": [f"{SHP}::test_concat_forward_gradient_and_inference"],
    "Split": [f"{SHP}::test_split_sizes_equal_parts_and_gradient"],
    "Slice": [f"{SHP}::test_slice_caffe2_negative_ends_and_gradient"],
    "Pad": ["ops.test_pad::test_pad_forward_and_gradient"],
    "NCHWToBlocked": ["ops.test_layout_ops::test_reorder_gradients"],
    "BlockedToNCHW": ["ops.test_layout_ops::test_reorder_gradients"],
    "Flatten": [f"{SHP}::test_flatten_matches_torch_and_gradient"],
    "Reshape": [f"{SHP}::test_reshape_zero_and_minus_one"],
    "ResizeLike": [f"{COV}::test_gap_resize_like_gradient"],
    "Transpose": [f"{SHP}::test_transpose_permutations_and_gradient"],
    "Copy": [f"{SHP}::test_copy_is_a_real_copy_with_identity_gradient"],
    "ReduceSum": [f"{SHP}::test_reduce_axes_keepdims_and_gradient"],
    "ReduceMean": [f"{SHP}::test_reduce_axes_keepdims_and_gradient"],
    "FC": [f"{FC}::test_fc_gradient"],
    "MatMul": [f"{FC}::test_matmul_gradient"],
    "BatchMatMul": [f"{FC}::test_batch_matmul_broadcast_gradient"],
    "Conv": [f"{CONV}::test_conv_gradient_matches_finite_differences",
             f"{CONV}::test_conv_edge_cases_finite_differences"],
    "ConvTranspose": [f"{CONV}::test_conv_transpose_gradient_matches_finite_differences"],
    "MaxPool": [f"{POOL}::test_pool_gradient_matches_finite_differences",
                f"{POOL}::test_pool_edge_cases_finite_differences"],
    "AveragePool": [f"{POOL}::test_pool_gradient_matches_finite_differences",
                    f"{POOL}::test_pool_edge_cases_finite_differences"],
    "Softmax": [f"{LOSS}::test_softmax_and_log_softmax_gradients"],
    "LogSoftmax": [f"{LOSS}::test_softmax_and_log_softmax_gradients"],
    "SoftmaxWithLoss": [f"{LOSS}::test_softmax_with_loss_gradient"],
    "LabelCrossEntropy": [f"{LOSS}::test_label_cross_entropy_gradient"],
    "SigmoidCrossEntropyWithLogits": [f"{LOSS}::test_sigmoid_cross_entropy_gradient"],
    "SquaredL2Distance": [f"{LOSS}::test_squared_l2_distance_and_averaged_loss_gradients"],
    "AveragedLoss": [f"{LOSS}::test_squared_l2_distance_and_averaged_loss_gradients"],
    "SpatialBN": [f"{NORM}::test_spatial_bn_gradient"],
    "SpatialBNRelu": ["ops.test_bn_relu::test_spatial_bn_relu_gradient"],
    "LRN": [f"{NORM}::test_lrn_gradient"],
    "Dropout": [f"{DROP}::test_dropout_gradient_with_fixed_mask"],
    "Power": [f"{CAFFE}::test_power_matches_torch_and_finite_differences"],
    "Max": [f"{CAFFE}::test_max_matches_torch_and_finite_differences"],
    "CaffeBatchNorm": [f"{CAFFE}::test_caffe_batch_norm_gradient"],
    "ContrastiveLoss": [f"{CAFFE}::test_contrastive_loss_value_and_gradient"],
}

# Ops compared with PyTorch (CPU, float32): the forward and, for differentiable ops, the
# gradient. Update ops are compared with torch.optim over several steps.
TORCH: dict[str, list[str]] = {
    **{t: [f"{ACT}::test_unary_matches_torch_float32"] for t in _UNARY if t != "Relu"},
    "Relu": [f"{COV}::test_gap_relu_matches_torch_float32"],
    "PRelu": [f"{ACT}::test_prelu_matches_torch_float32"],
    "HardSigmoid": ["ops.test_hard_sigmoid::test_matches_torch_float32"],
    **{t: [f"{ELT}::test_matches_torch_float32"] for t in _BINARY},
    "Sum": [f"{COV}::test_gap_matches_torch_float32"],
    "AddRelu": ["ops.test_fused_ops::test_add_relu_matches_torch_float32"],
    "Concat": [f"{SHP}::test_concat_and_split_match_torch_float32"],
    "Split": [f"{SHP}::test_concat_and_split_match_torch_float32",
              f"{COV}::test_gap_matches_torch_float32"],
    "Slice": [f"{COV}::test_gap_matches_torch_float32"],
    "Pad": ["ops.test_pad::test_pad_matches_torch_float32"],
    "Flatten": [f"{SHP}::test_flatten_matches_torch_and_gradient",
                f"{COV}::test_gap_matches_torch_float32"],
    "Reshape": [f"{SHP}::test_reshape_matches_torch_float32_and_runs_in_place"],
    "ResizeLike": [f"{COV}::test_gap_matches_torch_float32"],
    "Transpose": [f"{SHP}::test_transpose_matches_torch_permute"],
    "Copy": [f"{COV}::test_gap_matches_torch_float32"],
    "StopGradient": [f"{COV}::test_gap_stop_gradient_matches_torch_detach"],
    "ReduceSum": [f"{SHP}::test_reduce_matches_torch_float32"],
    "ReduceMean": [f"{SHP}::test_reduce_matches_torch_float32"],
    "FC": [f"{FC}::test_fc_matches_torch_linear_float32"],
    "MatMul": [f"{FC}::test_matmul_matches_torch_float32"],
    "BatchMatMul": [f"{FC}::test_batch_matmul_matches_torch_float32"],
    "Conv": [f"{CONV}::test_conv_forward_and_gradient_match_torch_float32"],
    "ConvTranspose": [f"{CONV}::test_conv_transpose_matches_torch_float32"],
    "MaxPool": [f"{POOL}::test_pool_matches_torch_float32"],
    "AveragePool": [f"{POOL}::test_pool_matches_torch_float32"],
    "Softmax": [f"{LOSS}::test_softmax_matches_torch"],
    "LogSoftmax": [f"{LOSS}::test_softmax_matches_torch"],
    "SoftmaxWithLoss": [f"{LOSS}::test_softmax_with_loss_matches_torch_cross_entropy"],
    "LabelCrossEntropy": [f"{LOSS}::test_label_cross_entropy_matches_torch_nll"],
    "SigmoidCrossEntropyWithLogits": [f"{LOSS}::test_sigmoid_cross_entropy_matches_torch"],
    "SquaredL2Distance": [f"{LOSS}::test_squared_l2_distance_matches_torch_mse"],
    "AveragedLoss": [f"{LOSS}::test_averaged_loss_matches_torch_mean"],
    "SpatialBN": [f"{NORM}::test_spatial_bn_training_matches_torch",
                  f"{NORM}::test_spatial_bn_eval_matches_torch"],
    "SpatialBNRelu": ["ops.test_bn_relu::test_spatial_bn_relu_matches_torch"],
    "LRN": [f"{NORM}::test_lrn_matches_torch"],
    "WeightedSum": [f"{OPT}::test_plain_sgd_and_weight_decay_match_torch"],
    "MomentumSGDUpdate": [f"{OPT}::test_momentum_sgd_matches_torch_with_constant_lr"],
    "Adam": [f"{OPT}::test_adam_matches_torch"],
    "Adagrad": [f"{OPT}::test_adagrad_matches_torch"],
    "RmsProp": [f"{OPT}::test_rmsprop_matches_torch"],
    "ClipGradientsByNorm": [f"{OPT}::test_clip_gradients_matches_torch"],
    "Power": [f"{CAFFE}::test_power_matches_torch_and_finite_differences",
              f"{COV}::test_gap_caffe_ops_match_torch_float32"],
    "Max": [f"{CAFFE}::test_max_matches_torch_and_finite_differences",
            f"{COV}::test_gap_caffe_ops_match_torch_float32"],
    "CaffeBatchNorm": [f"{CAFFE}::test_caffe_batch_norm_training_matches_torch_and_caffe_update",
                       f"{COV}::test_gap_caffe_ops_match_torch_float32"],
    "ContrastiveLoss": [f"{CAFFE}::test_contrastive_loss_matches_torch_float32",
                        f"{COV}::test_gap_caffe_ops_match_torch_float32"],
}

# Ops with no PyTorch comparison: why, and the tests that check them against another reference.
_RANDOM_FILL = "random draws from netrun's generator, not torch's: moments and bounds are " \
               "checked against Caffe's fan formulas"
NO_TORCH: dict[str, tuple[str, list[str]]] = {
    "Dropout": ("torch draws its own masks; compared with Y = X·mask/(1 − ratio) for the mask "
                "netrun drew, forward and gradient",
                [f"{DROP}::test_dropout_gradient_uses_the_mask",
                 f"{DROP}::test_dropout_statistics_and_scaling"]),
    "Accuracy": ("torch has no accuracy op; compared with a NumPy top-k reference using Caffe's "
                 "tie rule", [f"{MET}::test_accuracy_matches_reference"]),
    "Iter": ("an integer counter; torch has no op", [f"{OPT}::test_iter_increments_in_place"]),
    "LearningRate": ("Caffe's policies (inv, step, poly, ...) are not torch's schedulers; compared "
                     "with the policy formulas",
                     [f"{OPT}::test_learning_rate_is_negative_policy_value"]),
    "XavierFill": (_RANDOM_FILL, [f"{FILL}::test_xavier_fill"]),
    "MSRAFill": (_RANDOM_FILL, [f"{FILL}::test_msra_fill"]),
    "GaussianFill": (_RANDOM_FILL, [f"{FILL}::test_gaussian_and_uniform_fill"]),
    "UniformFill": (_RANDOM_FILL, [f"{FILL}::test_gaussian_and_uniform_fill"]),
    "ConstantFill": ("a constant; compared with NumPy",
                     [f"{FILL}::test_constant_fill_shape_and_dtype_rules"]),
    "GivenTensorFill": ("given values; compared with NumPy", [f"{FILL}::test_given_tensor_fill"]),
    "BilinearFill": ("torch has no bilinear filler; compared with Caffe's loop",
                     [f"{CAFFE}::test_bilinear_fill_matches_caffe"]),
    "SparseGaussianFill": (_RANDOM_FILL,
                           [f"{CAFFE}::test_sparse_gaussian_and_positive_unitball_fills"]),
    "PositiveUnitballFill": (_RANDOM_FILL,
                             [f"{CAFFE}::test_sparse_gaussian_and_positive_unitball_fills"]),
    "AllreduceStart": (_EXCHANGE, _EXCHANGE_TESTS),
    "AllreduceWait": (_EXCHANGE, _EXCHANGE_TESTS),
    "NCHWToBlocked": ("torch has no op for oneDNN's blocked layouts; compared with the layout's "
                      "definition by NumPy indexing, and round trips",
                      ["ops.test_layout_ops::test_reorders_match_the_layout_and_round_trip"]),
    "BlockedToNCHW": ("torch has no op for oneDNN's blocked layouts; compared with the layout's "
                      "definition by NumPy indexing, and round trips",
                      ["ops.test_layout_ops::test_reorders_match_the_layout_and_round_trip"]),
    "Save": ("file I/O; a Save/Load round trip must give the blobs back bit for bit",
             [f"{COV}::test_gap_save_load_round_trip"]),
    "Load": ("file I/O; a Save/Load round trip must give the blobs back bit for bit",
             [f"{COV}::test_gap_save_load_round_trip"]),
}

# Ops without shape inference, and why.
NO_SHAPE_INFERENCE = {"Load": "its outputs' shapes are in the file it reads at run time"}


def _schemas() -> dict:
    return netrun_schemas()


def _forward_ops() -> list[str]:
    """Every op a user writes: not the gradient ops that gradient makers emit."""
    schemas = _schemas()
    return [t for t in schemas if forward_of(t, schemas) is None]


def _parametrized_types(fn) -> set[str] | None:
    """The op types a test is parametrized over (an argument named type or type_), if any."""
    types = None
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        at = [i for i, n in enumerate(names) if n.startswith("type")]
        if not at:
            continue
        types = types or set()
        for case in mark.args[1]:
            if hasattr(case, "marks") and hasattr(case, "values"):   # pytest.param(...)
                case = case.values
            types.add((case if len(names) > 1 else (case,))[at[0]])
    return types


@functools.lru_cache(maxsize=None)
def _test_module(module: str):
    """The test module "ops.test_x" as pytest loaded it (under whatever name), else imported.

    Importing a second copy would rerun its module-level code (op registrations, say).
    """
    path = os.path.normpath(REPO / "tests" / (module.replace(".", "/") + ".py"))
    for loaded in list(sys.modules.values()):
        file = getattr(loaded, "__file__", None)
        if isinstance(file, str) and os.path.normpath(file) == path:
            return loaded
    return importlib.import_module(f"tests.{module}")


def _listed_test(ref: str):
    """The test function named "module::function", or None when there is no such test."""
    module, name = ref.split("::")
    fn = getattr(_test_module(module), name, None)
    return fn if callable(fn) else None


def _records(ref: str) -> dict[str, frozenset[str]]:
    """What the listed test records that it checks (kind -> op types); empty if it records none."""
    fn = _listed_test(ref)
    return CHECKED.get(check_id(fn), {}) if fn is not None else {}


def _ref_problems(op: str, refs: list[str], what: str, kinds: tuple[str, ...]) -> list[str]:
    """What is wrong with the tests listed for `op` (nothing when they exist and fit)."""
    if not refs:
        return [f"{op}: an empty list of {what} tests"]
    problems = []
    for ref in refs:
        fn = _listed_test(ref)
        if fn is None:
            problems.append(f"{op}: {ref} does not exist")
            continue
        records = _records(ref)
        if not any(op in records.get(kind, ()) for kind in kinds):
            problems.append(f"{op}: {ref} is listed as a {what} test but records no such check "
                            f"of {op} (@checks_ops('{op}', kind='{kinds[0]}') where it does one)")
        types = _parametrized_types(fn)
        if types is not None and op not in types:
            problems.append(f"{op}: {ref} is parametrized over op types without '{op}'")
    return problems


def _report(problems: list[str]) -> None:
    """Fail with every problem at once, one per line."""
    if problems:
        pytest.fail(f"{len(problems)} problem(s):\n" + "\n".join(problems), pytrace=False)


# The audit ---------------------------------------------------------------------------------
def test_every_op_in_the_design_is_registered():
    _report([f"{t} (DESIGN.md) has no schema" for t in DESIGN_OPS if t not in _schemas()])


def test_every_forward_op_has_a_gradient_or_a_written_reason():
    problems = []
    for t in _forward_ops():
        if get_schema(t).no_gradient:
            if t not in NO_GRADIENT:
                problems.append(f"{t} has no gradient: write why in NO_GRADIENT")
            if has_gradient(t):
                problems.append(f"{t} is no_gradient but has a gradient maker")
        elif not has_gradient(t):
            problems.append(f"{t} has no gradient maker and is not marked no_gradient")
        elif t in NO_GRADIENT:
            problems.append(f"{t} has a gradient: remove it from NO_GRADIENT")
    _report(problems)


def test_every_differentiable_op_is_checked_against_finite_differences():
    problems = []
    for t in _forward_ops():
        if get_schema(t).no_gradient:
            if t in FINITE_DIFFERENCES:
                problems.append(f"{t} has no gradient to check: remove it from FINITE_DIFFERENCES")
        elif t not in FINITE_DIFFERENCES:
            problems.append(f"{t}: add its finite-difference test to FINITE_DIFFERENCES")
        else:
            problems += _ref_problems(t, FINITE_DIFFERENCES[t], "finite-difference",
                                      ("finite_differences",))
    _report(problems)


def test_every_op_is_compared_with_torch_or_has_a_written_reason():
    problems = []
    for t in _forward_ops():
        if (t in TORCH) == (t in NO_TORCH):
            problems.append(f"{t}: list its PyTorch test in TORCH, or why there is none in "
                            f"NO_TORCH (one of the two)")
        elif t in TORCH:
            problems += _ref_problems(t, TORCH[t], "PyTorch", ("torch", "torch_gradient"))
            if not get_schema(t).no_gradient and not any(
                    t in _records(ref).get("torch_gradient", ()) for ref in TORCH[t]):
                problems.append(f"{t}: its PyTorch tests compare only the forward; compare "
                                f"the gradient too (kind='torch_gradient')")
        else:
            reason, refs = NO_TORCH[t]
            if len(reason) < 20:
                problems.append(f"{t}: write a real reason in NO_TORCH")
            problems += _ref_problems(t, refs, "reference", ("reference",))
    _report(problems)


def test_tables_name_only_registered_forward_ops():
    forward = set(_forward_ops())
    _report([f"{name} lists {t}, which is not a registered forward op"
             for name, table in [("NO_GRADIENT", NO_GRADIENT),
                                 ("FINITE_DIFFERENCES", FINITE_DIFFERENCES), ("TORCH", TORCH),
                                 ("NO_TORCH", NO_TORCH)]
             for t in sorted(set(table) - forward)])


def test_checks_ops_records_name_only_registered_forward_ops():
    # A misspelt type in a decorator would otherwise be a check of nothing that nobody reads.
    refs = [r for table in (FINITE_DIFFERENCES, TORCH) for rs in table.values() for r in rs]
    refs += [r for _, rs in NO_TORCH.values() for r in rs]
    for ref in refs:
        _listed_test(ref)   # imports the module, which records its checks
    forward = set(_forward_ops())
    _report([f"{test} records a {kind} check of {t}, which is not a registered forward op"
             for test, kinds in sorted(CHECKED.items()) for kind, types in sorted(kinds.items())
             for t in sorted(types - forward)])


def _family_names_the_kernel_module(family: str, kernel) -> bool:
    """The family is the kernel's module, or its package (netrun.ops.caffe_ops.fillers).

    A kernel built by a shared factory (activation.pointwise_op, which unary.py calls) lives in
    the factory's module; the op's own code is then what the kernel closes over (its forward).
    """
    modules = {kernel.__module__}
    for cell in kernel.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:      # a cell not filled yet
            continue
        if inspect.isfunction(value):
            modules.add(value.__module__)
    return any(family in m.split(".")[1:] for m in modules)


def test_every_op_has_kernels_shape_inference_and_a_family_module():
    problems = []
    for t, schema in _schemas().items():
        kernel = find_kernel(t, "cpu")
        if kernel is None:
            problems.append(f"{t} has no CPU kernel")
        # Registration next to the implementation: the family names the module of the op.
        elif not _family_names_the_kernel_module(schema.family, kernel):
            problems.append(f"{t}: family '{schema.family}' but its CPU kernel is "
                            f"{kernel.__module__}.{kernel.__qualname__}")
        if schema.shape_fn is None and t not in NO_SHAPE_INFERENCE:
            problems.append(f"{t} has no shape inference")
    _report(problems)


def test_gradient_makers_emit_registered_ops():
    schemas, problems = _schemas(), []
    for t in _forward_ops():
        if not has_gradient(t):
            continue
        ops, _ = gradient_ops(sample_def(schemas[t]))
        if not ops:
            problems.append(f"{t}: its gradient maker emits nothing")
        problems += [f"{t}'s gradient emits {o.type}, which has no schema or CPU kernel"
                     for o in ops if o.type not in schemas or find_kernel(o.type, "cpu") is None]
        outputs = [n for o in ops for n in o.outputs]
        # Two writes of one gradient blob would lose one of them (the builder sums instead).
        if len(set(outputs)) != len(outputs):
            problems.append(f"{t}: two of its gradient ops write the same blob")
    _report(problems)


def test_operator_table_is_up_to_date():
    path = REPO / "docs" / "operators.md"
    assert path.exists(), f"docs/operators.md is missing: run `{COMMAND}`"
    if path.read_text(encoding="utf-8") != render(op_rows()):
        pytest.fail(f"docs/operators.md is out of date with the registry: run `{COMMAND}`",
                    pytrace=False)


def test_operator_table_lists_every_op_with_its_gradient():
    rows = {r.type: r for r in op_rows()}
    assert set(rows) == set(_schemas())
    assert rows["Relu"].gradient == "`ReluGradient`"
    assert rows["ReluGradient"].gradient == "(gradient of Relu)"
    assert rows["SoftmaxWithLoss"].gradient.endswith("(not for labels, weights)")
    assert rows["StopGradient"].gradient.startswith("none: ")
    assert rows["Conv"].gpu == "shared, GPU algorithms (unverified on GPU)"
    assert rows["Conv"].cpu == "shared"
    assert rows["HardSigmoid"].gpu == "gpu kernel (unverified on GPU)"
    assert rows["Relu"].gpu == "shared (unverified on GPU)"
    assert not any("missing" in c for r in rows.values() for c in r.cells())


# Arguments: a bad one fails at build time, naming the op and the argument ------------------
_ADAM = (["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"])
_RMS = (["g", "ms", "mom", "lr"], ["g", "ms", "mom"])
BAD_ARGUMENTS = [  # (type, inputs, outputs, args, the argument the message must name)
    ("Adam", *_ADAM, {"beta1": 1.0}, "beta1"),
    ("Adam", *_ADAM, {"beta2": -0.1}, "beta2"),
    ("Adam", *_ADAM, {"epsilon": 0.0}, "epsilon"),
    ("Adagrad", ["p", "h", "g", "lr"], ["p", "h"], {"decay": 1.5}, "decay"),
    ("Adagrad", ["p", "h", "g", "lr"], ["p", "h"], {"epsilon": -1e-8}, "epsilon"),
    ("RmsProp", *_RMS, {"epsilon": 0.0}, "epsilon"),
    ("RmsProp", *_RMS, {"decay": 2.0}, "decay"),
    ("RmsProp", *_RMS, {"momentum": -0.5}, "momentum"),
    ("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], {"momentum": -0.1}, "momentum"),
    ("ClipGradientsByNorm", ["g"], ["g"], {"max_norm": 0.0}, "max_norm"),
    ("LearningRate", ["it"], ["lr"], {"base_lr": 0.1, "policy": "steep"}, "policy"),
    ("Elu", ["X"], ["Y"], {"alpha": -1.0}, "alpha"),
    ("Clip", ["X"], ["Y"], {"min": 2.0, "max": 1.0}, "min"),
    ("Dropout", ["X"], ["Y", "mask"], {"ratio": 1.0}, "ratio"),
    ("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y"], {"is_test": 1, "epsilon": 0.0}, "epsilon"),
    ("LRN", ["X"], ["Y"], {"size": 4}, "size"),
    ("Accuracy", ["X", "L"], ["A"], {"top_k": 0}, "top_k"),
    ("Split", ["X"], ["A", "B"], {"split": [-1, 2]}, "split"),
    ("Reshape", ["X"], ["Y"], {"shape": [-1, -1]}, "shape"),
    ("Transpose", ["X"], ["Y"], {"axes": [0, 0]}, "axes"),
    ("ReduceMean", ["X"], ["Y"], {"axes": [1, 1]}, "axes"),
    ("Mul", ["A", "B"], ["Y"], {"broadcast": 2}, "broadcast"),
    ("Softmax", ["X"], ["Y"], {"axis": "last"}, "axis"),
    ("SoftmaxWithLoss", ["X", "L"], ["P", "loss"], {"scale": "x"}, "scale"),
    ("FC", ["X", "W", "b"], ["Y"], {"axis_w": 1.5}, "axis_w"),
    ("MaxPool", ["X"], ["Y"], {"kernel": 2, "pad": 2}, "pad"),
    ("Conv", ["X", "W"], ["Y"], {"kernel": 3, "orderr": "NHWC"}, "orderr"),
]


@pytest.mark.parametrize("type_,inputs,outputs,args,arg", BAD_ARGUMENTS,
                         ids=[f"{c[0]}-{c[4]}" for c in BAD_ARGUMENTS])
def test_bad_argument_fails_at_build_time_naming_op_and_argument(type_, inputs, outputs, args,
                                                                 arg):
    op = netrun.op(type_, inputs, outputs, name="layer7", **args)
    with pytest.raises(SchemaError) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "'layer7'" in str(info.value) and f"'{arg}'" in str(info.value), str(info.value)


def test_every_argument_of_every_op_is_type_checked():
    wrong = {"int": "seven", "float": "seven", "str": 7, "ints": ["seven"], "floats": ["x"],
             "strs": [7]}
    for t, schema in _schemas().items():
        base = sample_def(schema)
        for spec in schema.args:
            if spec.type == "any":
                continue
            op = base.with_(args={spec.name: wrong[spec.type]}, name="layer7")
            with pytest.raises(SchemaError, match=f"'layer7'.*'{spec.name}'"):
                schema.resolve_args(op)


# Gaps the audit found, filled here ----------------------------------------------------------
def _nudge(x: np.ndarray, gap: float = 0.05) -> np.ndarray:
    """Move values near ReLU's kink at 0 away from it."""
    return np.where(np.abs(x) < gap, np.where(x >= 0, gap, -gap), x).astype(x.dtype)


@checks_ops("Relu", kind="torch_gradient")
def test_gap_relu_matches_torch_float32(device):
    torch = pytest.importorskip("torch")
    x = _nudge(np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32))
    (ty,), (tdx,), dy = torch_forward_backward(torch.relu, [x])
    (y,), grads = netrun_forward_backward(netrun.op("Relu", ["X"], ["Y"]), {"X": x}, dy, device)
    assert y.dtype == grads["X"].dtype == np.float32
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["X"], tdx)


def _gap_cases(torch):
    """name: (op, inputs, torch function of the inputs in order)."""
    rng = np.random.default_rng(1)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    a, b, c = r(2, 3, 4), r(2, 3, 4), r(2, 3, 4)
    return {
        "Sum": (netrun.op("Sum", ["A", "B", "C"], ["Y"]), {"A": a, "B": b, "C": c},
                lambda a, b, c: a + b + c),
        "Slice": (netrun.op("Slice", ["X"], ["Y"], starts=[1, 0], ends=[-1, 2]),
                  {"X": r(4, 3, 5)}, lambda x: x[1:, :2]),
        "Split": (netrun.op("Split", ["X"], ["P", "Q"], axis=1, split=[2, 4]), {"X": r(2, 6, 3)},
                  lambda x: torch.split(x, [2, 4], dim=1)),
        "Flatten": (netrun.op("Flatten", ["X"], ["Y"], axis=2), {"X": r(2, 3, 4, 5)},
                    lambda x: x.reshape(6, 20)),
        "ResizeLike": (netrun.op("ResizeLike", ["X", "L"], ["Y"]), {"X": r(2, 6), "L": r(3, 4)},
                       lambda x, like: x.reshape(like.shape)),
        "Copy": (netrun.op("Copy", ["X"], ["Y"]), {"X": r(3, 4)}, lambda x: x.clone()),
    }


@checks_ops("Sum", "Slice", "Split", "Flatten", "ResizeLike", "Copy", kind="torch_gradient")
@pytest.mark.parametrize("name", ["Sum", "Slice", "Split", "Flatten", "ResizeLike", "Copy"])
def test_gap_matches_torch_float32(name, device):
    torch = pytest.importorskip("torch")
    op, inputs, fn = _gap_cases(torch)[name]
    ys, tgrads, dy = torch_forward_backward(fn, list(inputs.values()))
    outs, grads = netrun_forward_backward(op, inputs, dy, device)
    for y, ty in zip(outs, ys):
        np.testing.assert_allclose(y, ty, rtol=1e-6, atol=1e-7)
    for (blob, x), tg in zip(inputs.items(), tgrads):
        if name == "ResizeLike" and blob == "L":   # only its shape is read: no gradient
            assert grads[blob] is None
            continue
        assert grads[blob].dtype == np.float32
        np.testing.assert_allclose(grads[blob], tg, rtol=1e-6, atol=1e-7)


@checks_ops("StopGradient", kind="torch_gradient")
def test_gap_stop_gradient_matches_torch_detach():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    net = netrun.NetDef("n", [netrun.op("StopGradient", ["X"], ["H"]),
                              netrun.op("Mul", ["H", "W"], ["Y"]),
                              netrun.op("ReduceSum", ["Y"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"])
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", x)
    ws.feed_blob("W", w)
    ws.run_net_once(net)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (xt.detach() * wt).sum().backward()
    np.testing.assert_array_equal(ws.fetch_blob("H"), x)
    assert xt.grad is None and "X" not in grads
    np.testing.assert_allclose(ws.fetch_blob(grads["W"]), wt.grad.numpy(), rtol=1e-6)


@checks_ops("ResizeLike", kind="finite_differences")
def test_gap_resize_like_gradient():
    rng = np.random.default_rng(3)
    inputs = {"X": rng.standard_normal((2, 6)), "L": np.zeros((3, 2, 2))}
    op = netrun.op("ResizeLike", ["X", "L"], ["Y"])
    np.testing.assert_array_equal(run_op(op, inputs)[0], inputs["X"].reshape(3, 2, 2))
    check_gradient(op, inputs)


@checks_ops("Save", "Load", kind="reference")
def test_gap_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    blobs = {"w": rng.standard_normal((3, 2)).astype(np.float32), "it": np.array(7, np.int64)}
    path = str(tmp_path / "blobs.h5")
    ws = netrun.Workspace("cpu")
    for k, v in blobs.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(netrun.op("Save", list(blobs), [], db=path, db_type="h5"))
    ws2 = netrun.Workspace("cpu")
    ws2.run_operator_once(netrun.op("Load", [], list(blobs), db=path, db_type="h5"))
    for k, v in blobs.items():
        got = ws2.fetch_blob(k)
        assert got.dtype == v.dtype
        np.testing.assert_array_equal(got, v)


def _caffe_cases():
    """Caffe's ops with torch twins: name -> (op, inputs (float32), torch fn of the inputs)."""
    F = pytest.importorskip("torch").nn.functional
    rng = np.random.default_rng(5)
    x = rng.uniform(0.2, 2.0, (3, 4)).astype(np.float32)
    # Max: distinct values, so torch's tie rule (split the gradient) never differs from Caffe's.
    flat = (rng.permutation(36) * 0.1).astype(np.float32)
    a, b = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((6, 3)) \
        .astype(np.float32)
    similar = np.array([1, 0, 0, 1, 0, 0], np.int32)

    def contrastive(a, b, s):
        d = (a - b).norm(dim=1)
        s = s.float()
        return (s * d ** 2 + (1 - s) * (1.5 - d).clamp(min=0) ** 2).sum() / (2 * a.shape[0])

    bn_in = {"X": (rng.standard_normal((4, 3, 2, 2)) * 2 + 1).astype(np.float32),
             "m": np.zeros(3, np.float32), "v": np.zeros(3, np.float32),
             "f": np.zeros(1, np.float32)}
    return {
        "Power": (netrun.op("Power", ["X"], ["Y"], power=1.5, scale=0.7, shift=0.4), {"X": x},
                  lambda x: (0.4 + 0.7 * x) ** 1.5),
        "Max": (netrun.op("Max", ["A", "B", "C"], ["Y"]),
                {k: flat[i * 12:(i + 1) * 12].reshape(3, 4) for i, k in enumerate("ABC")},
                lambda a, b, c: a.maximum(b).maximum(c)),
        "CaffeBatchNorm": (netrun.op("CaffeBatchNorm", ["X", "m", "v", "f"],
                                     ["Y", "m", "v", "f", "sm", "si"], epsilon=1e-5), bn_in,
                           lambda x, m, v, f: F.batch_norm(x, None, None, training=True,
                                                           eps=1e-5)),
        "ContrastiveLoss": (netrun.op("ContrastiveLoss", ["A", "B", "S"], ["loss"], margin=1.5),
                            {"A": a, "B": b, "S": similar}, contrastive),
    }


@checks_ops("Power", "Max", "CaffeBatchNorm", "ContrastiveLoss", kind="torch_gradient")
@pytest.mark.parametrize("name", ["Power", "Max", "CaffeBatchNorm", "ContrastiveLoss"])
def test_gap_caffe_ops_match_torch_float32(name):
    # The Caffe ops' own tests compare the forward with torch; this compares the gradients.
    op, inputs, fn = _caffe_cases()[name]
    ys, tgrads, dy = torch_forward_backward(fn, list(inputs.values()))
    outs, grads = netrun_forward_backward(op, inputs, dy)
    np.testing.assert_allclose(outs[0], ys[0], rtol=1e-5, atol=1e-5)
    checked = 0
    for (blob, x), tg in zip(inputs.items(), tgrads):
        if grads.get(blob) is None:      # labels and running statistics get no gradient
            continue
        scale = max(float(np.abs(tg).max()), 1e-3)
        np.testing.assert_allclose(grads[blob], tg, rtol=1e-4, atol=2e-5 * scale,
                                   err_msg=f"{name}: d{blob}")
        checked += 1
    assert checked
