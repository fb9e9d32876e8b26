"""Kind ``toy``: the embedded synthetic set (noisymlt.data.toy), generated offline in VOC's folder layout under its
own glyph class names. Its settings (``datasets.NAME.toy``) also draw a VOC stand-in (kind voc, smoke runs)."""

from __future__ import annotations

from noisymlt.data.kinds.base import DatasetKind, register_kind

TOY_SCHEMA = {
    "description": "the toy generator's settings: kind toy, or kind voc for a stand-in in VOC's layout (smoke runs)",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "seed": {"type": "integer", "minimum": 0},
        "n_trainval": {"$ref": "#/definitions/posint"},
        "n_test": {"$ref": "#/definitions/posint"},
        "size": {"type": "integer", "minimum": 16, "maximum": 512},
        "scenes": {"description": "label model (noisymlt.data.toy_scenes): voc = fit to VOC2012 trainval, its subset "
                                  "has VOC-MLT's structure; glyph = the first toy's hand-made scenes",
                   "enum": ["glyph", "voc"]},
    },
}


def make_toy_argv(raw: str, opts: dict, layout: list[str]) -> list[str]:
    """`noisymlt make-toy` into ``raw`` with the block's toy settings, each as its option."""
    return ["make-toy", "--out", raw, *layout] + [a for k, v in opts.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def toy_pool(opts: dict) -> int:
    """The trainval images the generator draws (its label model's default unless n_trainval is set)."""
    from noisymlt.data.toy import DEFAULT_MODEL
    from noisymlt.data.toy_scenes import DEFAULT_SIZES

    return int(opts.get("n_trainval") or DEFAULT_SIZES[opts.get("scenes", DEFAULT_MODEL)][0])


@register_kind("toy")
class Toy(DatasetKind):
    options = {"toy": TOY_SCHEMA}
    class_count = 20  # noisymlt.data.toy.TOY_CLASSES
    glove_rows = None  # glyph classes have no word vectors: ML-GCN gets pseudo-embeddings
    # thresholds: [CL]'s VOC-MLT values, the base's (the toy mimics VOC-MLT)

    def raw_marker(self, block, raw):
        return f"{raw}/VOCdevkit/TOY/toy_manifest.json"

    def raw_argv(self, block, raw, download_args):
        return make_toy_argv(raw, block.get("toy", {}), [])

    def parse_argv(self, block, raw, part, out):
        image_set = "trainval" if part == "train_source" else "test"
        return ["parse", "--format", "voc", "--source", f"{raw}/VOCdevkit/TOY", "--image-set", image_set, "--out", out]

    def image_root(self, block, raw, part, fetched):
        return f"{raw}/VOCdevkit/TOY"

    def training_images_bound(self, block, longtail_max):
        return min(toy_pool(block.get("toy", {})), self.class_count * longtail_max)
