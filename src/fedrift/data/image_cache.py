"""Image trees at real scale: a dataset root that is a folder or a ``.zip``, and pixels decoded
once.

CIFAR-10 is 60,000 small JPEGs and Tiny-ImageNet 110,000: decoding them takes seconds to
minutes, every run. :func:`read_images` decodes a list of image files once and keeps the
uint8 result in fedrift's file cache (:mod:`fedrift.cache`) under a SHA-256 of what the
pixels depend on: each file's *content*, in order, the size and the channels. So a second
run reads one array instead of decoding, and a changed, added or removed file is a new key
(never a stale image). A file's content is identified by the SHA-256 of its bytes in a
folder, and by the archive's own CRC-32 and size for a zip member (recorded in the zip's
directory: keying 60,000 members reads none of them).

Sizes are bounded before anything is read: an image file (folder file or zip member) of at
most :data:`IMAGE_BYTES`, decoding to at most :data:`IMAGE_PIXELS` pixels, a text file (a
class list) of at most :data:`TEXT_BYTES`, and a zip's image members together expanding at
most :data:`~fedrift.data.files.ZIP_RATIO` times the archive (past 64 MiB): a zip bomb is
refused from the archive's directory, naming the member.

:func:`open_root` lets every image loader take ``data.root`` as a folder, a ``.zip``, or a
folder holding one ``.zip``: :class:`ZipTree` walks an archive with the same calls (``/``,
``iterdir``, ``is_dir``, ``read_bytes``) as :class:`pathlib.Path` walks a folder, so the
loaders do not know which they read.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Union

import numpy as np

from fedrift.cache import cache_dir, save_atomic
from fedrift.data.files import IMAGE_SUFFIXES, DataError, check_expansion, fit, malformed, read_bounded, too_big

FORMAT = "fedrift-images-v1"  # change when decoding or resizing changes: old entries then miss
IMAGE_BYTES = 64 << 20  # one image file: a 24-megapixel PNG is about 40 MB; the models read at most 1024x1024
IMAGE_PIXELS = 89_478_485  # Pillow's MAX_IMAGE_PIXELS (where it only warns): 256 MiB as RGB
TEXT_BYTES = 16 << 20  # a class list or annotation file (Tiny-ImageNet's largest: 0.4 MB)


class ZipTree:
    """A place in a zip archive, walked with :class:`pathlib.Path`'s calls (``/``, ``name``,
    ``suffix``, ``is_dir``, ``is_file``, ``exists``, ``iterdir``, ``read_bytes``,
    ``read_text``), so the loaders read an archive as they read a folder.

    :class:`zipfile.Path` offers the same calls but scans every member's name on each
    ``iterdir``: listing CIFAR-10's 20 class folders cost 2 million scans (6 s). Here the
    archive's folders are indexed once, when it is opened."""

    def __init__(self, archive: zipfile.ZipFile, at: str, index: dict[str, list[str]]):
        self.archive, self.at, self._index = archive, at, index

    @classmethod
    def open(cls, archive: zipfile.ZipFile) -> ZipTree:
        index: dict[str, list[str]] = {"": []}
        for name in archive.namelist():
            parts = name.rstrip("/").split("/")
            for depth in range(len(parts)):  # every folder on the way, listed or implied
                parent, here = "/".join(parts[:depth]), "/".join(parts[: depth + 1])
                folder = depth < len(parts) - 1 or name.endswith("/")
                if folder and here in index:
                    continue
                if folder:
                    index[here] = []
                index[parent].append(here)
        return cls(archive, "", index)

    def __truediv__(self, name: str) -> ZipTree:
        return ZipTree(self.archive, f"{self.at}/{name}" if self.at else name, self._index)

    def __str__(self) -> str:
        return f"{self.archive.filename}:{self.at}" if self.at else str(self.archive.filename)

    @property
    def name(self) -> str:
        return self.at.rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return os.path.splitext(self.name)[1]

    @property
    def parent(self) -> ZipTree:
        return ZipTree(self.archive, self.at.rpartition("/")[0], self._index)

    def is_dir(self) -> bool:
        return self.at in self._index

    def is_file(self) -> bool:
        return self.at in self.archive.NameToInfo and not self.is_dir()

    def exists(self) -> bool:
        return self.is_dir() or self.is_file()

    def iterdir(self) -> list[ZipTree]:
        return [ZipTree(self.archive, child, self._index) for child in self._index.get(self.at, [])]

    def info(self) -> zipfile.ZipInfo:
        """The member's entry in the archive's directory (its sizes: nothing read)."""
        return self.archive.getinfo(self.at)

    def read_bytes(self) -> bytes:
        return self.archive.read(self.at)  # checks the member's CRC-32; at most info().file_size bytes

    def read_text(self) -> str:
        return self.read_bytes().decode()


