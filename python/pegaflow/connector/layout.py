"""KV-cache layout inference: tensor shape/stride -> RegisterContextBatch layer fields.

The server models every layer as one affine layout (reference §3.1): segment s of block i
lives at ``base + i * block_stride + s * kv_stride``, with ``bytes_per_block`` = the size
of ONE segment, ``segments`` 1 or 2, and the block stride implied by the layout
(contiguous: segments * bytes_per_block; split K/V: bytes_per_block).

Three shapes; the first two as the reference infers them (worker
``_infer_kv_cache_registration``), the third vLLM's layout for attention layers of hybrid
models:

* KV-first, non-MLA, ``shape[0] == 2`` (FlashAttention ``(2, N, block, heads, dim)``,
  NHD or HND strides): ``num_blocks = shape[1]``, ``bytes_per_block = stride[1] * elt``,
  ``kv_stride = stride[0] * elt``, 2 segments (split: all K blocks, then all V blocks).
* blocks-first, everything else (FlashInfer ``(N, 2, block, heads, dim)``, MLA
  ``(N, block, dim)``, the cross-layer tensor): ``num_blocks = shape[0]``,
  ``bytes_per_block = stride[0] * elt``, 1 segment.
* ``(2, N, ...)`` with ``stride[0] < stride[1]`` (hybrid models: K and V of a block are
  adjacent inside one page shared with recurrent-state layers): ``num_blocks = shape[1]``,
  ``bytes_per_block = stride[1] * elt`` (the page), 1 segment.
* recurrent-state layers (``state_layout``): vLLM's list of state tensors viewing one
  page per block; registered as the page.

When the attention kernel's block is smaller than the scheduler's (vLLM then allocates
``k = block_size // kernel_block`` physical rows per logical block, consecutively), k
rows are grouped into one block: for MLA (kernel block = ``shape[1]``, as the reference
does) and for KV-first (kernel block = ``shape[2]``).

Checks (a layout the server would copy wrongly must fail at start-up, not corrupt KV):
storage_offset 0, one block's inner dimensions fit inside its stride, split K and V
regions do not overlap, and every block lies inside the tensor's storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from pegaflow.device.base import TensorInfo


class LayoutError(ValueError):
    """The tensor's layout cannot be registered."""


@dataclass(frozen=True)
class LayerLayout:
    num_blocks: int
    bytes_per_block: int  # ONE segment
    kv_stride_bytes: int  # 0 when one segment
    segments: int
    block_stride_bytes: int

    @property
    def kv_first(self) -> bool:
        return self.segments == 2


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements spanned by a strided region (1 + max offset), 0 if empty."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def _group(block_tokens: int, logical_block_size: int | None, name: str) -> int:
    if not logical_block_size or block_tokens >= logical_block_size:
        return 1
    if block_tokens <= 0 or logical_block_size % block_tokens:
        raise LayoutError(f"{name}: kernel block of {block_tokens} tokens does not divide the "
                          f"scheduler block of {logical_block_size}")
    return logical_block_size // block_tokens


def infer_layout(info: TensorInfo, *, is_mla: bool = False, cross_layer: bool = False,
                 logical_block_size: int | None = None, expected_num_blocks: int | None = None,
                 name: str = "kv cache", blocks_first: bool = False) -> LayerLayout:
    """Layout of one registered tensor. ``expected_num_blocks`` (vLLM's
    ``kv_cache_config.num_blocks``) turns any disagreement into a LayoutError.
    ``blocks_first``: the block dimension is dimension 0, whatever the shape (recurrent
    state tensors)."""
    lay = _infer(info, is_mla, cross_layer or blocks_first, logical_block_size, name,
                 forced=blocks_first)
    if expected_num_blocks is not None and lay.num_blocks != expected_num_blocks:
        raise LayoutError(f"{name}: inferred {lay.num_blocks} blocks from shape {info.shape} "
                          f"stride {info.stride}, but vLLM allocated {expected_num_blocks}")
    return lay


def state_layout(infos: list[TensorInfo], *, expected_num_blocks: int | None = None,
                 name: str = "state") -> LayerLayout:
    """Layout of a recurrent-state layer (vLLM MambaSpec): one or more state tensors
    (conv, ssm, ...) viewing one buffer, each ``(num_blocks, ...)`` with the page size as
    block stride, the first at storage offset 0 and the others inside the same page. The
    layer registers as one block-first segment of one page per block."""
    if not infos:
        raise LayoutError(f"{name}: no state tensors")
    first = infos[0]
    lay = infer_layout(first, blocks_first=True, expected_num_blocks=expected_num_blocks,
                       name=name)
    page = lay.bytes_per_block
    for k, info in enumerate(infos[1:], 1):
        if info.ndim < 1 or info.shape[0] != first.shape[0]:
            raise LayoutError(f"{name}: state tensor {k} has {info.shape[:1]} blocks, the "
                              f"first {first.shape[0]}")
        if info.stride[0] * info.element_size != page:
            raise LayoutError(f"{name}: state tensor {k} has a block stride of "
                              f"{info.stride[0] * info.element_size} bytes, the first {page}: "
                              "not views of one page per block")
        off = info.storage_offset * info.element_size
        inner = _span(info.shape[1:], info.stride[1:]) * info.element_size
        if off + inner > page:
            raise LayoutError(f"{name}: state tensor {k} (bytes {off}..{off + inner}) does not "
                              f"fit in the {page}-byte page of its block")
    return lay


