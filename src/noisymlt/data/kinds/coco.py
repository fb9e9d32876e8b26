"""Kind ``coco``: MS-COCO 2017, COCO-MLT's source. The annotations and val2017 (the test set) are downloaded; the
train images are fetched one by one for the long-tail subset only, after the long-tail step."""

from __future__ import annotations

import numpy as np

from noisymlt.data.kinds.base import DatasetKind, register_kind
from noisymlt.errors import NoisyMLTError


@register_kind("coco")
class Coco(DatasetKind):
    train_pool = 118287  # COCO 2017 train
    test_images = 5000  # val2017 (SPEC 1)
    # [DB] appendix: COCO-MLT's clean per-class counts, in category-id order
    published_subset = {
        "images": 1909,
        "counts": [1128, 37, 276, 32, 9, 41, 18, 87, 20, 50, 11, 13, 8, 97, 19, 49, 70, 17, 7, 10, 8, 6, 7, 7,
                   100, 39, 189, 31, 24, 11, 12, 8, 35, 10, 25, 21, 17, 10, 20, 460, 84, 498, 126, 207, 173,
                   366, 39, 35, 44, 36, 29, 25, 14, 45, 16, 73, 585, 153, 164, 44, 624, 25, 200, 137, 70, 89,
                   73, 127, 91, 175, 9, 237, 119, 292, 87, 113, 15, 21, 6, 11]}
    thresholds = {"random": {"alpha": {"head": 0.9}, "beta": {}},
                  "balanced": {"alpha": {"head": 0.9}, "beta": {}}}  # [CL]'s published COCO runs
    class_count = 80
    glove_rows = 80
    fetches_train_images = True

    @property
    def official_list(self):
        from noisymlt.data.longtail import DB_RAW, OfficialList

        # 1,909 COCO 2017 integer image ids, one per line; a text file despite the .pkl name (13,023 bytes)
        return OfficialList(url=f"{DB_RAW}/appendix/coco/longtail2017/img_id.pkl",
                            sha256="f31e853d2c7b69512c62b65ff1db067a49b3ab86a62f685c7da86b7c3dd04768", max_count=1200)

    @property
    def archives(self):
        from noisymlt.data.download import RemoteFile

        # COCO publishes no checksums; these md5s are the values published by torchvision/d2l-style dataset helpers
        # (and many download scripts) for the 2017 release. The zips unpack into annotations/ and val2017/.
        return [RemoteFile("http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
                           "annotations_trainval2017.zip", md5="f4bbac642086de4f52a3fdda2de5fa2c"),
                RemoteFile("http://images.cocodataset.org/zips/val2017.zip", "val2017.zip",
                           md5="442b8da7639aecaf257c1dceb8ba8c80")]

    def raw_argv(self, block, raw, download_args):
        return ["download", "--dataset", self.name, "--root", raw] + download_args

    def parse_argv(self, block, raw, part, out):
        split = "train2017" if part == "train_source" else "val2017"
        return ["parse", "--format", "coco", "--source", f"{raw}/annotations/instances_{split}.json", "--image-dir",
                split, "--out", out]

    def image_root(self, block, raw, part, fetched):
        return fetched if part == "train" else raw

    def train_images_argv(self, block, raw, ids, out, download_args):
        return ["fetch-coco-images", "--annotations", f"{raw}/annotations/instances_train2017.json", "--ids", ids,
                "--out", f"{out}/train2017"] + download_args

    def glove_order(self, classes):
        # ML-GCN's file: rows are the class names sorted alphabetically (its category.json), not the ids
        if len(set(classes)) != len(classes):
            raise NoisyMLTError("GloVe embeddings for coco: duplicate class names")
        alphabetical = {name: row for row, name in enumerate(sorted(classes))}
        return np.array([alphabetical[name] for name in classes], dtype=np.int64)
