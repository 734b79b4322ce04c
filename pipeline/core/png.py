"""A minimal PNG encoder for HxW or HxWxC uint8 arrays (runs on the shipper thread, not the caller's)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type (grey, grey+alpha, RGB, RGBA)


def encode_png(image: np.ndarray, level: int = 6) -> bytes:
    """PNG bytes of an HxW or HxWxC (C in 1..4) uint8 array."""
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in _COLOR_TYPES or array.dtype != np.uint8:
        raise ValueError(f"an image must be an HxW or HxWxC uint8 array with C in 1..4, got {array.dtype} {array.shape}")
    height, width, channels = array.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), array.reshape(height, width * channels)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOR_TYPES[channels], 0, 0, 0)
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)) \
        + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
