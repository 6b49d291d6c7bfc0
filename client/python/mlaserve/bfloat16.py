"""bfloat16 for numpy, which has no such dtype: bf16 values travel as uint16 bit patterns.

A bf16 number is the top half of an IEEE float32 word. These helpers convert with the
server's rounding (round to nearest even; NaN stays NaN), so a value rounded here is the
value the server stores.
"""

import numpy as np


def float_to_bf16_bits(values):
    """float arrays (any float dtype) -> uint16 bf16 bit patterns, round to nearest even."""
    words = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    nan = (words & 0x7FFFFFFF) > 0x7F800000
    rounded = (words + (0x7FFF + ((words >> 16) & 1))) >> 16
    quiet_nan = (words >> 16) | 0x0040
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_float(bits):
    """uint16 bf16 bit patterns -> float32 values (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(values):
    """The float32 values `values` become after a round trip through bf16."""
    return bf16_bits_to_float(float_to_bf16_bits(values))
