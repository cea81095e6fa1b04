"""Training on a Caffe ImageData list of PNG and JPEG files, then `netrun infer` on a PNG, a
folder, a glob, a list file and a database: the same image gets the same prediction through
every door, and the same as its pixels given as an array."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.train.data import make_source
from netrun.train.data.images import encode_image

MODEL = """\
name: TinyImages
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 6, kernel: 5, stride: 2}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 32}
  - {type: relu, name: r2}
  - {type: fc, name: f2, num_output: 10}
loss: {type: softmax_cross_entropy, input: f2, label: label}
metrics: [{type: accuracy, input: f2, label: label}]
"""


def run(*args, code=0):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result


def write_images(folder, data, labels, start=0):
    """PNG for even examples, JPEG (quality 95) for odd ones; returns the list file's lines."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (image, label) in enumerate(zip(data, labels), start):
        fmt = "png" if i % 2 == 0 else "jpg"
        name = f"d{i:04d}_{label}.{fmt}"
        (folder / name).write_bytes(encode_image(image.astype(np.uint8), fmt, quality=95))
        lines.append(f"{folder.name}/{name} {label}")
    return lines


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imagedata")
    digits = make_source({"source": "generated", "dir": str(tmp / "gen"), "train_count": 600,
                          "test_count": 60, "cache": False})
    train, test = digits.train, digits.test
    (tmp / "train.txt").write_text("\n".join(write_images(tmp / "img", train.data, train.label)))
    (tmp / "test.txt").write_text("\n".join(write_images(tmp / "img", test.data, test.label,
                                                         start=len(train.label))))
    (tmp / "tiny.yaml").write_text(MODEL)
    (tmp / "train.yaml").write_text(f"""\
model: tiny.yaml
data: {{source: imagedata, train: train.txt, test: test.txt, is_color: false, shuffle: true,
        batch_size: 20, transform: {{scale: 0.00390625}}}}
solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 90, display: 0, seed: 1,
          test_interval: 90, snapshot: 0}}
output: {tmp / 'run'}
""")
    summary = json.loads(run("train", str(tmp / "train.yaml"), "--json").stdout)
    return tmp, summary


def test_an_imagedata_list_of_png_and_jpeg_files_trains(trained):
    _, summary = trained
    assert summary["iterations"] == 90
    assert summary["test_metrics"]["accuracy"] > 0.5      # 10 classes: chance is 0.1


def same(a, b):
    """Same classes, probabilities equal but for the last bits (batches differ in size)."""
    return ([c for c, _ in a["top_k"]] == [c for c, _ in b["top_k"]]
            and np.allclose([p for _, p in a["top_k"]], [p for _, p in b["top_k"]], atol=1e-6))


def predictions(*args):
    out = json.loads(run("infer", *args, "--json").stdout)
    return {p["input"].split("/")[-1].split("record ")[-1]: p for p in out["predictions"]}, out


def test_infer_on_a_png_a_folder_a_glob_a_list_file_and_a_database(trained):
    tmp, summary = trained
    ckpt = summary["checkpoint"]
    listed, out = predictions(ckpt, str(tmp / "test.txt"))
    assert out["count"] == 60 and abs(out["accuracy"] - summary["test_metrics"]["accuracy"]) < 1e-6
    one = next(name for name in listed if name.endswith(".png"))
    single, _ = predictions(ckpt, str(tmp / "img" / one), "--top-k", "3")
    assert same({"top_k": single[one]["top_k"][:1]}, {"top_k": listed[one]["top_k"]})
    assert len(single[one]["top_k"]) == 3
    folder, out = predictions(ckpt, str(tmp / "img"))
    assert out["count"] == 660 and same(folder[one], listed[one])
    globbed, out = predictions(ckpt, str(tmp / "img" / "d06*.jpg"))
    assert out["count"] == 30 and all(n.endswith(".jpg") for n in globbed)
    for name, p in globbed.items():
        assert same(p, folder[name])
    run("data", "build", str(tmp / "test.txt"), str(tmp / "test_db"), "--gray")
    from_db, out = predictions(ckpt, str(tmp / "test_db"))
    assert out["count"] == 60 and abs(out["accuracy"] - summary["test_metrics"]["accuracy"]) < 1e-6
    assert same(from_db[one], listed[one])          # keys "00000000_img/<file>"


