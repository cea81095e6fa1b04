"""cuDNN as an optional convolution engine, through NVIDIA's cuDNN frontend (`import cudnn`).

CuPy 14 no longer ships cuDNN bindings; the frontend's Python package
(`pip install nvidia-cudnn-frontend`, with the cuDNN library) builds a one-node graph per
problem and direction (conv_fprop / conv_dgrad / conv_wgrad), lets cuDNN's heuristics pick an
execution plan, and runs it on CuPy arrays (passed through DLPack) on the backend's stream.
Without the package the algorithm applies to nothing. Symmetric padding and float32 only.

Two kinds of cuDNN engine are left out of every plan, so that cuDNN keeps netrun's promises:
those with the NONDETERMINISTIC numerical note (atomics: different bits from run to run) and
those with the TENSOR_CORE note, which for float32 data compute in TF32 (a 10-bit mantissa:
LeNet's logits were off by up to 5e-4, 4% of the smaller ones, measured on an H200). What remains is deterministic
float32 arithmetic, so cuDNN may be the default choice. `cudnn_tf32` keeps the tensor-core
engines (still deterministic); it is a candidate only where the settings allow TF32
(`--tf32`, the config's `tf32: true`), which is PyTorch's default for cuDNN convolutions.
"""
from __future__ import annotations

from typing import Any

from netrun.backends.cuda.cudnn import cudnn_module
from netrun.backends.cuda.source import device_id
from netrun.conv.algorithm import add_bias, register_algorithm
from netrun.conv.gpu.base import GPUAlgorithm
from netrun.errors import NetrunError


def _strides(dims: list[int]) -> list[int]:
    """Row-major (NCHW-packed) strides of dims."""
    out, step = [], 1
    for d in reversed(dims):
        out.append(step)
        step *= d
    return out[::-1]


@register_algorithm
class CudnnConv(GPUAlgorithm):
    """A cuDNN graph per problem and direction, built once; its plan from cuDNN's heuristics."""

    name = "cudnn"
    deterministic = True          # nondeterministic engines are deselected in _build
    optional_engine = True
    summary = ("cuDNN frontend graph (optional package): deterministic full-float32 engines, "
               "cuDNN's heuristic plan; symmetric pads")
    deselected_notes = ("NONDETERMINISTIC", "TENSOR_CORE")

    def __init__(self):
        self._graphs: dict[tuple, Any] = {}
        self._errors: dict[tuple, str] = {}
        self._handles: dict[int, Any] = {}
        self._streams: dict[int, int] = {}     # the stream each device's handle is set to

    def fits(self, p) -> bool:
        return cudnn_module() is not None and p.dtype == "float32" and p.pt == p.pb and p.pl == p.pr

    def workspace_bytes(self, p) -> int:
        """The largest workspace among the plans built for p so far (0 before any)."""
        sizes = [g[2] for (q, _, _), g in self._graphs.items() if q == p and g is not None]
        return max(sizes, default=0)

    def supports(self, xp, p, direction: str) -> bool:
        """Whether cuDNN has a plan for this direction of p (building it if needed)."""
        return self._graph(xp, p, direction, raise_errors=False) is not None

    def _handle(self, xp) -> Any:
        cudnn = cudnn_module()
        device = device_id(xp)
        if device not in self._handles:
            self._handles[device] = cudnn.create_handle()
        handle = self._handles[device]
        stream = xp.cuda.get_current_stream().ptr
        if self._streams.get(device) != stream:
            cudnn.set_stream(handle=handle, stream=stream)
            self._streams[device] = stream
        return handle

    def _graph(self, xp, p, direction: str, raise_errors: bool = True):
        key = (p, direction, device_id(xp))
        if key not in self._graphs:
            try:
                self._graphs[key] = self._build(xp, p, direction)
            except Exception as e:   # cuDNN has no plan for it, or the library failed
                self._graphs[key] = None
                self._errors[key] = str(e)
        graph = self._graphs[key]
        if graph is None and raise_errors:
            raise NetrunError(f"cuDNN cannot run the {direction} pass of {p.describe()}: "
                              f"{self._errors.get(key, 'no plan')}; fix the op's algo to another "
                              f"algorithm")
        return graph

    def _build(self, xp, p, direction: str):
        cudnn = cudnn_module()
        f32 = cudnn.data_type.FLOAT
        graph = cudnn.pygraph(handle=self._handle(xp), io_data_type=f32,
                              intermediate_data_type=f32, compute_data_type=f32)
        dims = {"x": [p.n, p.c, p.h, p.w], "w": [p.k, p.cg, p.kh, p.kw],
                "y": [p.n, p.k, p.oh, p.ow]}

        def tensor(name):
            return graph.tensor(name=name, dim=dims[name], stride=_strides(dims[name]),
                                data_type=f32)

        conv = {"padding": [p.pt, p.pl], "stride": [p.sh, p.sw], "dilation": [p.dh, p.dw]}
        if direction == "forward":
            a, b = tensor("x"), tensor("w")
            out, out_name = graph.conv_fprop(image=a, weight=b, **conv), "y"
        elif direction == "backward_data":
            a, b = tensor("y"), tensor("w")
            out, out_name = graph.conv_dgrad(loss=a, filter=b, **conv), "x"
        else:
            a, b = tensor("x"), tensor("y")
            out, out_name = graph.conv_wgrad(image=a, loss=b, **conv), "w"
        out.set_output(True).set_dim(dims[out_name]).set_stride(_strides(dims[out_name]))
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.deselect_numeric_notes([getattr(cudnn.numerical_note, note)
                                      for note in self.deselected_notes])
        graph.check_support()
        graph.build_plans()
        # The tensors' uids: execute then takes plain device pointers, skipping the
        # frontend's per-call DLPack conversions (most of a small conv's host time).
        return graph, (a.get_uid(), b.get_uid(), out.get_uid()), int(graph.get_workspace_size())

    def _run(self, xp, p, direction: str, first, second, out, scratch) -> None:
        graph, (a, b, y), size = self._graph(xp, p, direction)
        workspace = scratch("cudnn.workspace", (max(size, 1),), "uint8")
        graph.execute({a: first.data.ptr, b: second.data.ptr, y: out.data.ptr},
                      workspace.data.ptr, handle=self._handle(xp))

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        self._run(xp, p, "forward", x, w, out, scratch)
        add_bias(xp, out, bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        self._run(xp, p, "backward_data", dy, w, out, scratch)

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        self._run(xp, p, "backward_filter", x, dy, out, scratch)
        if dbias is not None:
            xp.sum(dy.reshape(p.n, p.k, p.oh * p.ow), axis=(0, 2), out=dbias)


@register_algorithm
class CudnnTF32Conv(CudnnConv):
    """cuDNN with its tensor-core engines: float32 data, TF32 products (opt-in)."""

    name = "cudnn_tf32"
    reduced_precision = True
    summary = ("cuDNN with tensor-core engines: TF32 products (10-bit mantissa), "
               "deterministic; only with --tf32")
    deselected_notes = ("NONDETERMINISTIC",)
