"""Images in SFT rows: content parts that name an image file or hold a ``data:`` URI, loaded.

A message's ``content`` may be a list of parts, as OpenAI and Qwen-VL write them:
``{"type": "text", "text": "..."}`` and ``{"type": "image", "image": REF}`` where ``REF`` is a
``data:image/...;base64,...`` URI or a file path (relative to the JSONL file's folder). The
images are shown before the text, in order (:class:`~agentloop.types.Message`'s layout). Rows
keep the references; :func:`load_image` opens one when its conversation is tokenized, so a file
of many rows never holds all its decoded images at once.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError

__all__ = ["content_parts", "image_part", "load_image"]


def image_part(ref: str) -> dict[str, str]:
    """The content part of an image ``ref`` (a file path or a ``data:`` URI)."""
    return {"type": "image", "image": ref}


def content_parts(
    parts: Sequence[Any], where: str, field: str, root: Path | None
) -> tuple[str, tuple[str, ...]]:
    """``(text, image refs)`` of a list ``content``; a path ref made absolute against ``root``."""
    texts: list[str] = []
    images: list[str] = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image" and isinstance(part.get("image"), str) and part["image"]:
            ref = part["image"]
            if not ref.startswith("data:") and root is not None:
                ref = str((root / ref).resolve())
            images.append(ref)
        else:
            raise ConfigError(
                f"{where}: {field}[{j}]: is {part!r:.80}; give text parts "
                '{"type": "text", "text": "..."} and image parts {"type": "image", "image": '
                '"FILE or data:image/png;base64,..."}'
            )
    return "".join(texts), tuple(images)


def load_image(ref: str, where: str) -> Any:
    """The PIL image (RGB) a ref names; a missing or undecodable one is a ``ConfigError``."""
    from PIL import Image, UnidentifiedImageError

    try:
        if ref.startswith("data:"):
            head, _, b64 = ref.partition(",")
            if ";base64" not in head:
                raise ValueError("only base64 data URIs are read")
            source: Any = io.BytesIO(base64.b64decode(b64, validate=True))
        else:
            source = ref
        with Image.open(source) as im:
            return im.convert("RGB")
    except (OSError, ValueError, UnidentifiedImageError) as exc:
        raise ConfigError(
            f"{where}: cannot read the image {ref[:80]!r} ({exc}); give a PNG/JPEG file path "
            "(relative to the JSONL file) or a data:image/...;base64 URI"
        ) from None
