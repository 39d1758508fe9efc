"""The value types that flow through the pipeline: raw datasets, their protocol, feature sets.

Data flow: Dataset (images or features) -> FeatureExtractor -> FeatureSet -> Ordering -> Learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ImageSource(Protocol):
    """Images addressable by index, loaded lazily (an ImageNet folder does not fit in memory).

    ``get_batch(idx)`` returns either a uint8 array (b, H, W) / (b, H, W, 3) or, when the
    images differ in size, a list of such arrays (H, W) / (H, W, 3).
    """

    def __len__(self) -> int: ...

    def get_batch(self, idx: Sequence[int] | np.ndarray) -> np.ndarray | list[np.ndarray]: ...


class ArrayImages:
    """An in-memory uint8 image array as an ImageSource."""

    def __init__(self, images: np.ndarray):
        self.images = images  # (n, H, W) or (n, H, W, 3), uint8

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, idx) -> np.ndarray:
        return self.images[np.asarray(idx, dtype=np.int64)]


@dataclass(frozen=True)
class DatasetSpec:
    """What the benchmark protocol needs to know about a dataset (docs/design.md's table)."""

    name: str
    description: str
    base_fraction: float  # fraction of the training set used for base init (iid, instance)
    classes_per_step: int  # classes in base init and in each class step (class orderings)
    buffer: int  # replay buffer capacity
    orderings: tuple[str, ...]  # orderings this dataset supports
    default_extractor: str  # "pixels" or "mobilenet_v2"
    offline_epochs: int  # offline reference learner (paper Table 5)
    offline_batch_size: int
    how_to_get: str  # one line telling a user how to make the data available
    # base initialisation of every learner that trains its head offline on the base set
    # (``base_epochs`` / ``base_batch_size`` settings, see ``Learner.protocol_defaults``): the
    # paper's Table 5 gives one offline recipe per dataset, "training parameters used for CIOSL
    # and the offline model", and base init is CIOSL's only offline training; so by default
    # base init trains like the dataset's offline learner.
    base_epochs: int
    base_batch_size: int
    # the instance ordering's round-robin chunk, in frames (iCubWorld's protocol: 50); None
    # plays each video whole before the next (Stream-51's instance ordering)
    chunk: int | None = 50


@dataclass(frozen=True)
class RawDataset:
    """A loaded dataset. Labels are int64 in [0, n_classes); ``class_names[k]`` names label k.

    kind == "images": ``train_x``/``test_x`` are ImageSources.
    kind == "features": ``train_x``/``test_x`` are float32 arrays (n, d) used as they are.
    ``train_instance`` / ``train_frame`` exist for temporally ordered datasets (object instance
    id and frame index inside that instance's video); None otherwise.
    ``fingerprint`` identifies the content (feeds the feature cache key).
    """

    name: str
    kind: str
    train_x: ImageSource | np.ndarray
    train_y: np.ndarray
    test_x: ImageSource | np.ndarray
    test_y: np.ndarray
    class_names: tuple[str, ...]
    fingerprint: str
    train_instance: np.ndarray | None = None
    train_frame: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        return len(self.class_names)


@dataclass(frozen=True)
class FeatureSet:
    """Embeddings G(x) of a dataset's train and test splits, ready for the learners."""

    dataset: str
    extractor: str
    train_z: np.ndarray  # (n, d) float32
    train_y: np.ndarray  # (n,) int64
    test_z: np.ndarray  # (m, d) float32
    test_y: np.ndarray  # (m,) int64
    class_names: tuple[str, ...]
    key: str  # cache key: dataset fingerprint + extractor + weights hash
    train_instance: np.ndarray | None = None  # (n,) int64
    train_frame: np.ndarray | None = None  # (n,) int64

    @property
    def dim(self) -> int:
        return int(self.train_z.shape[1])

    @property
    def n_classes(self) -> int:
        return len(self.class_names)
