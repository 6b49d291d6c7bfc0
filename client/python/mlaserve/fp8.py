"""SnapMLA's RoPE-aware per-token FP8 rows, quantised on the client (docs/numerics.md,
"FP8 latent cache"), with the server's formula and rounding, so the bytes equal what the
server writes from the same bf16 rows:

    scale   = max(amax |c_kv|, 1e-26) / 448            float32
    content = e4m3(c_kv / scale)                        OCP e4m3fn, nearest even, saturating
    rope    = bf16(k_pe / scale)                        nearest even

(a row whose RoPE would overflow bf16 takes scale = amax |k_pe| / 2^120 instead). A row
travels as dl content bytes, the fp32 scale (little-endian) and dr bf16 values: 644 bytes for
DeepSeek-V3's 512 + 64, against 1152 in bf16.
"""

import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits

_E4M3_MAX = np.float32(448.0)
_AMAX_FLOOR = np.float32(1e-26)
_ROPE_HEADROOM = np.float32(2.0 ** 120)


def _e4m3_values():
    """The 127 non-negative finite e4m3 values, by code (0x00..0x7e)."""
    codes = np.arange(0x7F)
    exponent = codes >> 3
    mantissa = codes & 7
    return np.where(exponent == 0, mantissa * 2.0 ** -9,
                    (1 + mantissa / 8.0) * 2.0 ** (exponent - 7)).astype(np.float32)


_VALUES = _e4m3_values()


def float_to_e4m3(values):
    """float32 values -> e4m3 codes (uint8): nearest, ties to the even code, saturating at
    +-448; NaN -> 0x7f."""
    x = np.asarray(values, dtype=np.float32)
    magnitude = np.minimum(np.abs(x), _E4M3_MAX)
    upper = np.clip(np.searchsorted(_VALUES, magnitude), 1, 0x7E)
    lower = upper - 1
    to_lower = magnitude - _VALUES[lower]
    to_upper = _VALUES[upper] - magnitude
    pick_upper = (to_upper < to_lower) | ((to_upper == to_lower) & (upper % 2 == 0))
    codes = np.where(pick_upper, upper, lower)
    codes = np.where(magnitude == _VALUES[upper], upper, codes)  # exact hits
    codes = codes.astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), codes).astype(np.uint8)


def e4m3_to_float(codes):
    """e4m3 codes -> float32 values (exact); 0x7f / 0xff -> NaN."""
    codes = np.asarray(codes, dtype=np.uint8)
    values = _VALUES[np.minimum(codes & 0x7F, 0x7E)]
    values = np.where((codes & 0x7F) == 0x7F, np.float32(np.nan), values)
    return np.where(codes & 0x80, -values, values).astype(np.float32)


def quantize_rows(rows, dl):
    """Latent rows [n, dl + dr] (float arrays, or uint16 bf16 bit patterns) -> bytes of n
    FP8 rows, as AppendKvChunk.fp8_rows.data carries them."""
    rows = np.asarray(rows)
    if rows.dtype == np.uint16:
        rows = bf16_bits_to_float(rows)
    rows = rows.astype(np.float32)
    content, rope = rows[:, :dl], rows[:, dl:]
    scale = np.maximum(np.abs(content).max(axis=1), _AMAX_FLOOR) / _E4M3_MAX
    if rope.shape[1]:
        scale = np.maximum(scale, np.abs(rope).max(axis=1) / _ROPE_HEADROOM)
    scale = scale.astype(np.float32)
    codes = float_to_e4m3(content / scale[:, None])
    rope_bits = float_to_bf16_bits(rope / scale[:, None])
    out = np.concatenate([codes.view(np.uint8),
                          scale.astype("<f4").reshape(-1, 1).view(np.uint8),
                          rope_bits.astype("<u2").view(np.uint8).reshape(len(rows), -1)],
                         axis=1)
    return out.tobytes()
