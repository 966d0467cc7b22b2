"""Image attachments of a web UI message: checked here, then sent to the model as image parts
of the user's message and stored with it (its display metadata) to be shown as thumbnails.

An attachment is ``{"name", "url"}`` with a ``data:`` URL of a PNG, JPEG, GIF or WebP image
(base64); the bytes must be that kind of image and at most the size the server allows. Any
other is refused with a clear ``AttachmentError`` (the route's 400), and nothing is sent.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_IMAGES", "AttachmentError", "ImageAttachment", "max_image_bytes", "read_images"]

MAX_IMAGES = 4
_MAX_NAME_CHARS = 200
_DATA_URL = re.compile(r"data:(image/[a-z0-9.+-]+);base64,([A-Za-z0-9+/]*={0,2})")
# What each allowed type's bytes start with: the declared type must be the real one.
_MAGIC = {
    "image/png": lambda raw: raw.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda raw: raw.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda raw: raw[:6] in (b"GIF87a", b"GIF89a"),
    "image/webp": lambda raw: raw[:4] == b"RIFF" and raw[8:12] == b"WEBP",
}


class AttachmentError(ValueError):
    """An attachment the server refuses; ``code`` names why (``not_an_image``,
    ``image_too_large``, ``too_many_images``, ``invalid_attachment``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ImageAttachment:
    name: str
    url: str

    def part(self) -> dict[str, Any]:
        """The image as the model is sent it: an ``image_url`` part."""
        return {"type": "image_url", "image_url": {"url": self.url}}

    def shown(self) -> dict[str, str]:
        """The image as the transcript keeps it (its thumbnail)."""
        return {"name": self.name, "url": self.url}


def max_image_bytes(max_body_bytes: int) -> int:
    """The largest image a message can carry: its base64 text (4/3 of it) must fit in a
    request body beside the message's text."""
    return max(0, min(5 * 1024 * 1024, (max_body_bytes - 16 * 1024) * 3 // 4))


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{max(1, round(n / 1024))} KB"


def read_images(value: Any, max_bytes: int) -> tuple[ImageAttachment, ...]:
    """The checked attachments of a message body's ``images`` (None: none)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise AttachmentError("invalid_attachment", "images must be a list")
    if len(value) > MAX_IMAGES:
        raise AttachmentError("too_many_images", f"at most {MAX_IMAGES} images per message")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise AttachmentError("invalid_attachment", "each image is {name, url}")
        name = item.get("name") if isinstance(item.get("name"), str) else "image"
        name = " ".join(str(name).split())[:_MAX_NAME_CHARS] or "image"
        found = _DATA_URL.fullmatch(item["url"])
        if found is None or found.group(1) not in _MAGIC:
            raise AttachmentError("not_an_image", f"{name} is not a PNG, JPEG, GIF or WebP image")
        try:
            raw = base64.b64decode(found.group(2), validate=True)
        except (binascii.Error, ValueError):
            raise AttachmentError("not_an_image", f"{name} is not valid base64") from None
        if not _MAGIC[found.group(1)](raw):
            raise AttachmentError("not_an_image", f"{name} is not a PNG, JPEG, GIF or WebP image")
        if len(raw) > max_bytes:
            raise AttachmentError(
                "image_too_large",
                f"{name} is too large ({_size(len(raw))}): images up to {_size(max_bytes)}"
                " can be sent",
            )
        out.append(ImageAttachment(name, item["url"]))
    return tuple(out)
