"""JPEG bytes with an EXIF orientation written into them."""
from __future__ import annotations

import struct


def with_exif_orientation(jpeg: bytes, orientation: int, byte_order: str) -> bytes:
    """Insert an APP1 Exif segment holding only the orientation tag, in the given TIFF byte order."""
    e = "<" if byte_order == "II" else ">"
    tiff = byte_order.encode() + struct.pack(e + "HI", 42, 8) + struct.pack(e + "H", 1)
    tiff += struct.pack(e + "HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(e + "I", 0)
    payload = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]
