"""Decoding one image file as the 8-bit RGB picture every step takes (training's loaders, the image cache, a
finished run's predict, export and suspects), or one line naming the file and what is wrong with it.

How a file becomes RGB, the conversions stated:

- 8-bit RGB, grey (L), bilevel (1), palette (P), YCbCr and CMYK: PIL's conversion to RGB; CMYK by PIL's formula,
  without an embedded ICC profile;
- with an alpha channel (RGBA, LA, PA, a palette's transparent entry): the alpha is dropped, the colours kept as
  stored (not composited on any background);
- 16-bit grey (PIL modes I;16*): scaled to 8 bits, ``round(v * 255 / 65535)``, then grey to RGB. (PIL's own
  conversion clips every value above 255 to white: a silent wrong picture.) A 16-bit-per-channel colour PNG is
  decoded to 8 bits by PIL itself;
- an animated image (GIF, APNG, WebP): its first frame;
- refused in one line: 32-bit integer or float pixels (modes I and F: no stated scale to 8 bits), a header that
  declares more pixels than PIL's limit (``PIL.Image.MAX_IMAGE_PIXELS``, a decompression bomb: refused before any
  pixel is decoded), and a missing, empty, truncated or otherwise undecodable file.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from noisymlt.errors import NoisyMLTError, cause

SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def load_image(path: str | Path) -> Image.Image:
    """PATH decoded as an 8-bit RGB PIL image by the conversions of the module docstring, or one line naming it."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. PIL's palette-transparency advice: the conversion is stated
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return _to_rgb(img, path)
    except NoisyMLTError:
        raise
    except FileNotFoundError:
        raise NoisyMLTError(f"{path}: image file is missing") from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise NoisyMLTError(f"{path}: refused: its header declares more pixels than the limit of "
                            f"{Image.MAX_IMAGE_PIXELS} (a decompression bomb?) ({cause(exc)})") from None
    except Exception as exc:  # a decoder's error on a damaged file: PIL raises OSError, SyntaxError, ValueError...
        raise NoisyMLTError(f"{path}: corrupt or unreadable image ({cause(exc)})") from None


def _to_rgb(img: Image.Image, path: Path) -> Image.Image:
    if img.mode in SIXTEEN_BIT:
        grey = np.asarray(img, dtype=np.uint32)
        return Image.fromarray(((grey * 255 + 32767) // 65535).astype(np.uint8), "L").convert("RGB")
    if img.mode in ("I", "F"):
        raise NoisyMLTError(f"{path}: {'32-bit integer' if img.mode == 'I' else 'floating-point'} pixels (PIL mode "
                            f"{img.mode}), which have no stated scale to the 8 bits a run takes; save the image "
                            "with 8 or 16 bits a channel")
    return img.convert("RGB")
