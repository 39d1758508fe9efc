"""Images sent to a server are bounded before they are decoded, and their errors are words
(red-team pass 6: finding 5, a pixel bomb; unclear, a memory address in an image error)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from ciosl.serve import images


def _png(w, h) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def test_a_pixel_bomb_is_refused_before_anything_is_decoded(monkeypatch):
    """Twenty 2 KB PNGs of 4096 x 4096 cost 1.2 GB and 10 s: each is within the per-image
    bound, so the request's decoded pixels are bounded too, from the headers alone."""
    bomb = _png(4096, 4096)
    assert len(bomb) < 64 * 1024  # small on the wire
    decoded = []
    monkeypatch.setattr(Image.Image, "convert",
                        lambda self, *a, **k: decoded.append(1) or pytest.fail("decoded"))
    with pytest.raises(ValueError) as e:
        images.decode([bomb] * 20, max_pixels=64 << 20)
    assert str(e.value) == (f"images: {5 * 4096 * 4096} pixels in images[0..4], at most "
                            f"{64 << 20} per request (nothing decoded)")
    assert decoded == []


def test_images_within_the_bound_are_decoded():
    out = images.decode([_png(8, 6), _png(5, 5)], max_pixels=8 * 6 + 25)
    assert [a.shape for a in out] == [(6, 8, 3), (5, 5, 3)]
    with pytest.raises(ValueError, match=r"images: 73 pixels in images\[0..1\], at most 72"):
        images.decode([_png(8, 6), _png(5, 5)], max_pixels=72)


@pytest.mark.parametrize("blob", [b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_an_image_error_names_no_memory_address(blob):
    with pytest.raises(ValueError) as e:
        images.decode([blob], max_pixels=100)
    text = str(e.value)
    assert text.startswith("images[0]: not a PNG, JPEG or WebP image (")
    assert "0x" not in text and "<" not in text and "\n" not in text
