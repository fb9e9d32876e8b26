"""Decoding one image file, with an error that names the file: what the loaders and the image cache share."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, UnidentifiedImageError

from noisymlt.errors import NoisyMLTError


def load_image(path: Path) -> Image.Image:
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError as exc:
        raise NoisyMLTError(f"{path}: image file is missing") from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise NoisyMLTError(f"{path}: corrupt or unreadable image ({exc})") from exc
