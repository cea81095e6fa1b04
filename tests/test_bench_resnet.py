"""benchmarks/bench_resnet.py cannot rot: it runs at tiny settings, and its nets agree."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"

torch = pytest.importorskip("torch")


def _module(name: str):
    """A benchmarks/ module by name (they import each other from that folder)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_shipped_resnet50_is_the_generated_one():
    resnets = _module("resnets")
    assert (REPO / "zoo" / "resnet50.yaml").read_text() == resnets.resnet50_yaml()


def test_shipped_googlenet_is_the_generated_one_with_bvlcs_shapes():
    """zoo/googlenet.yaml: the generator's text, BVLC GoogLeNet's 6,998,552 parameters (no
    auxiliary classifiers) and its inception outputs' channels at 28, 14 and 7 pixels."""
    from netrun.core.shape_inference import infer_shapes
    from netrun.model import load_model

    text = (REPO / "zoo" / "googlenet.yaml").read_text()
    assert text == _module("googlenet").googlenet_yaml()
    model = load_model(str(REPO / "zoo" / "googlenet.yaml"))
    assert sum(int(np.prod(p.shape)) for p in model.params) == 6_998_552
    specs = infer_shapes(model.predict_net, model.input_specs(2, {}))
    outputs = {o.outputs[0]: specs[o.outputs[0]].shape for o in model.predict_net.ops
               if o.type == "Concat"}
    assert [s[1:] for s in outputs.values()] == [
        (256, 28, 28), (480, 28, 28), (512, 14, 14), (512, 14, 14), (512, 14, 14),
        (528, 14, 14), (832, 14, 14), (832, 7, 7), (1024, 7, 7)]
    assert specs[model.outputs[0]].shape == (2, 1000)


@pytest.mark.parametrize("net", ["resnet20", "resnet50"])
def test_netrun_and_torch_nets_are_the_same_architecture(net):
    from netrun.model import load_model

    bench = _module("bench_resnet")
    model, shape, classes = bench.torch_resnet(torch, net)
    arch = bench.architecture(load_model(str(REPO / bench.NETS[net])), model, torch, shape)
    bench.check_same(net, arch)
    assert arch["output_shape"]["netrun"] == [1, classes]
    if net == "resnet50":   # He et al.'s figures: 25.6M parameters, 3.86 G multiply-adds
        assert arch["params"]["netrun"] == 25_557_032
        assert arch["conv_flops"]["netrun"] == pytest.approx(2 * 3.86e9, rel=0.01)


def test_the_check_sees_a_stride_in_the_wrong_place():
    from netrun.model import load_model

    bench = _module("bench_resnet")
    model, shape, _ = bench.torch_resnet(torch, "resnet50")
    # torchvision's v1.5: the first stage-2 block's stride on its 3×3 conv, not on the 1×1.
    body = model[6].body   # conv_bn, ReLU, max pool, 3 stage-1 blocks, then stage 2
    body[0][0].stride, body[2][0].stride = (1, 1), (2, 2)
    arch = bench.architecture(load_model(str(REPO / "zoo/resnet50.yaml")), model, torch, shape)
    with pytest.raises(bench.Unfair, match="conv_flops"):
        bench.check_same("resnet50", arch)


def test_benchmark_runs_at_tiny_settings():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(BENCH / "bench_resnet.py"), "--only", "resnet20",
                          "--batch", "2", "--reps", "1", "--profile-iters", "1", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["netrun_threads"] == 2 and result["threads"] == 2
    assert result["same_process"] is False
    rows = {(r["phase"], r["batch"]): r for r in result["rows"]}
    assert set(rows) == {("train", 2), ("infer", 2)}
    has_ort = importlib.util.find_spec("onnxruntime") is not None
    for (phase, _), r in rows.items():
        assert r["netrun"] > 0 and r["torch"] > 0
        assert r["torch_loaded_beside_netrun"] is False   # netrun ran in a process of its own
        assert (r["ort"] is not None) == (has_ort and phase == "infer")
        types = {t["type"]: t["count"] for t in r["by_type"]}
        assert types["Conv"] == 21
        # the bind-time rewrites: BN + ReLU fused in training, BN folded into convs at inference
        batch_norms = types.get("SpatialBN", 0) + types.get("SpatialBNRelu", 0)
        assert batch_norms == (21 if phase == "train" else 0)
        if phase == "train":
            assert types["ConvGradient"] == 21 and "MomentumSGDUpdate" in types
        else:
            assert "ConvGradient" not in types


def test_alternate_takes_the_time_a_callable_reports():
    """A net timed in its own process reports its milliseconds; the pipe is not counted."""
    bench_cpu = _module("bench_cpu")
    calls = []

    class Reports:
        times_itself = True

        def __call__(self):
            calls.append(1)
            return 7.0
    times = bench_cpu.alternate({"own": Reports(), "here": lambda: None}, reps=3, block=2)
    assert times["own"] == 7.0 and 0 <= times["here"] < 7.0 and len(calls) >= 3


def test_own_process_runs_the_net_there_and_reports_its_failures(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))   # the child imports the module by name
    own_process = importlib.import_module("own_process")
    with own_process.OwnProcessNet(str(REPO / "zoo/lenet.yaml"), 2, True, "heuristic") as net:
        assert net.info["torch_loaded"] is False and net.info["algos"]
        assert net() > 0
        prof = net.profile(1)
        assert {t["type"] for t in prof["by_type"]} >= {"Conv", "FC"}
        assert prof["algos"]
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(RuntimeError, match="failed during 'prepare'"):
        own_process.OwnProcessNet(missing, 2, True, "heuristic")


def test_bench_cpu_times_a_convolution_pass_in_its_own_process(monkeypatch):
    """bench_cpu's single-convolution rows: the pass is built and timed in a child process,
    with the algorithm netrun picks there."""
    monkeypatch.syspath_prepend(str(BENCH))
    own_process = importlib.import_module("own_process")
    bench_cpu = importlib.import_module("bench_cpu")
    with own_process.OwnProcess(bench_cpu.ConvPass, "d 5x5 C1", "fwd", "heuristic") as conv:
        assert conv.info["torch_loaded"] is False and conv.info["algo"]
        assert conv() > 0
