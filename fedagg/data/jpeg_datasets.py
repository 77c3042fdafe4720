"""Datasets stored as JPEG folders: Tiny-ImageNet (downloaded when missing) and ImageNet (never downloaded).

Decoded once, at the requested size, into a uint8 tensor file in the cache
(fedagg.data.image_folders), then loaded like every other dataset as a `DatasetBundle`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence

from fedagg.data.datasets import DatasetBundle, _not_found, _require
from fedagg.data.files import DataError, cache_folder, data_root
from fedagg.data.image_folders import list_class_folder, load_or_decode, read_annotated_folder

log = logging.getLogger(__name__)


def _folder_bundle(name, folder, splits, num_classes, image_size, mean, std, augment) -> DatasetBundle:
    key = hashlib.sha1(str(folder).encode()).hexdigest()[:12]  # one cache per folder and size
    try:
        cache_file = cache_folder() / f"{name}-{image_size}px-{key}.pt"
    except DataError as err:  # the cache saves decoding time; the run works without it
        log.warning("%s; decoding %s without a cache (again on every run)", err, name)
        cache_file = None
    t = load_or_decode(cache_file, splits, image_size)
    return DatasetBundle(name, t["train_x"], t["train_y"], t["test_x"], t["test_y"], num_classes, mean, std, augment)


def tinyimagenet(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
                 image_size: int = 64, download: bool = False,
                 default_model: str | None = None) -> DatasetBundle:
    """Tiny-ImageNet (200 classes, 64x64) from `root/tiny-imagenet-200/`, its official layout.

    The labelled val split serves as the test set (the official test split has no labels);
    class index = position of the wnid in sorted wnids.txt.
    """
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    folder = data_root(root) / "tiny-imagenet-200"
    expected = ["wnids.txt", "train/<wnid>/images/*.JPEG", "val/images/*.JPEG", "val/val_annotations.txt"]
    how = (
        "download http://cs231n.stanford.edu/tiny-imagenet-200.zip on a machine with network and unzip it "
        f"into {folder.parent} (or set data.root to the folder that holds tiny-imagenet-200/)"
    )
    _require("tinyimagenet", folder, expected, how, check=["wnids.txt", "train", "val/images", "val/val_annotations.txt"],
             download=download)
    wnids = sorted({line.strip() for line in (folder / "wnids.txt").read_text().splitlines() if line.strip()})
    index = {wnid: i for i, wnid in enumerate(wnids)}
    train = list_class_folder(folder / "train", wnids, "images")
    if not train[0]:
        raise _not_found("tinyimagenet", folder, expected, how, "no images under train/<wnid>/images/")
    splits = {"train": train, "test": read_annotated_folder(folder / "val", "val_annotations.txt", index)}
    return _folder_bundle("tinyimagenet", folder, splits, len(wnids), image_size, mean, std, augment)


def imagenet(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
             image_size: int = 64, download: bool = False,
             default_model: str | None = None) -> DatasetBundle:
    """ImageNet from `root/imagenet/{train,val}/<wnid>/*.JPEG` (ImageFolder layout); never downloaded, whatever
    `download` says: its licence asks every user to register.

    Every image is resized (shorter side) and centre-cropped to `image_size`, 64 by default
    because the whole training set must fit in memory as uint8 (1.28M x 3 x 64 x 64 = 16 GB).
    """
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    folder = data_root(root) / "imagenet"
    expected = ["train/<wnid>/*.JPEG", "val/<wnid>/*.JPEG"]
    how = (
        "ImageNet is never downloaded (its licence requires registration): obtain ILSVRC-2012 from "
        "https://image-net.org, extract the training "
        "archives into train/<wnid>/ and sort the validation images into val/<wnid>/ (e.g. with the "
        f"widely used valprep.sh), under {folder}"
    )
    _require("imagenet", folder, expected, how, check=["train", "val"])
    classes = sorted(entry.name for entry in os.scandir(folder / "train") if entry.is_dir())
    unknown = sorted({entry.name for entry in os.scandir(folder / "val") if entry.is_dir()} - set(classes))
    if unknown:
        raise ValueError(f"imagenet: {folder / 'val'} has classes missing from train/: {', '.join(unknown[:5])}")
    splits = {"train": list_class_folder(folder / "train", classes), "test": list_class_folder(folder / "val", classes)}
    for split, sub in (("train", "train"), ("test", "val")):
        if not splits[split][0]:
            raise _not_found("imagenet", folder, expected, how, f"no images under {sub}/<wnid>/")
    return _folder_bundle("imagenet", folder, splits, len(classes), image_size, mean, std, augment)
