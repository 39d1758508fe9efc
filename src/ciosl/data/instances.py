"""Object-instance streams from real still images: clusters as instances, walks as videos.

The paper's temporal orderings (instance, class-instance) come from iCubWorld 1.0: a few
objects per class, each filmed as a video, so that consecutive frames are near-duplicates and an
object's frames fill a small region of the class. ``fashion-mnist-video`` imitates that by
rendering 30 still images as videos, but through a pretrained extractor its frames are so close
to their source that every learner reaches the offline learner. This construction keeps real,
distinct images instead:

1. Per class, the training images are embedded by a PCA of their pixels (``PCA_DIM``
   components, fitted on that class) and split by k-means into ``n_instances`` clusters:
   groups of visually similar images, the "object instances".
2. Each instance keeps the ``n_frames`` images nearest to its cluster's centre (all of them
   when the cluster is smaller): the instance's core, a compact set like an object's views.
3. Its "video" is a nearest-neighbour walk through those images in PCA space, starting at the
   image farthest from the centre: each next frame is the nearest image not yet shown, so
   consecutive frames resemble each other, as a camera's do.
4. The test split is the dataset's own test split, untouched: the learner must generalise from
   a few instances to the whole class, as iCubWorld's learners do to new sequences.

Everything is deterministic (``INSTANCE_SEED``); the version, seed, sizes and chosen source
indices are in the fingerprint, hence in the feature-cache key.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ciosl.data.types import ArrayImages, RawDataset

INSTANCE_SEED = 20261125
INSTANCE_VERSION = "v1"  # bump when the construction changes: it is part of the fingerprint
PCA_DIM = 32


def _pca(x: np.ndarray, dim: int) -> np.ndarray:
    """(n, p) -> (n, min(dim, p)) coordinates on the top principal axes (eigh of the scatter;
    an axis's sign is arbitrary, which changes no distance)."""
    xc = x - x.mean(0)
    _, vecs = np.linalg.eigh(xc.T @ xc)  # ascending eigenvalues
    return xc @ vecs[:, ::-1][:, :dim]


def nearest_neighbour_walk(points: np.ndarray, start: int) -> np.ndarray:
    """Order ``points`` (n, d) by a greedy walk from ``start``: always the nearest unvisited."""
    n = len(points)
    d2 = ((points[:, None, :] - points[None, :, :]) ** 2).sum(-1)  # (n, n)
    order = np.empty(n, np.int64)
    visited = np.zeros(n, bool)
    cur = start
    for t in range(n):
        order[t], visited[cur] = cur, True
        if t + 1 < n:
            cur = int(np.argmin(np.where(visited, np.inf, d2[cur])))
    return order


def split_class(x: np.ndarray, n_instances: int, n_frames: int | None, seed: int) -> list[np.ndarray]:
    """Indices into ``x`` (n, p) of each instance's frames, in walk order (steps 1-3 above)."""
    from sklearn.cluster import KMeans

    z = _pca(x.astype(np.float64), PCA_DIM)  # (n, k)
    km = KMeans(n_clusters=n_instances, n_init=3, random_state=seed).fit(z)
    clusters = []
    for j in range(n_instances):
        members = np.flatnonzero(km.labels_ == j)
        dist = np.linalg.norm(z[members] - km.cluster_centers_[j], axis=1)
        keep = np.argsort(dist, kind="stable")[:n_frames]  # the core, nearest to the centre
        members, dist = members[keep], dist[keep]
        walk = nearest_neighbour_walk(z[members], start=int(np.argmax(dist)))
        clusters.append(members[walk])
    clusters.sort(key=lambda m: int(m.min()))  # k-means' label order is arbitrary
    return clusters


def make_instance_dataset(
    name: str,
    source: RawDataset,
    *,
    n_instances: int = 3,
    n_frames: int | None = 200,
    seed: int = INSTANCE_SEED,
) -> RawDataset:
    """The instance stream of an image dataset (``source``: uint8 (n, H, W) train / test).

    Train frames are stored class-major, instance after instance, in walk order;
    ``train_instance`` is ``class * n_instances + j`` and ``train_frame`` the position in the
    walk. ``meta['source_indices']`` maps each frame to its image in the source train split.
    """
    images = source.train_x.images  # type: ignore[union-attr]
    labels = np.asarray(source.train_y)
    chosen, inst, frame = [], [], []
    for c in range(len(source.class_names)):
        idx = np.flatnonzero(labels == c)
        x = images[idx].reshape(len(idx), -1).astype(np.float32) / 255.0  # (n_c, p)
        for j, members in enumerate(split_class(x, n_instances, n_frames, seed + c)):
            chosen.append(idx[members])
            inst.append(np.full(len(members), c * n_instances + j, np.int64))
            frame.append(np.arange(len(members), dtype=np.int64))
    src_idx = np.concatenate(chosen)
    fp = hashlib.sha256(
        f"{name}|{INSTANCE_VERSION}|seed={seed}|k={n_instances}|n={n_frames}|"
        f"{source.fingerprint}|".encode())
    fp.update(src_idx.tobytes())
    return RawDataset(
        name=name,
        kind="images",
        train_x=ArrayImages(images[src_idx]),
        train_y=labels[src_idx].astype(np.int64),
        test_x=source.test_x,
        test_y=np.asarray(source.test_y, dtype=np.int64),
        class_names=tuple(source.class_names),
        fingerprint=fp.hexdigest(),
        train_instance=np.concatenate(inst),
        train_frame=np.concatenate(frame),
        meta={"source_indices": src_idx, "seed": seed, "source": source.name},
    )
