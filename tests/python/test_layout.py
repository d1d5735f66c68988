"""Layout inference: tensor shape/stride -> RegisterContextBatch layer fields."""

from __future__ import annotations

import pytest

from fakes import FakeTensor
from pegaflow.connector.layout import LayoutError, infer_layout
from pegaflow.device.base import describe

N, BS, H, D = 10, 16, 4, 64  # blocks, block tokens, kv heads, head dim; bf16 (2 bytes)
BLOCK = BS * H * D * 2


def lay(t, **kw):
    return infer_layout(describe(t), **kw)


def permuted(shape, order):
    """Logical ``shape`` whose memory is laid out in dimension ``order`` (outer->inner)."""
    stride = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        stride[d] = acc
        acc *= shape[d]
    return FakeTensor(shape, stride)


def test_flash_attention_kv_first_nhd():
    l = lay(FakeTensor((2, N, BS, H, D)))
    assert (l.num_blocks, l.bytes_per_block, l.kv_stride_bytes, l.segments) == \
        (N, BLOCK, N * BLOCK, 2)
    assert l.block_stride_bytes == BLOCK and l.kv_first


def test_flash_attention_kv_first_hnd_strides():
    # logical (2, N, BS, H, D), physical (2, N, H, BS, D)
    l = lay(permuted((2, N, BS, H, D), (0, 1, 3, 2, 4)))
    assert (l.num_blocks, l.bytes_per_block, l.kv_stride_bytes, l.segments) == \
        (N, BLOCK, N * BLOCK, 2)


def test_flashinfer_blocks_first():
    l = lay(FakeTensor((N, 2, BS, H, D)))
    assert (l.num_blocks, l.bytes_per_block, l.kv_stride_bytes, l.segments) == \
        (N, 2 * BLOCK, 0, 1)


def test_mla_blocks_first_even_with_two_blocks():
    # MLA (N, block, latent): shape[0] == 2 must not be read as KV-first
    l = lay(FakeTensor((2, BS, 576)), is_mla=True)
    assert (l.num_blocks, l.bytes_per_block, l.segments) == (2, BS * 576 * 2, 1)


def test_mla_kernel_blocks_grouped_into_scheduler_blocks():
    # FlashMLA-style kernel block 16 under a 64-token scheduler block: 4 rows per block
    l = lay(FakeTensor((4 * N, 16, 576)), is_mla=True, logical_block_size=64)
    assert (l.num_blocks, l.bytes_per_block) == (N, 4 * 16 * 576 * 2)
    with pytest.raises(LayoutError, match="does not divide"):
        lay(FakeTensor((4 * N, 24, 576)), is_mla=True, logical_block_size=64)


def test_kv_first_kernel_blocks_grouped():
    l = lay(FakeTensor((2, 2 * N, 8, H, D)), logical_block_size=16, expected_num_blocks=N)
    assert (l.num_blocks, l.bytes_per_block, l.kv_stride_bytes) == (N, BLOCK, N * BLOCK)


def test_cross_layer_blocks_outermost():
    L = 3
    l = lay(FakeTensor((N, L, 2, BS, H, D)), cross_layer=True, expected_num_blocks=N)
    assert (l.num_blocks, l.bytes_per_block, l.segments) == (N, L * 2 * BLOCK, 1)
    # the same memory presented with the layer dimension first
    v = permuted((L, N, 2, BS, H, D), (1, 0, 2, 3, 4, 5))
    l2 = lay(v, cross_layer=True, expected_num_blocks=N)
    assert l2 == l
    # cross-layer with exactly two blocks is still blocks-first
    assert lay(FakeTensor((2, L, 2, BS, H, D)), cross_layer=True).num_blocks == 2


def test_layer_major_cross_layer_is_refused():
    L = 3
    t = FakeTensor((L, N, 2, BS, H, D))  # layers outermost: a block is not contiguous
    with pytest.raises(LayoutError, match="vLLM allocated"):
        lay(t, cross_layer=True, expected_num_blocks=N)


