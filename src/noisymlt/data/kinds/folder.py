"""Kind ``folder``: a user's own multi-label data, a folder of images and a labels table (CSV or Parquet), read in
place by `noisymlt parse-folder` (noisymlt.data.folder), which refuses bad rows one line each. Its settings are
the block's ``folder`` (docs/datasets.md, "Add your own data")."""

from __future__ import annotations

from noisymlt.data.kinds.base import DatasetKind, register_kind
from noisymlt.data.userpaths import ImageFolder

FOLDER_SCHEMA = {
    "description": "a folder of images and a labels table (noisymlt.data.folder)",
    "type": "object",
    "additionalProperties": False,
    "required": ["root", "labels"],
    "properties": {
        "root": {"type": "string", "minLength": 1, "description": "the dataset's folder (a DVC dependency as a whole)"},
        "labels": {"type": "string", "minLength": 1, "description": "labels table under root: .csv or .parquet"},
        "images": {"type": "string", "minLength": 1, "description": "image folder under root (default: images)"},
        "image_column": {"type": "string", "description": "column of image paths, relative to images (default: image)"},
        "id_column": {"type": "string", "description": "column of image ids (default: the path without extension)"},
        "labels_column": {"type": "string", "description": "one column listing class names (else one 0/1 column a class)"},
        "separator": {"type": "string", "minLength": 1, "description": "between class names in labels_column (default: a space)"},
        "classes": {"type": "array", "items": {"type": "string", "minLength": 1, "pattern": "^[^,]+$"}, "minItems": 1,
                    "description": "the class names in order, without commas (default: the table's)"},
        "split_column": {"type": "string", "description": "column of train/test: the user's test split"},
        "test_labels": {"type": "string", "description": "a second table under root with the test images"},
        "test_fraction": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1,
                          "description": "drawn test split: its share of the images, stratified (default 0.2)"},
        "split_seed": {"type": "integer", "minimum": 0, "description": "seed of the drawn test split (default 0)"},
    },
}
TEST_SOURCES = ("split_column", "test_labels", "test_fraction")  # where the test part comes from: one at most
# block key -> parse-folder option; the paths among them are under root
_OPTIONS = {"image_column": "--image-column", "id_column": "--id-column", "labels_column": "--labels-column",
            "separator": "--separator", "split_column": "--split-column", "test_fraction": "--test-fraction",
            "split_seed": "--split-seed"}


@register_kind("folder")
class Folder(DatasetKind):
    options = {"folder": FOLDER_SCHEMA}
    # thresholds: no published values for a user's data: [CL]'s VOC-MLT ones (the base's) unless the block's
    # colearning.thresholds sets them

    def problems(self, block, root):
        opts, found = block["folder"], []
        given = [key for key in TEST_SOURCES if key in opts]
        if len(given) > 1:
            found.append((f"folder.{given[1]}", f"the test part comes from one of {', '.join(given)}, not several"))
        if "split_seed" in opts and given and given[0] != "test_fraction":
            found.append(("folder.split_seed", f"seeds a drawn test part only (test_fraction), not one from "
                                               f"{given[0]}"))
        if root is None:
            return found
        base = root / opts["root"]
        if not base.is_dir():
            return found + [("folder.root", f"{opts['root']}: no such folder in the project ({root})")]
        # the files sit under root, which DVC tracks as a whole: one outside it would be read untracked
        inside = ImageFolder(base, f"the dataset's root {opts['root']}", "path")
        for key, folder in (("labels", False), ("images", True), ("test_labels", False)):
            if key not in opts and key != "images":
                continue
            name = opts.get(key, "images")
            file, problem = inside.locate(name)
            if problem is None and not (file.is_dir() if folder else file.is_file()):
                problem = f"{name}: no such {'folder' if folder else 'file'} under {opts['root']}"
            if problem:
                found.append((f"folder.{key}", problem))
        return found

    def raw_dir(self, block, raw_root):
        return block["folder"]["root"].rstrip("/")

    def raw_marker(self, block, raw):
        return f"{raw}/{block['folder']['labels']}"

    def parse_argv(self, block, raw, part, out):
        opts = block["folder"]
        argv = ["parse-folder", "--labels", f"{raw}/{opts['labels']}", "--images", self.image_root(block, raw, part, ""),
                "--part", part, "--out", out]
        argv += [a for key, flag in _OPTIONS.items() if key in opts for a in (flag, str(opts[key]))]
        if "classes" in opts:
            argv += ["--classes", ",".join(opts["classes"])]
        if "test_labels" in opts:
            argv += ["--test-labels", f"{raw}/{opts['test_labels']}"]
        return argv

    def image_root(self, block, raw, part, fetched):
        return f"{raw}/{block['folder'].get('images', 'images')}"
