"""Kind ``voc``: Pascal VOC, VOC-MLT's source. Downloaded (VOC2012 trainval is the pool, VOC2007 test the test
set); with a ``toy`` block, a stand-in drawn by the toy generator in VOC's own layout under VOC's class names
(smoke runs of the paper's configuration), in its own raw folder so that it never takes VOC's place."""

from __future__ import annotations

import numpy as np

from noisymlt.data.classes import VOC_CLASSES
from noisymlt.data.kinds.base import DatasetKind, register_kind
from noisymlt.data.kinds.toy import TOY_SCHEMA, make_toy_argv, toy_pool
from noisymlt.errors import NoisyMLTError


@register_kind("voc")
class Voc(DatasetKind):
    options = {"toy": TOY_SCHEMA}
    class_count = len(VOC_CLASSES)
    train_pool = 11540  # VOC2012 trainval
    test_images = 4952  # VOC2007 test (SPEC 1)
    # [DB] appendix: VOC-MLT's clean per-class counts, in VOC class order
    published_subset = {"images": 1142,
                        "counts": [6, 34, 8, 14, 154, 17, 249, 29, 479, 4, 240, 48, 11, 20, 775, 100, 5, 82, 7, 64]}
    # thresholds: [CL]'s VOC-MLT values, the base's
    glove_rows = 20

    @property
    def official_list(self):
        from noisymlt.data.longtail import DB_RAW, OfficialList

        # 1,142 VOC2012 ids like ``2008_000023``, one per line (13,704 bytes)
        return OfficialList(url=f"{DB_RAW}/appendix/VOCdevkit/longtail2012/img_id.txt",
                            sha256="6e49185d5421236718f7393e952f5790e5c0cfeb1694892b1b971f59725d5ebc", max_count=800)

    @property
    def archives(self):
        from noisymlt.data.download import RemoteFile

        # md5s as given by the dataset authors (SPEC section 1); the tars unpack into VOCdevkit/VOC20xx/
        return [RemoteFile("http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar",
                           "VOCtrainval_11-May-2012.tar", md5="6cd6e144f989b92b3379bac3b3de84fd"),
                RemoteFile("http://host.robots.ox.ac.uk/pascal/VOC/voc2007/VOCtest_06-Nov-2007.tar",
                           "VOCtest_06-Nov-2007.tar", md5="b6e924de25625d8de591ea690078ad9f")]

    def raw_folder(self, block):
        return f"{self.name}_toy" if "toy" in block else self.name

    def raw_argv(self, block, raw, download_args):
        if "toy" in block:
            return make_toy_argv(raw, block["toy"], ["--layout", "voc"])
        return ["download", "--dataset", self.name, "--root", raw] + download_args

    def parse_argv(self, block, raw, part, out):
        year, image_set = ("VOC2012", "trainval") if part == "train_source" else ("VOC2007", "test")
        return ["parse", "--format", "voc", "--source", f"{raw}/VOCdevkit/{year}", "--image-set", image_set,
                "--out", out]

    def image_root(self, block, raw, part, fetched):
        return f"{raw}/VOCdevkit/{'VOC2012' if part == 'train' else 'VOC2007'}"

    def training_images_bound(self, block, longtail_max):
        pool = toy_pool(block["toy"]) if "toy" in block else self.train_pool
        return min(pool, self.class_count * longtail_max)

    def glove_order(self, classes):
        # ML-GCN's file: the 20 VOC classes in VOC order (alphabetical)
        if list(classes) != list(VOC_CLASSES):
            raise NoisyMLTError(f"GloVe embeddings for voc expect the 20 VOC classes in VOC order, got {classes}")
        return np.arange(len(classes))