def test_an_image_predicts_as_its_pixels_do_and_scaled_arrays_get_a_warning(trained):
    tmp, summary = trained
    ckpt = summary["checkpoint"]
    from netrun.train.data.images import read_image
    name = sorted(p.name for p in (tmp / "img").glob("*.png"))[0]
    pixels = read_image(tmp / "img" / name, color=False).astype(np.float32)   # 1 x 28 x 28
    np.save(tmp / "one.npy", pixels)                  # one example, not a batch
    from_png, _ = predictions(ckpt, str(tmp / "img" / name))
    from_array = json.loads(run("infer", ckpt, str(tmp / "one.npy"), "--json").stdout)
    assert from_array["count"] == 1
    assert from_array["predictions"][0]["top_k"] == from_png[name]["top_k"]    # both batch 1
    np.save(tmp / "scaled.npy", pixels / 255.0)
    result = run("infer", ckpt, str(tmp / "scaled.npy"))
    assert "training transform multiplies by 0.00390625" in result.stderr
    assert "--raw" in result.stderr


def test_image_input_errors(trained):
    tmp, summary = trained
    ckpt = summary["checkpoint"]
    assert "matches no image files" in run("infer", ckpt, str(tmp / "nothing*.png"), code=2).output
    (tmp / "empty").mkdir(exist_ok=True)
    assert "no images" in run("infer", ckpt, str(tmp / "empty"), code=2).output
    (tmp / "broken.png").write_bytes(b"not a png")
    result = run("infer", ckpt, str(tmp / "broken.png"), code=2)
    assert "broken.png" in result.output and "Traceback" not in result.output


def test_class_names_of_a_folder_source_reach_the_predictions(trained):
    tmp, _ = trained
    lines = (tmp / "test.txt").read_text().split("\n")
    for line in lines:                             # one subfolder per class, named after it
        path, label = line.rsplit(" ", 1)
        folder = tmp / "classes" / f"digit_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / path.split("/")[-1]).write_bytes((tmp / path).read_bytes())
    (tmp / "folder.yaml").write_text(f"""\
model: tiny.yaml
data: {{source: folder, train: classes, test: classes, color: false, batch_size: 10,
        transform: {{scale: 0.00390625}}}}
solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 6, display: 0, seed: 1}}
output: {tmp / 'run_folder'}
""")
    summary = json.loads(run("train", str(tmp / "folder.yaml"), "--json").stdout)
    out = json.loads(run("infer", summary["checkpoint"], str(tmp / "classes"), "--json",
                         "-k", "2").stdout)
    first = out["predictions"][0]
    assert [f"digit_{c}" for c, _ in first["top_k"]] == first["top_k_names"]
    run("infer", summary["checkpoint"], str(tmp / "classes"), "-o", str(tmp / "p.csv"))
    header, row = (tmp / "p.csv").read_text().splitlines()[:2]
    assert header == "index,input,prediction,class,probability"
    assert row.split(",")[3] == f"digit_{row.split(',')[2]}"


def test_a_csv_holds_the_top_k_asked_for(trained):
    tmp, summary = trained
    out = tmp / "k3.csv"
    run("infer", summary["checkpoint"], str(tmp / "test.txt"), "-k", "3", "-o", str(out))
    header, first = out.read_text().splitlines()[:2]
    assert header == ("index,input,prediction1,probability1,prediction2,probability2,"
                      "prediction3,probability3,label")
    cells = first.split(",")
    probabilities = [float(cells[i]) for i in (3, 5, 7)]
    assert probabilities == sorted(probabilities, reverse=True) and len(set(cells[2:8:2])) == 3
