"""Caffe compatibility: run Caffe prototxt nets and solvers as they are.

    load_caffe_model(path, stages=(), level=0, input_shapes=None) -> CaffeModel (a Model)
    solver_to_config(path, data_override=None, weights=None) -> TrainConfig
    data_sources_of(model) -> [DataLayer]         data_config(model, override) -> data: dict
    load_caffe_weights(ws, path, model) -> WeightReport   (.caffemodel or HDF5 .caffemodel.h5)
    caffe_to_yaml(model) -> str                   (raw ops/init_ops model YAML)
    to_caffe(model, net="predict"|"train", batch=1) -> CaffeNet  (.text(), .weight_layers())
    write_caffemodel(path, caffe_net, values)     (a model's weights as a .caffemodel)
    is_solver_file(path) -> bool

`netrun.load_model("x.prototxt")` goes through load_caffe_model (registered as the .prototxt
format on import).
"""
from __future__ import annotations

from netrun.caffe.translate import CaffeModel, DataLayer, load_caffe_model

__all__ = ["CaffeModel", "DataLayer", "load_caffe_model", "solver_to_config", "is_solver_file",
           "data_sources_of", "data_config", "load_caffe_weights", "read_caffe_weights",
           "caffe_to_yaml", "to_caffe", "write_caffemodel"]


def __getattr__(name: str):
    # The solver, data, weights and YAML parts load on first use: the solver and data parts
    # bring the trainer's config and data sources, which loading a model does not need.
    modules = {"solver_to_config": "solver", "is_solver_file": "solver",
               "data_sources_of": "data", "data_config": "data",
               "load_caffe_weights": "weights", "read_caffe_weights": "weights",
               "caffe_to_yaml": "yaml_export", "to_caffe": "prototxt_export",
               "write_caffemodel": "caffemodel_export"}
    if name in modules:
        import importlib

        return getattr(importlib.import_module(f"netrun.caffe.{modules[name]}"), name)
    raise AttributeError(f"module 'netrun.caffe' has no attribute '{name}'")
