"""The dataset registry: each dataset's protocol (``DATASETS``, docs/design.md's table), where data
live (``data_root()``) and ``get_spec(name)``, which also accepts ``features:PATH`` for a user's
.npz of precomputed features and ``folder:DIR`` for a user's image folder (``data.folder``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ciosl.data.archive import check_zip
from ciosl.data.folder import FOLDER_PREFIX, check_folder, layout
from ciosl.data.types import DatasetSpec
from ciosl.errors import echo
from ciosl.fileio import kind_of

FEATURES_PREFIX = "features:"

_IID, _ALL = ("iid", "class_iid"), ("iid", "class_iid", "instance", "class_instance")
_CORE50 = (*_ALL, "ni", "nc", "nic")  # and CORe50's official scenarios (data/streams.py)
_WHERE = "$CIOSL_DATA (default ~/.cache/ciosl/data)"
_FROM_FASHION = ("generated from fashion-mnist: make fashion-mnist available (apt-get install "
                 f"dataset-fashion-mnist, or the 4 IDX files in {_WHERE}/fashion-mnist)")


# DatasetSpec(name, description, base_fraction, classes_per_step, buffer, orderings,
#             default_extractor, offline_epochs, offline_batch_size, how_to_get,
#             base_epochs, base_batch_size)
# Base init trains like the dataset's offline learner: the paper's Table 5 lists one "offline"
# batch size and epoch count per dataset as the training parameters of CIOSL and the offline
# model, and base init is CIOSL's offline training. The stand-ins take the recipe of the
# dataset they stand in for (fashion-mnist: CIFAR-10's; the video datasets: iCubWorld's).
DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec(
        "digits", "scikit-learn 8x8 handwritten digits, 10 classes (1437 train / 360 test)",
        0.10, 2, 100, _IID, "pixels", 30, 16,
        "ships with scikit-learn: always available", base_epochs=30, base_batch_size=16),
    # Offline reference: 50 epochs (as CIFAR) x 5 testing events x 10 runs is too slow on 2
    # cores: 10 epochs. Base init (once per run) keeps CIFAR-10's 50 epochs of 128.
    DatasetSpec(
        "fashion-mnist", "Fashion-MNIST, 28x28 grey clothes, 10 classes (60000 / 10000)",
        0.02, 2, 1000, _IID, "pixels", 10, 128,
        "apt-get install dataset-fashion-mnist, or put the 4 IDX files in "
        f"{_WHERE}/fashion-mnist, or run `ciosl features --dataset fashion-mnist --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "cifar10", "CIFAR-10, 32x32 colour, 10 classes (50000 / 10000)",
        0.02, 2, 1000, _IID, "mobilenet_v2", 50, 128,
        "get cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) and "
        f"unpack it in {_WHERE}/cifar10, or run `ciosl features --dataset cifar10 --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "cifar100", "CIFAR-100, 32x32 colour, 100 fine classes (50000 / 10000)",
        0.10, 10, 1000, _IID, "mobilenet_v2", 50, 128,
        "get cifar-100-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) and "
        f"unpack it in {_WHERE}/cifar100, or run `ciosl features --dataset cifar100 --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "imagenet100", "ImageNet-100: the paper's 100 ILSVRC-2012 classes (val as test)",
        0.10, 10, 1000, _IID, "mobilenet_v2", 100, 256,
        "put ILSVRC-2012 train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (val sorted into wnid "
        f"folders) in {_WHERE}/imagenet100; only the paper's 100 wnids are used",
        base_epochs=100, base_batch_size=256),
    DatasetSpec(
        "icubworld1", "iCubWorld 1.0: 10 classes x 3 object instances, video frames",
        0.10, 2, 180, _ALL, "mobilenet_v2", 30, 16,
        "get iCubWorld 1.0 (https://robotology.github.io/iCubWorld/) and arrange it as "
        f"{_WHERE}/icubworld1/{{train,test}}/<class>/<instance>/<frames>",
        base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "digits-video", "object streams from digits: 10 classes x 3 instances x 200/67 "
        "frames of smooth rotation/scale/shift/brightness (16x16)",
        0.10, 2, 180, _ALL, "pixels", 30, 16, "generated from digits: always available",
        base_epochs=30, base_batch_size=16),
    # the same streams at Fashion-MNIST's size (784 pixels): a development stream whose input
    # width, priors (fan_in) and border pixels are those of the report streams
    DatasetSpec(
        "digits-video-28", "object streams from digits at 28x28: 10 classes x 3 instances x "
        "200/67 frames of smooth rotation/scale/shift/brightness",
        0.10, 2, 180, _ALL, "pixels", 30, 16, "generated from digits: always available",
        base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "fashion-mnist-video", "object streams from Fashion-MNIST: 10 classes x 3 instances "
        "x 200/67 frames of smooth rotation/scale/shift/brightness (28x28)",
        0.10, 2, 180, _ALL, "pixels", 30, 16,
        _FROM_FASHION,
        base_epochs=30, base_batch_size=16),
    # real images as object instances (data/instances.py): k-means clusters of each class, a
    # nearest-neighbour walk through each cluster's core, the dataset's own test split; the
    # temporal streams for pretrained features (the -video ones saturate there)
    DatasetSpec(
        "digits-instances", "object-instance streams of real digits: 10 classes x 3 k-means "
        "instances x <= 40 frames in nearest-neighbour order; digits' test split",
        0.10, 2, 34, _ALL, "efficientnet_lite0", 30, 16,  # buffer: iCubWorld's 180 / 6000 frames
        "generated from digits: always available", base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "fashion-mnist-instances", "object-instance streams of real Fashion-MNIST images: 10 "
        "classes x 3 k-means instances x 200 frames in nearest-neighbour order; the 10k test split",
        0.10, 2, 180, _ALL, "efficientnet_lite0", 30, 16,
        _FROM_FASHION,
        base_epochs=30, base_batch_size=16),
    # the field's streaming benchmarks, from their official files (data/streams.py); neither
    # downloads: both sit behind their authors' links
    DatasetSpec(
        "stream51", "Stream-51: 51 classes of temporally ordered video frames cropped to their "
        "boxes (1.1x), novel test images for the open-set protocol",
        0.10, 10, 1000, _ALL, "mobilenet_v2", 10, 256,
        "get Stream-51 (https://tyler-hayes.github.io/stream51, Stream-51.zip) and unpack it in "
        f"{_WHERE}/stream51 (Stream-51_meta_train.json, Stream-51_meta_test.json and the "
        "frames)", base_epochs=10, base_batch_size=256, chunk=None),
    DatasetSpec(
        "core50", "CORe50: 50 objects (10 categories) in 11 sessions of 128x128 video frames; "
        "sessions 3, 7, 10 as the test set",
        0.10, 10, 1000, _CORE50, "mobilenet_v2", 10, 256,
        "get core50_128x128.zip, paths.pkl, LUP.pkl and labels.pkl "
        f"(https://vlomonaco.github.io/core50) into {_WHERE}/core50",
        base_epochs=10, base_batch_size=256),
    DatasetSpec(
        "core50-cat", "CORe50 with its 10 categories as the classes (5 objects each)",
        0.10, 2, 1000, _CORE50, "mobilenet_v2", 10, 256,
        "as core50: core50_128x128.zip, paths.pkl, LUP.pkl and labels.pkl "
        f"(https://vlomonaco.github.io/core50) into {_WHERE}/core50",
        base_epochs=10, base_batch_size=256),
)}


def data_root() -> Path:
    """Where datasets live: ``$CIOSL_DATA`` if set, else ``~/.cache/ciosl/data``."""
    env = os.environ.get("CIOSL_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ciosl" / "data"


def _check_feature_file(name: str, path: Path) -> None:
    """A ``features:PATH`` that is missing, or is a folder, a FIFO or a device: one line
    saying which (never a read that blocks)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        raise FileNotFoundError(f"{name}: no such feature file {path}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{name}: {path} is not a regular file ({kind_of(mode)})")