Tree = Union[Path, ZipTree]
"""A folder, or a place inside a zip archive."""


def open_root(root: Path, holds: str) -> Tree:
    """``root`` as a tree to read images from: the folder itself, the archive when ``root`` is
    a ``.zip`` file, or the one ``.zip`` inside a folder that has no sub-folders (the shared
    CIFAR-10 folder: a README beside the zip). ``holds`` says what the tree must hold."""
    if not root.exists():
        raise DataError(f"data: folder {root} is missing; expected a folder or a .zip archive holding {holds}")
    if root.is_file():
        if root.suffix.lower() != ".zip":
            raise DataError(f"data.root: {root} is a file; expected a folder or a .zip archive holding {holds}")
        return _open_zip(root, holds)
    if not any(p.is_dir() for p in root.iterdir()):
        zips = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() == ".zip")
        if len(zips) == 1:
            return _open_zip(zips[0], holds)
        if zips:
            names = ", ".join(p.name for p in zips)
            raise DataError(f"data.root: {root} holds {len(zips)} .zip archives ({names}); expected one, or data.root=<one of them>")
    return root


def _open_zip(path: Path, holds: str) -> ZipTree:
    try:
        top = ZipTree.open(zipfile.ZipFile(path))
    except (zipfile.BadZipFile, OSError) as err:
        raise malformed(path, f"a zip archive holding {holds}", f"{type(err).__name__}: {err}") from None
    images = [i for i in top.archive.infolist() if os.path.splitext(i.filename)[1].lower() in IMAGE_SUFFIXES]
    big = next((i for i in images if i.file_size > IMAGE_BYTES), None)
    if big is not None:  # refused from the directory, before the images ahead of it are decoded
        raise too_big(top / big.filename, big.file_size, IMAGE_BYTES, "image files")
    check_expansion(path, images, "image files")
    inner = top.iterdir()
    # An archive made by zipping the dataset's folder holds that one folder: read inside it.
    if len(inner) == 1 and inner[0].is_dir() and any(c.name in ("train", "test") for c in inner[0].iterdir()):
        return inner[0]
    return top


def content_key(path: Tree) -> bytes:
    """What identifies a file's content: its archive CRC-32 and size inside a zip, the SHA-256
    of its bytes in a folder."""
    if isinstance(path, ZipTree):
        info = path.info()
        return f"zip:{info.CRC:08x}:{info.file_size}".encode()
    try:
        return hashlib.sha256(read_bounded(path, IMAGE_BYTES, "image files")).digest()
    except OSError as err:
        raise DataError(f"data: {path} cannot be read ({err.strerror or err}); expected an image file") from None


def images_key(paths: list[Tree], size: int, channels: int) -> str:
    """The cache key of :func:`read_images`: the content of every file in order (the pixels
    depend on nothing else), the output size and channels."""
    h = hashlib.sha256(f"{FORMAT}:{size}:{channels}:{len(paths)}\n".encode())
    for p in paths:
        h.update(content_key(p) + b"\n")
    return h.hexdigest()[:40]