def _infer(info: TensorInfo, is_mla: bool, cross_layer: bool, logical_block_size: int | None,
           name: str, forced: bool = False) -> LayerLayout:
    shape, stride, elt = info.shape, info.stride, info.element_size
    if info.storage_offset != 0:
        raise LayoutError(f"{name}: storage_offset is {info.storage_offset}; the connector "
                          "registers whole storages and needs the tensor to start at its "
                          "storage's first byte")
    if info.ndim < 2:
        raise LayoutError(f"{name}: expected at least 2 dimensions, got shape {shape}")
    if any(st < 0 for st in stride):
        raise LayoutError(f"{name}: negative strides {stride}")

    if (not is_mla and not cross_layer and shape[0] == 2 and info.ndim >= 3
            and stride[0] < stride[1]):
        # (2, N, ...) viewed over a blocks-first buffer (vLLM's layout for attention
        # layers of hybrid models, which share pages with recurrent-state layers): K and
        # V of a block are adjacent, blocks are stride[1] apart: one segment per block.
        k = _group(shape[2], logical_block_size, name)
        phys = shape[1]
        if phys % k:
            raise LayoutError(f"{name}: {phys} kernel blocks are not a multiple of {k}")
        inner = _span((2,) + tuple(shape[2:]), (stride[0],) + tuple(stride[2:])) * elt
        pstride = stride[1] * elt
        if inner > pstride:
            raise LayoutError(f"{name}: one block's K and V span {inner} bytes but blocks are "
                              f"{pstride} bytes apart (shape {shape}, stride {stride})")
        num_blocks = phys // k
        seg = pstride * k
        if num_blocks * seg > info.storage_nbytes:
            raise LayoutError(f"{name}: layout ends at byte {num_blocks * seg}, storage has "
                              f"{info.storage_nbytes}")
        return LayerLayout(num_blocks, seg, 0, 1, seg)

    if not is_mla and not cross_layer and shape[0] == 2 and info.ndim >= 3:
        k = _group(shape[2], logical_block_size, name)
        phys = shape[1]
        if phys % k:
            raise LayoutError(f"{name}: {phys} kernel blocks are not a multiple of {k}")
        inner = _span(shape[2:], stride[2:]) * elt
        pstride = stride[1] * elt
        if inner > pstride:
            raise LayoutError(f"{name}: one block spans {inner} bytes but blocks are "
                              f"{pstride} bytes apart (shape {shape}, stride {stride})")
        num_blocks = phys // k
        seg = pstride * k
        kv_stride = stride[0] * elt
        if kv_stride < phys * pstride:
            raise LayoutError(f"{name}: K and V regions overlap (K/V stride {kv_stride} bytes "
                              f"< {phys} blocks x {pstride} bytes)")
        end = kv_stride + num_blocks * seg
        if end > info.storage_nbytes:
            raise LayoutError(f"{name}: layout ends at byte {end}, storage has "
                              f"{info.storage_nbytes}")
        return LayerLayout(num_blocks, seg, kv_stride, 2, seg)

    bd = 0
    if cross_layer and not forced:
        # One tensor for all layers: the block dimension must be physically outermost
        # (a block holds every layer contiguously); vLLM may present it with the layer
        # dimension first, so take the dimension with the largest stride.
        bd = max(range(info.ndim), key=lambda d: (stride[d], -d))
    k = _group(shape[1], logical_block_size, name) if is_mla and not cross_layer else 1
    phys = shape[bd]
    if phys % k:
        raise LayoutError(f"{name}: {phys} kernel blocks are not a multiple of {k}")
    rest = tuple(d for d in range(info.ndim) if d != bd)
    inner = _span(tuple(shape[d] for d in rest), tuple(stride[d] for d in rest)) * elt
    pstride = stride[bd] * elt
    if inner > pstride:
        raise LayoutError(f"{name}: one block spans {inner} bytes but blocks are {pstride} "
                          f"bytes apart (shape {shape}, stride {stride}): not blocks-first")
    num_blocks = phys // k
    seg = pstride * k
    end = num_blocks * seg
    if end > info.storage_nbytes:
        raise LayoutError(f"{name}: layout ends at byte {end}, storage has "
                          f"{info.storage_nbytes}")
    return LayerLayout(num_blocks, seg, 0, 1, seg)
