"""GGUF files through the `gguf` package, memory-mapped: quantized and half-precision matrices stay in
their blocks (QuantizedTensor, dequantized only when asked for floats), vectors become float32.

The loader reads metadata and tensors only; the family registered for the file's architecture
(infer.engine.models) names the tensors, builds the config and checks the shapes."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderTensor
from gguf.quants import dequantize

from infer.engine.models import family_for_gguf
from infer.engine.models.base import Checkpoint, ModelLoadError, QuantizedTensor, Tensor

SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)


_U64 = struct.Struct("<Q")
"""A little-endian uint64 (a GGUF string's length prefix)."""


class _PlainArrayReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    The reader slices its buffer hundreds of thousands of times while parsing metadata (every
    token string); on a np.memmap each slice builds a memmap subclass, which makes opening a
    49k-token vocabulary take seconds. A plain view of the same mapping parses 3x faster and
    still reads the file lazily.
    """

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        """The file's bytes (memory-mapped)."""
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray], list[int], list[GGUFValueType]]:
        """Arrays of scalars or strings in one pass instead of one recursive call per element.

        The package parses a 49k-entry vocabulary element by element (two numpy views and an enum per
        entry: most of a warm start). A scalar array becomes one part holding every value (what
        `ReaderField.contents()` flattens anyway); a string array one byte view per string, its
        offsets walked with `struct`. Nested arrays and byte-swapped files take the package's path.
        """
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        count_part = self._get(orig_offs + 4, np.uint64)
        item_type, count = GGUFValueType(int(raw_itype[0])), int(count_part[0])
        offs = orig_offs + 12
        scalar = self.gguf_scalar_to_np.get(item_type)
        if scalar is not None:
            values = self._get(offs, scalar, count)
            if len(values) != count:
                raise ValueError(f"array of {count} {item_type.name} runs past the end of the file")
            return (
                12 + int(values.nbytes),
                [raw_itype, count_part, values],
                [2],
                [GGUFValueType.ARRAY, item_type],
            )
        if item_type != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        data, view = self._plain, memoryview(self._plain)
        parts: list[np.ndarray] = [raw_itype, count_part]
        for _ in range(count):
            (length,) = _U64.unpack_from(view, offs)
            if offs + 8 + length > len(data):
                raise ValueError("string runs past the end of the file")
            parts.append(data[offs + 8 : offs + 8 + length])
            offs += 8 + length
        return offs - orig_offs, parts, list(range(2, count + 2)), [GGUFValueType.ARRAY, item_type]


def open_reader(path: Path) -> GGUFReader:
    """Open a GGUF file, turning every failure into a ModelLoadError that names the file."""
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return _PlainArrayReader(path)
    except Exception as exc:  # the gguf package raises bare ValueError/IndexError on truncation
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/value fields as plain Python values."""
    return {key: field.contents() for key, field in reader.fields.items()}


def load_gguf(path: Path) -> Checkpoint:
    """Read a GGUF file into a Checkpoint (matrices kept in their blocks), named and checked by the
    family registered for its `general.architecture`."""
    from infer.engine.text.tokenizer import Tokenizer, TokenizerError

    reader = open_reader(path)
    meta = read_metadata(reader)
    family = family_for_gguf(meta, str(path))
    for tensor in reader.tensors:
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name} has unsupported quant type {tensor.tensor_type.name}"
            )
    # Only the tensors the family names are read.
    named = [(name, t) for t in reader.tensors if (name := family.gguf_tensor_name(t.name)) is not None]

    def read(tensor: ReaderTensor) -> Tensor:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        try:
            if len(shape) in (2, 3) and tensor.tensor_type != GGMLQuantizationType.F32:
                # A stack of matrices (a mixture-of-experts layer's experts) keeps its blocks as one
                # [experts * rows, row bytes] array: each expert is a view of its rows, never a copy.
                rows = int(np.prod(shape[:-1]))
                blocks = np.asarray(tensor.data).view(np.uint8).reshape(rows, -1)
                return QuantizedTensor(blocks, tensor.tensor_type.name, shape)
            return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot read tensor {tensor.name}: {exc}") from None

    weights = {name: read(tensor) for name, tensor in named}
    config = family.config_from_gguf(meta, str(meta["general.architecture"]), weights, str(path))
    family.check_weights(config, weights, str(path))
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    _give_back_metadata_pages(reader)
    return Checkpoint(config, weights, tokenizer, str(path))


def _give_back_metadata_pages(reader: GGUFReader) -> None:
    """Drop the resident pages of the file's metadata from the process (madvise DONTNEED on the read-only
    map; a later read maps them from the file again): a 128k vocabulary's tokens and merges (~8 MB)
    live in Python objects and the tokenizer by now, and their pages would stay resident while the
    weights load. (What backends.cpu_memory.give_back_pages does, through the map's own madvise: the
    loader imports no backend.)"""
    owner: object = reader.data
    while isinstance(owner, np.ndarray) and not isinstance(owner, np.memmap):
        owner = owner.base
    whole_file = isinstance(owner, np.memmap) and owner.mode == "r" and owner.offset == 0
    file_map = getattr(owner, "_mmap", None) if whole_file else None
    length = reader.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
    if isinstance(file_map, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and length > 0:
        file_map.madvise(mmap.MADV_DONTNEED, 0, length)