def get_spec(name: str) -> DatasetSpec:
    """The protocol of a registered dataset or of a ``features:PATH`` file."""
    if name.startswith(FEATURES_PREFIX):
        path = Path(name[len(FEATURES_PREFIX):]).expanduser()
        _check_feature_file(name, path)
        names = {m.filename for m in check_zip(path, "features .npz", verify=False)}
        temporal = {"train_instance.npy", "train_frame.npy"} <= names
        return DatasetSpec(name, f"precomputed features from {path}", 0.10, 2, 1000,
                         _ALL if temporal else _IID, "none", 50, 128,
                         "a .npz with train_z, train_y, test_z, test_y",
                         base_epochs=50, base_batch_size=128)
    if name.startswith(FOLDER_PREFIX):
        path = Path(name[len(FOLDER_PREFIX):]).expanduser()
        check_folder(name, path)
        split, temporal = layout(path)
        return DatasetSpec(name, f"images in {path} ({'train/ and test/' if split else 'split'}"
                           f"{', instance folders' if temporal else ''})", 0.10, 2, 1000,
                           _ALL if temporal else _IID, "efficientnet_lite0", 50, 128,
                           "a folder DIR/{train,test}/<class>/[<instance>/]<images> or "
                           "DIR/<class>/[<instance>/]<images> (docs/datasets.md)",
                           base_epochs=50, base_batch_size=128)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {echo(name)}; valid choices: "
                         f"{', '.join(DATASETS)}, {FEATURES_PREFIX}PATH, {FOLDER_PREFIX}DIR")
    return DATASETS[name]