def read_image(path: Tree, size: int, channels: int) -> np.ndarray:
    """uint8 ``(channels, size, size)``: the image decoded by Pillow, converted to RGB (3) or
    grey (1), resized bilinearly to ``size`` x ``size`` when it is another size. A damaged
    file or zip member is refused naming it, as is one beyond :data:`IMAGE_BYTES` (unread)
    or :data:`IMAGE_PIXELS` (undecoded: Pillow reads the size from the header)."""
    from PIL import Image

    try:
        data = read_bounded(path, IMAGE_BYTES, "image files")  # a zip member's CRC-32 is checked here
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > IMAGE_PIXELS:
                raise DataError(f"data.root: {path} is {img.width}x{img.height} pixels; "
                                f"allowed: images of at most {IMAGE_PIXELS:,} pixels")
            arr = np.asarray(fit(img.convert("RGB" if channels == 3 else "L"), size), dtype=np.uint8)
    except DataError:
        raise
    except Exception as err:  # unidentifiable, truncated, bad CRC, unreadable
        raise malformed(path, "an image file Pillow can decode", f"{type(err).__name__}: {err}") from None
    return arr.reshape(size, size, channels).transpose(2, 0, 1)


def read_images(paths: list[Tree], size: int, channels: int, label: str = "images") -> np.ndarray:
    """uint8 ``(n, channels, size, size)`` for ``paths``, in order: from the cache when these
    very files were decoded at this size before, else decoded (with a progress bar on a
    terminal) and cached."""
    entry = cache_dir() / f"images-{images_key(paths, size, channels)}.npy"
    shape = (len(paths), channels, size, size)
    found = cached(entry, shape)
    if found is not None:
        return found
    from tqdm.auto import tqdm

    out = np.empty(shape, dtype=np.uint8)
    with tqdm(total=len(paths), desc=f"decoding {label}", unit="img", disable=None, leave=False) as bar:
        for i, p in enumerate(paths):
            out[i] = read_image(p, size, channels)
            if i % 256 == 255 or i == len(paths) - 1:
                bar.update(i + 1 - bar.n)
    keep(entry, out)
    return out


def cached(entry: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The cache entry's uint8 array of ``shape``; None when it is absent, unreadable or of
    another shape or type (then decoded again)."""
    try:
        found = np.load(entry, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return found if found.shape == shape and found.dtype == np.uint8 else None


def cached_into(entry: Path, out: np.ndarray) -> bool:
    """Read the cache entry's uint8 array straight into ``out`` (C-contiguous): no second copy
    and no mapping (a mapped entry's pages count in the process's memory until unmapped, which
    put a Parquet dataset's second load 60% above its tensors; BENCHMARKS.md V). False when the
    entry is absent, unreadable, torn, or of another shape or type (then decoded again)."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with entry.open("rb") as f:
            read = readers.get(np.lib.format.read_magic(f))
            if read is None:
                return False
            shape, fortran, dtype = read(f)
            if tuple(shape) != out.shape or fortran or dtype != np.uint8:
                return False
            view, done = memoryview(out).cast("B"), 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    return False  # torn: shorter than its header says
                done += got
            return f.read(1) == b""
    except (OSError, ValueError, EOFError):
        return False


def keep(entry: Path, array: np.ndarray) -> None:
    """``array`` as the cache entry, written whole or not at all."""
    save_atomic(entry, lambda tmp: _save(tmp, array))


def _save(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as f:  # a file object: np.save would add ".npy" to a name
        np.save(f, array, allow_pickle=False)


def image_files(folder: Tree) -> list[Tree]:
    """The image files directly in ``folder`` (by suffix, any case), sorted by name."""
    return sorted((p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()), key=lambda p: p.name)


__all__ = ["Tree", "ZipTree", "content_key", "image_files", "images_key", "open_root", "read_image", "read_images"]
