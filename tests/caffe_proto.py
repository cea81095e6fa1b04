"""Caffe's NetParameter built at run time with google.protobuf (tests only): the real text
format parser and binary decoder, with BVLC caffe.proto's field numbers and types, so a
prototxt or caffemodel that netrun writes is checked by code netrun did not write.

Only the messages and fields netrun writes are declared (an unknown field is then a parse
error, as it would be for Caffe if netrun invented one); names, numbers, types and enum
values are caffe.proto's.
"""
from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
STRING, FLOAT, INT32, INT64, UINT32, BOOL, MSG, ENUM = (
    F.TYPE_STRING, F.TYPE_FLOAT, F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_BOOL,
    F.TYPE_MESSAGE, F.TYPE_ENUM)

# enum -> (the message it is nested in, as in caffe.proto; None: the package, values)
ENUMS = {
    "Phase": (None, ["TRAIN", "TEST"]),
    "VarianceNorm": ("FillerParameter", ["FAN_IN", "FAN_OUT", "AVERAGE"]),
    "DB": ("DataParameter", ["LEVELDB", "LMDB"]),
    "EltwiseOp": ("EltwiseParameter", ["PROD", "SUM", "MAX"]),
    "NormRegion": ("LRNParameter", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"]),
    "PoolMethod": ("PoolingParameter", ["MAX", "AVE", "STOCHASTIC"]),
    "RoundMode": ("PoolingParameter", ["CEIL", "FLOOR"]),
    "NormalizationMode": ("LossParameter", ["FULL", "VALID", "BATCH_SIZE", "NONE"]),
}

# message -> [(name, number, label, type, message or enum type)]
SCHEMA = {
    "BlobShape": [("dim", 1, REP, INT64, None)],
    "BlobProto": [("num", 1, OPT, INT32, None), ("channels", 2, OPT, INT32, None),
                  ("height", 3, OPT, INT32, None), ("width", 4, OPT, INT32, None),
                  ("data", 5, REP, FLOAT, None), ("shape", 7, OPT, MSG, "BlobShape")],
    "FillerParameter": [("type", 1, OPT, STRING, None), ("value", 2, OPT, FLOAT, None),
                        ("min", 3, OPT, FLOAT, None), ("max", 4, OPT, FLOAT, None),
                        ("mean", 5, OPT, FLOAT, None), ("std", 6, OPT, FLOAT, None),
                        ("sparse", 7, OPT, INT32, None),
                        ("variance_norm", 8, OPT, ENUM, "VarianceNorm")],
    "NetParameter": [("name", 1, OPT, STRING, None), ("input", 3, REP, STRING, None),
                     ("input_dim", 4, REP, INT32, None),
                     ("input_shape", 8, REP, MSG, "BlobShape"),
                     ("layer", 100, REP, MSG, "LayerParameter")],
    "NetStateRule": [("phase", 1, OPT, ENUM, "Phase"), ("min_level", 2, OPT, INT32, None),
                     ("max_level", 3, OPT, INT32, None), ("stage", 4, REP, STRING, None),
                     ("not_stage", 5, REP, STRING, None)],
    "ParamSpec": [("name", 1, OPT, STRING, None), ("lr_mult", 3, OPT, FLOAT, None),
                  ("decay_mult", 4, OPT, FLOAT, None)],
    "LayerParameter": [
        ("name", 1, OPT, STRING, None), ("type", 2, OPT, STRING, None),
        ("bottom", 3, REP, STRING, None), ("top", 4, REP, STRING, None),
        ("loss_weight", 5, REP, FLOAT, None), ("param", 6, REP, MSG, "ParamSpec"),
        ("blobs", 7, REP, MSG, "BlobProto"), ("include", 8, REP, MSG, "NetStateRule"),
        ("exclude", 9, REP, MSG, "NetStateRule"), ("phase", 10, OPT, ENUM, "Phase"),
        ("propagate_down", 11, REP, BOOL, None),
        ("transform_param", 100, OPT, MSG, "TransformationParameter"),
        ("loss_param", 101, OPT, MSG, "LossParameter"),
        ("accuracy_param", 102, OPT, MSG, "AccuracyParameter"),
        ("concat_param", 104, OPT, MSG, "ConcatParameter"),
        ("convolution_param", 106, OPT, MSG, "ConvolutionParameter"),
        ("data_param", 107, OPT, MSG, "DataParameter"),
        ("dropout_param", 108, OPT, MSG, "DropoutParameter"),
        ("eltwise_param", 110, OPT, MSG, "EltwiseParameter"),
        ("hdf5_data_param", 112, OPT, MSG, "HDF5DataParameter"),
        ("image_data_param", 115, OPT, MSG, "ImageDataParameter"),
        ("inner_product_param", 117, OPT, MSG, "InnerProductParameter"),
        ("lrn_param", 118, OPT, MSG, "LRNParameter"),
        ("pooling_param", 121, OPT, MSG, "PoolingParameter"),
        ("power_param", 122, OPT, MSG, "PowerParameter"),
        ("relu_param", 123, OPT, MSG, "ReLUParameter"),
        ("softmax_param", 125, OPT, MSG, "SoftmaxParameter"),
        ("slice_param", 126, OPT, MSG, "SliceParameter"),
        ("prelu_param", 131, OPT, MSG, "PReLUParameter"),
        ("reshape_param", 133, OPT, MSG, "ReshapeParameter"),
        ("flatten_param", 135, OPT, MSG, "FlattenParameter"),
        ("batch_norm_param", 139, OPT, MSG, "BatchNormParameter"),
        ("elu_param", 140, OPT, MSG, "ELUParameter"),
        ("bias_param", 141, OPT, MSG, "BiasParameter"),
        ("scale_param", 142, OPT, MSG, "ScaleParameter"),
        ("input_param", 143, OPT, MSG, "InputParameter")],
    "TransformationParameter": [("scale", 1, OPT, FLOAT, None), ("mirror", 2, OPT, BOOL, None),
                                ("crop_size", 3, OPT, UINT32, None),
                                ("mean_file", 4, OPT, STRING, None),
                                ("mean_value", 5, REP, FLOAT, None)],
    "LossParameter": [("ignore_label", 1, OPT, INT32, None), ("normalize", 2, OPT, BOOL, None),
                      ("normalization", 3, OPT, ENUM, "NormalizationMode")],
    "AccuracyParameter": [("top_k", 1, OPT, UINT32, None), ("axis", 2, OPT, INT32, None),
                          ("ignore_label", 3, OPT, INT32, None)],
    "ConcatParameter": [("concat_dim", 1, OPT, UINT32, None), ("axis", 2, OPT, INT32, None)],
    "ConvolutionParameter": [
        ("num_output", 1, OPT, UINT32, None), ("bias_term", 2, OPT, BOOL, None),
        ("pad", 3, REP, UINT32, None), ("kernel_size", 4, REP, UINT32, None),
        ("group", 5, OPT, UINT32, None), ("stride", 6, REP, UINT32, None),
        ("weight_filler", 7, OPT, MSG, "FillerParameter"),
        ("bias_filler", 8, OPT, MSG, "FillerParameter"), ("pad_h", 9, OPT, UINT32, None),
        ("pad_w", 10, OPT, UINT32, None), ("kernel_h", 11, OPT, UINT32, None),
        ("kernel_w", 12, OPT, UINT32, None), ("stride_h", 13, OPT, UINT32, None),
        ("stride_w", 14, OPT, UINT32, None), ("axis", 16, OPT, INT32, None),
        ("dilation", 18, REP, UINT32, None)],
    "DataParameter": [("source", 1, OPT, STRING, None), ("batch_size", 4, OPT, UINT32, None),
                      ("rand_skip", 7, OPT, UINT32, None), ("backend", 8, OPT, ENUM, "DB"),
                      ("force_encoded_color", 9, OPT, BOOL, None)],
    "DropoutParameter": [("dropout_ratio", 1, OPT, FLOAT, None)],
    "EltwiseParameter": [("operation", 1, OPT, ENUM, "EltwiseOp"), ("coeff", 2, REP, FLOAT, None)],
    "HDF5DataParameter": [("source", 1, OPT, STRING, None), ("batch_size", 2, OPT, UINT32, None)],
    "ImageDataParameter": [("source", 1, OPT, STRING, None), ("batch_size", 4, OPT, UINT32, None),
                           ("shuffle", 8, OPT, BOOL, None), ("new_height", 9, OPT, UINT32, None),
                           ("new_width", 10, OPT, UINT32, None), ("is_color", 11, OPT, BOOL, None),
                           ("root_folder", 12, OPT, STRING, None)],
    "InnerProductParameter": [("num_output", 1, OPT, UINT32, None),
                              ("bias_term", 2, OPT, BOOL, None),
                              ("weight_filler", 3, OPT, MSG, "FillerParameter"),
                              ("bias_filler", 4, OPT, MSG, "FillerParameter"),
                              ("axis", 5, OPT, INT32, None), ("transpose", 6, OPT, BOOL, None)],
    "LRNParameter": [("local_size", 1, OPT, UINT32, None), ("alpha", 2, OPT, FLOAT, None),
                     ("beta", 3, OPT, FLOAT, None), ("norm_region", 4, OPT, ENUM, "NormRegion"),
                     ("k", 5, OPT, FLOAT, None)],
    "PoolingParameter": [("pool", 1, OPT, ENUM, "PoolMethod"),
                         ("kernel_size", 2, OPT, UINT32, None),
                         ("stride", 3, OPT, UINT32, None), ("pad", 4, OPT, UINT32, None),
                         ("kernel_h", 5, OPT, UINT32, None), ("kernel_w", 6, OPT, UINT32, None),
                         ("stride_h", 7, OPT, UINT32, None), ("stride_w", 8, OPT, UINT32, None),
                         ("pad_h", 9, OPT, UINT32, None), ("pad_w", 10, OPT, UINT32, None),
                         ("global_pooling", 12, OPT, BOOL, None),
                         ("round_mode", 13, OPT, ENUM, "RoundMode")],
    "PowerParameter": [("power", 1, OPT, FLOAT, None), ("scale", 2, OPT, FLOAT, None),
                       ("shift", 3, OPT, FLOAT, None)],
    "ReLUParameter": [("negative_slope", 1, OPT, FLOAT, None)],
    "SoftmaxParameter": [("axis", 2, OPT, INT32, None)],
    "SliceParameter": [("slice_point", 2, REP, UINT32, None), ("axis", 3, OPT, INT32, None)],
    "PReLUParameter": [("filler", 1, OPT, MSG, "FillerParameter"),
                       ("channel_shared", 2, OPT, BOOL, None)],
    "ReshapeParameter": [("shape", 1, OPT, MSG, "BlobShape"), ("axis", 2, OPT, INT32, None),
                         ("num_axes", 3, OPT, INT32, None)],
    "FlattenParameter": [("axis", 1, OPT, INT32, None), ("end_axis", 2, OPT, INT32, None)],
    "BatchNormParameter": [("use_global_stats", 1, OPT, BOOL, None),
                           ("moving_average_fraction", 2, OPT, FLOAT, None),
                           ("eps", 3, OPT, FLOAT, None)],
    "ELUParameter": [("alpha", 1, OPT, FLOAT, None)],
    "BiasParameter": [("axis", 1, OPT, INT32, None), ("num_axes", 2, OPT, INT32, None),
                      ("filler", 3, OPT, MSG, "FillerParameter")],
    "ScaleParameter": [("axis", 1, OPT, INT32, None), ("num_axes", 2, OPT, INT32, None),
                       ("filler", 3, OPT, MSG, "FillerParameter"),
                       ("bias_term", 4, OPT, BOOL, None),
                       ("bias_filler", 5, OPT, MSG, "FillerParameter")],
    "InputParameter": [("shape", 1, REP, MSG, "BlobShape")],
}
PACKED = {("BlobShape", "dim"), ("BlobProto", "data")}


@functools.cache
def messages() -> dict:
    """{message name: class} of the caffe.proto subset."""
    proto = descriptor_pb2.FileDescriptorProto(name="caffe_subset.proto", package="caffe",
                                               syntax="proto2")
    scopes = {None: proto}
    for message, fields in SCHEMA.items():
        m = scopes[message] = proto.message_type.add(name=message)
        for name, number, label, kind, type_name in fields:
            f = m.field.add(name=name, number=number, label=label, type=kind)
            if type_name in ENUMS and ENUMS[type_name][0]:
                f.type_name = f".caffe.{ENUMS[type_name][0]}.{type_name}"
            elif type_name:
                f.type_name = f".caffe.{type_name}"
            if (message, name) in PACKED:
                f.options.packed = True
    for name, (owner, values) in ENUMS.items():
        e = scopes[owner].enum_type.add(name=name)
        for number, value in enumerate(values):
            e.value.add(name=value, number=number)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"caffe.{name}"))
            for name in SCHEMA}


def parse_net(text: str):
    """A prototxt through protobuf's own text parser (raises ParseError on any bad field)."""
    return text_format.Parse(text, messages()["NetParameter"]())


def parse_caffemodel(data: bytes):
    """A binary caffemodel through protobuf's own decoder."""
    return messages()["NetParameter"].FromString(data)