@pytest.mark.parametrize("t,kw,match", [
    (FakeTensor((2, N, BS, H, D), storage_offset=8), {}, "storage_offset"),
    (FakeTensor((N * BS * H * D,)), {}, "at least 2"),
    (FakeTensor((2, N, BS, H, D), stride=(BS * H * D, BS * H * D, H * D, D, 1)), {},
     "overlap"),
    (FakeTensor((2, N, BS, H, D), nbytes=N * BLOCK), {}, "storage has"),
    (FakeTensor((N, 2, BS, H, D), stride=(BS * H * D, BS * H * D, H * D, D, 1)), {},
     "not blocks-first"),
    (FakeTensor((2, N, BS, H, D)), {"expected_num_blocks": N + 1}, "vLLM allocated"),
])
def test_bad_layouts_fail(t, kw, match):
    with pytest.raises(LayoutError, match=match):
        lay(t, **kw)


def test_padded_blocks_are_copied_whole():
    # blocks 8 KiB apart but holding 4 KiB: the padding travels with the block
    t = FakeTensor((N, BS, H, D // 2), stride=(BS * H * D, H * D // 2, D // 2, 1),
                   nbytes=N * BS * H * D * 2)
    l = lay(t)
    assert l.bytes_per_block == BS * H * D * 2 and l.num_blocks == N
    # ...which needs the last block's padding inside the storage
    t = FakeTensor((N, BS, H, D // 2), stride=(BS * H * D, H * D // 2, D // 2, 1))
    with pytest.raises(LayoutError, match="storage has"):
        lay(t)


# ------------------------------------------------------------------ hybrid models


def test_hybrid_attention_view_over_pages_is_one_segment():
    # vLLM's hybrid layout: logical (2, N, BS, H, D), K and V of a block adjacent in a
    # page shared with state layers (page >= 2 * BLOCK)
    half = BS * H * D
    page = 2 * half + 256  # padded to the state page
    l = lay(FakeTensor((2, N, BS, H, D), (half, page, H * D, D, 1), nbytes=N * page * 2))
    assert (l.num_blocks, l.bytes_per_block, l.kv_stride_bytes, l.segments) == \
        (N, page * 2, 0, 1)
    with pytest.raises(LayoutError, match="K and V span"):  # pages too small for K+V
        lay(FakeTensor((2, N, BS, H, D), (half, half + 8, H * D, D, 1)))


def test_state_layout_is_one_page_per_block():
    from pegaflow.connector.layout import state_layout

    page = 1024  # elements (uint16): conv (4, 32) at 0, ssm (8, 8) at 128
    conv = FakeTensor((N, 4, 32), (page, 32, 1), nbytes=N * page * 2)
    ssm = FakeTensor((N, 8, 8), (page, 8, 1), storage_offset=128, nbytes=N * page * 2)
    l = state_layout([describe(conv), describe(ssm)])
    assert (l.num_blocks, l.bytes_per_block, l.segments) == (N, page * 2, 1)
    # (2, ...) state tensors are block-first too, not K/V
    two = FakeTensor((2, 4, 32), (page, 32, 1), nbytes=2 * page * 2)
    assert state_layout([describe(two)]).num_blocks == 2
    with pytest.raises(LayoutError, match="block stride"):
        state_layout([describe(conv), describe(FakeTensor((N, 8, 8), (page // 2, 8, 1),
                                                          storage_offset=128,
                                                          nbytes=N * page * 2))])
    with pytest.raises(LayoutError, match="does not fit"):
        state_layout([describe(conv), describe(FakeTensor((N, 8, 8), (page, 8, 1),
                                                          storage_offset=page - 8,
                                                          nbytes=N * page * 2))])
    with pytest.raises(LayoutError, match="blocks, the first"):
        state_layout([describe(conv), describe(FakeTensor((N - 1, 8, 8), (page, 8, 1),
                                                          nbytes=N * page * 2))])
    with pytest.raises(LayoutError, match="storage_offset"):
        state_layout([describe(ssm)])
    with pytest.raises(LayoutError, match="vLLM allocated 3"):
        state_layout([describe(conv)], expected_num_blocks=3)
