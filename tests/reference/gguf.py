"""A small GGUF v3 reader and writer in pure numpy (reference code for the sparrow test suite).

File layout (all little-endian):
    header      magic "GGUF" (4 bytes), version u32, tensor_count u64, metadata_kv_count u64
    metadata    metadata_kv_count x (key: string, value_type: u32, value)
    tensors     tensor_count x (name: string, n_dims: u32, dims: u64[n_dims], ggml_type: u32, offset: u64)
    padding     up to a multiple of the alignment (metadata `general.alignment`, default 32)
    data        tensor data; each tensor's offset is relative to the start of this section
A string is a u64 byte length followed by UTF-8 bytes (no terminator). An array value is
(element_type: u32, count: u64, elements...); elements may themselves be arrays.

GGUF dims are innermost-first: a tensor with dims [ne0, ne1] is returned as a numpy array of shape
(ne1, ne0), i.e. one row of ne0 contiguous elements per ne1 index.

    f = GGUFReader("model.gguf")
    f.metadata["llama.block_count"]          # plain python values (int, float, bool, str, list)
    f.metadata_types["llama.block_count"]    # GGUFValueType of each value
    f.tensors["token_embd.weight"]           # TensorInfo (name, dims, ggml_type, offset, shape, ...)
    f.tensor("token_embd.weight")            # float64 array in numpy shape (dequantised)
    f.raw("token_embd.weight")               # the tensor's bytes (a read-only view, no copy)

    write_gguf("out.gguf", {"general.architecture": (GGUFValueType.STRING, "llama"), ...},
               {"token_embd.weight": (GGMLType.F32, array), ...})
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# numpy dtype of each fixed-size scalar value type (little-endian).
_SCALAR_DTYPES = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# (elements per block, bytes per block) of every ggml type, so that offsets and sizes of any tensor
# can be checked even when its type cannot be dequantised here.
GGML_BLOCK = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66), GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50), GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82), GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8), GGMLType.IQ1_M: (256, 56),
    GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54), GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17),
}


def tensor_nbytes(ggml_type: int, n_elements: int) -> int:
    block, size = GGML_BLOCK[GGMLType(ggml_type)]
    if n_elements % block:
        raise ValueError(f"{GGMLType(ggml_type).name}: {n_elements} elements is not a multiple of {block}")
    return n_elements // block * size


# --------------------------------------------------------------------------------------------------
# Element formats: half, bfloat16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K ... Q6_K, IQ4_XS
# --------------------------------------------------------------------------------------------------

def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float64: the upper half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even; NaN stays a (quiet) NaN, as ggml does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


# Q8_0 block: fp16 d, then 32 int8 q; x[j] = d * q[j].
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
# Q4_0 block: fp16 d, then 16 bytes; x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8).
Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
assert Q8_0_BLOCK.itemsize == 34 and Q4_0_BLOCK.itemsize == 18
# Q4_1 (x = d * u + m), Q5_0 (x = d * (u - 16)), Q5_1 (x = d * u + m), IQ4_NL (x = d * book[u]): byte j of qs holds
# element j (low nibble) and j + 16 (high nibble); bit j of the little-endian 32-bit qh is element j's fifth bit.
Q4_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
Q5_0_BLOCK = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
Q5_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
IQ4_NL_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
IQ4_NL_BOOK = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)
assert (Q4_1_BLOCK.itemsize, Q5_0_BLOCK.itemsize, Q5_1_BLOCK.itemsize, IQ4_NL_BLOCK.itemsize) == (20, 22, 24, 18)
# MXFP4 (OCP Microscaling): an E8M0 exponent e, then nibbles as IQ4_NL's; x = 2^(e - 127) * E2M1(u), E2M1 decoded
# from its bits: sign (bit 3), exponent (bits 2..1; 0 is subnormal, m / 2), mantissa (bit 0).
MXFP4_BLOCK = np.dtype([("e", "u1"), ("qs", "u1", (16,))])
assert MXFP4_BLOCK.itemsize == 17


def e2m1(u: np.ndarray) -> np.ndarray:
    exp, mant = (u >> 1) & 3, (u & 1).astype(np.float64)
    mag = np.where(exp == 0, 0.5 * mant, (1.0 + 0.5 * mant) * np.exp2(exp.astype(np.float64) - 1))
    return np.where(u >= 8, -mag, mag)


def block32_u(b) -> np.ndarray:
    """[nb, 32] element codes of Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 blocks (with the fifth bit where there is one)."""
    qs = b["qs"].astype(np.int64)
    u = np.concatenate([qs & 15, qs >> 4], axis=1)
    if "qh" in b.dtype.names:
        u = u + 16 * ((b["qh"].astype(np.int64)[:, None] >> np.arange(32)[None, :]) & 1)
    return u
# K-quants: super-blocks of 256 elements.
#   Q4_K / Q5_K: eight sub-blocks of 32, x = d * sc * u - dmin * m, u in [0, 15] / [0, 31]; twelve bytes hold the
#   sixteen 6-bit sc and m; qs byte l of chunk c holds elements 64c + l (low nibble) and 64c + 32 + l (high);
#   Q5_K's qh[l] bit s is the fifth bit of sub-block s's element l.
#   Q6_K: x = d * scales[e // 16] * (u - 32), u in [0, 63], four bits from ql and two from qh (see dequantize).
Q4_K_BLOCK = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
Q5_K_BLOCK = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)),
                       ("qs", "u1", (128,))])
Q6_K_BLOCK = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])
#   Q2_K: sixteen sub-blocks of 16, x = d * (scales & 15) * u - dmin * (scales >> 4), u in [0, 3].
#   Q3_K: x = d * (sc - 32) * (u - 4), u in [0, 7] (third bit in hmask), sc 6 bits packed in twelve bytes.
#   Both: element 128h + 32g + l has its low two bits at bits 2g of qs[32h + l].
Q2_K_BLOCK = np.dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"), ("dmin", "<f2")])
Q3_K_BLOCK = np.dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)), ("d", "<f2")])
#   IQ4_XS: eight sub-blocks of 32, x = d * (ls - 32) * IQ4_NL_BOOK[u]; ls 6 bits: a nibble of scales_l[s // 2]
#   (low for even s) and bits 2s, 2s + 1 of scales_h; sub-block s's nibbles are qs[16s:16s + 16] as in IQ4_NL.
IQ4_XS_BLOCK = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))])
assert IQ4_XS_BLOCK.itemsize == 136
assert Q4_K_BLOCK.itemsize == 144 and Q5_K_BLOCK.itemsize == 176 and Q6_K_BLOCK.itemsize == 210
assert Q2_K_BLOCK.itemsize == 84 and Q3_K_BLOCK.itemsize == 110


def two_bit_planes(qs: np.ndarray) -> np.ndarray:
    """[nb, 64] Q2_K / Q3_K qs bytes -> [nb, 256] low two bits per element."""
    q = qs.astype(np.int64).reshape(-1, 2, 1, 32)  # [block, half, -, l]
    return ((q >> (2 * np.arange(4)[None, None, :, None])) & 3).reshape(-1, 256)


def k_scales_mins(scales: np.ndarray):
    """[nb, 12] packed bytes -> ([nb, 8] scales, [nb, 8] mins), as integers."""
    s = scales.astype(np.int64)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def dequantize_k(t, buf: np.ndarray) -> np.ndarray:
    if t == GGMLType.Q2_K:
        b = buf.view(Q2_K_BLOCK)
        u = two_bit_planes(b["qs"])
        sc = np.repeat((b["scales"] & 15).astype(np.float64), 16, axis=1)
        m = np.repeat((b["scales"] >> 4).astype(np.float64), 16, axis=1)
        return (b["d"].astype(np.float64)[:, None] * sc * u - b["dmin"].astype(np.float64)[:, None] * m).reshape(-1)
    if t == GGMLType.Q3_K:
        b = buf.view(Q3_K_BLOCK)
        low = two_bit_planes(b["qs"])
        e = np.arange(256)
        third = (b["hmask"].astype(np.int64)[:, e % 32] >> (e // 32)[None, :]) & 1
        s = b["scales"].astype(np.int64)
        j = np.arange(16)
        nibble = np.where(j < 8, s[:, j % 8] & 15, s[:, j % 8] >> 4)
        top = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        sc = np.repeat((nibble | (top << 4)) - 32, 16, axis=1).astype(np.float64)
        return (b["d"].astype(np.float64)[:, None] * sc * (low - 4 * (1 - third))).reshape(-1)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        b = buf.view(Q4_K_BLOCK if t == GGMLType.Q4_K else Q5_K_BLOCK)
        qs = b["qs"].astype(np.int64).reshape(-1, 4, 1, 32)
        u = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)  # sub-block 2c + (high nibble)
        if t == GGMLType.Q5_K:
            qh = b["qh"].astype(np.int64)[:, None, :]
            u = u + 16 * ((qh >> np.arange(8)[None, :, None]) & 1)
        sc, m = k_scales_mins(b["scales"])
        d = b["d"].astype(np.float64)[:, None, None]
        dmin = b["dmin"].astype(np.float64)[:, None, None]
        return (d * sc[:, :, None] * u - dmin * m[:, :, None]).reshape(-1)
    if t == GGMLType.IQ4_XS:
        b = buf.view(IQ4_XS_BLOCK)
        s = np.arange(8)
        ls = ((b["scales_l"].astype(np.int64)[:, s // 2] >> (4 * (s % 2))) & 15) | \
             (((b["scales_h"].astype(np.int64)[:, None] >> (2 * s)) & 3) << 4)
        qs = b["qs"].astype(np.int64).reshape(-1, 8, 16)
        u = np.concatenate([qs & 15, qs >> 4], axis=2)  # [block, sub-block, 32]
        d = b["d"].astype(np.float64)[:, None, None]
        return (d * (ls - 32)[:, :, None] * IQ4_NL_BOOK[u]).reshape(-1)
    b = buf.view(Q6_K_BLOCK)
    ql = b["ql"].astype(np.int64).reshape(-1, 2, 2, 32)  # [block, half, low 32 / high 32 bytes, l]
    qh = b["qh"].astype(np.int64).reshape(-1, 2, 32)
    groups = [ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4]  # elements 32g + l of a half
    u = np.stack([g | (((qh >> (2 * i)) & 3) << 4) for i, g in enumerate(groups)], axis=2).reshape(-1, 256)
    scale = np.repeat(b["scales"].astype(np.float64), 16, axis=1)
    return (b["d"].astype(np.float64)[:, None] * scale * (u - 32)).reshape(-1)


def dequantize(ggml_type: int, data, n_elements: int) -> np.ndarray:
    """Bytes of a tensor of the given type -> flat float64 array of n_elements."""
    t = GGMLType(ggml_type)
    buf = np.frombuffer(data, dtype=np.uint8, count=tensor_nbytes(t, n_elements))
    if t == GGMLType.F32:
        return buf.view("<f4").astype(np.float64)
    if t == GGMLType.F16:
        return buf.view("<f2").astype(np.float64)
    if t == GGMLType.BF16:
        return bf16_to_f64(buf.view("<u2"))
    if t == GGMLType.F64:
        return buf.view("<f8").astype(np.float64)
    if t in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64):
        return buf.view({GGMLType.I8: "<i1", GGMLType.I16: "<i2", GGMLType.I32: "<i4", GGMLType.I64: "<i8"}[t]).astype(np.float64)
    if t == GGMLType.Q8_0:
        b = buf.view(Q8_0_BLOCK)
        return (b["d"].astype(np.float64)[:, None] * b["qs"].astype(np.float64)).reshape(-1)
    if t == GGMLType.Q4_0:
        b = buf.view(Q4_0_BLOCK)
        lo = (b["qs"] & 15).astype(np.float64) - 8.0
        hi = (b["qs"] >> 4).astype(np.float64) - 8.0
        return (b["d"].astype(np.float64)[:, None] * np.concatenate([lo, hi], axis=1)).reshape(-1)
    if t in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS):
        return dequantize_k(t, buf)
    if t in (GGMLType.Q4_1, GGMLType.Q5_1):
        b = buf.view(Q4_1_BLOCK if t == GGMLType.Q4_1 else Q5_1_BLOCK)
        return (b["d"].astype(np.float64)[:, None] * block32_u(b) + b["m"].astype(np.float64)[:, None]).reshape(-1)
    if t == GGMLType.Q5_0:
        b = buf.view(Q5_0_BLOCK)
        return (b["d"].astype(np.float64)[:, None] * (block32_u(b) - 16)).reshape(-1)
    if t == GGMLType.IQ4_NL:
        b = buf.view(IQ4_NL_BLOCK)
        return (b["d"].astype(np.float64)[:, None] * IQ4_NL_BOOK[block32_u(b)]).reshape(-1)
    if t == GGMLType.MXFP4:
        b = buf.view(MXFP4_BLOCK)
        return (np.exp2(b["e"].astype(np.float64) - 127)[:, None] * e2m1(block32_u(b))).reshape(-1)
    raise NotImplementedError(f"dequantisation of {t.name} is not implemented in the reference")


def quantize(ggml_type: int, x: np.ndarray) -> bytes:
    """Flat values -> bytes of the given type, as ggml's reference quantisers do (in float32 arithmetic)."""
    t = GGMLType(ggml_type)
    x = np.ascontiguousarray(x).reshape(-1)
    if t == GGMLType.F32:
        return x.astype("<f4").tobytes()
    if t == GGMLType.F16:
        return x.astype("<f2").tobytes()
    if t == GGMLType.BF16:
        return f32_to_bf16(x.astype(np.float32)).astype("<u2").tobytes()
    if t == GGMLType.F64:
        return x.astype("<f8").tobytes()
    if t in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64):
        return x.astype({GGMLType.I8: "<i1", GGMLType.I16: "<i2", GGMLType.I32: "<i4", GGMLType.I64: "<i8"}[t]).tobytes()
    if t in (GGMLType.Q8_0, GGMLType.Q4_0):
        if x.size % 32:
            raise ValueError(f"{t.name}: {x.size} elements is not a multiple of 32")
        xb = x.astype(np.float32).reshape(-1, 32)
        with np.errstate(divide="ignore"):
            if t == GGMLType.Q8_0:
                amax = np.abs(xb).max(axis=1)
                d = amax / np.float32(127)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                v = xb * inv[:, None]
                q = np.trunc(v + np.copysign(np.float32(0.5), v))  # roundf: half away from zero
                out = np.empty(len(xb), Q8_0_BLOCK)
                out["d"] = d.astype(np.float16)
                out["qs"] = q.astype(np.int8)
            else:
                idx = np.abs(xb).argmax(axis=1)  # first index of the largest magnitude, as ggml's scan
                mx = xb[np.arange(len(xb)), idx]
                d = mx / np.float32(-8)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                # ggml: MIN(15, (int8_t)(x * id + 8.5f)); the cast truncates toward zero
                q = np.minimum(15, np.trunc(xb * inv[:, None] + np.float32(8.5)).astype(np.int8).astype(np.int32))
                out = np.empty(len(xb), Q4_0_BLOCK)
                out["d"] = d.astype(np.float16)
                out["qs"] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
        return out.tobytes()
    raise NotImplementedError(f"quantisation to {t.name} is not implemented in the reference")


# --------------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------------

@dataclass
class TensorInfo:
    name: str
    dims: tuple          # GGUF order, innermost first: (ne0, ne1, ...)
    ggml_type: GGMLType
    offset: int          # relative to the start of the data section
    data_start: int      # absolute file offset of the tensor data

    @property
    def shape(self) -> tuple:
        """numpy shape: dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, self.n_elements)


class GGUFError(ValueError):
    pass


class GGUFReader:
    def __init__(self, path: str):
        self.path = path
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        self.buf = memoryview(self.data)
        self.pos = 0
        if bytes(self._take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        self.version = self._u32()
        if self.version != GGUF_VERSION:
            raise GGUFError(f"{path}: GGUF version {self.version} is not supported (only 3)")
        n_tensors = self._u64()
        n_kv = self._u64()

        self.metadata: dict = {}
        self.metadata_types: dict = {}  # key -> GGUFValueType; for arrays, (ARRAY, element type)
        for _ in range(n_kv):
            key = self._string()
            vtype = GGUFValueType(self._u32())
            if key in self.metadata:
                raise GGUFError(f"{path}: duplicate metadata key {key!r}")
            value, full_type = self._value(vtype)
            self.metadata[key] = value
            self.metadata_types[key] = full_type

        self.alignment = int(self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{path}: general.alignment {self.alignment} is not a power of two")

        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._u32()
            dims = tuple(self._u64() for _ in range(n_dims))
            ggml_type = GGMLType(self._u32())
            offset = self._u64()
            infos.append((name, dims, ggml_type, offset))

        self.data_offset = _align(self.pos, self.alignment)
        self.tensors: dict = {}
        for name, dims, ggml_type, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"{path}: duplicate tensor {name!r}")
            if offset % self.alignment:
                raise GGUFError(f"{path}: tensor {name!r} offset {offset} is not aligned to {self.alignment}")
            info = TensorInfo(name, dims, ggml_type, offset, self.data_offset + offset)
            if info.data_start + info.nbytes > len(self.data):
                raise GGUFError(f"{path}: tensor {name!r} runs past the end of the file")
            self.tensors[name] = info

    # -- primitive reads -----------------------------------------------------------------------------
    def _take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: unexpected end of file at byte {self.pos}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def _u32(self) -> int:
        return struct.unpack("<I", self._take(4))[0]

    def _u64(self) -> int:
        return struct.unpack("<Q", self._take(8))[0]

    def _string(self) -> str:
        n = self._u64()
        return bytes(self._take(n)).decode("utf-8", errors="surrogateescape")

    def _value(self, vtype: GGUFValueType):
        """Returns (python value, type description)."""
        if vtype == GGUFValueType.STRING:
            return self._string(), vtype
        if vtype == GGUFValueType.ARRAY:
            etype = GGUFValueType(self._u32())
            count = self._u64()
            if etype in _SCALAR_DTYPES:  # fast path: one numpy read for the whole array
                dt = _SCALAR_DTYPES[etype]
                arr = np.frombuffer(self._take(count * dt.itemsize), dtype=dt)
                values = [bool(v) for v in arr] if etype == GGUFValueType.BOOL else arr.tolist()
                return values, (GGUFValueType.ARRAY, etype)
            values, etypes = [], None
            for _ in range(count):
                v, t = self._value(etype)
                values.append(v)
                etypes = t
            return values, (GGUFValueType.ARRAY, etypes if etypes is not None else etype)
        dt = _SCALAR_DTYPES[vtype]
        v = np.frombuffer(self._take(dt.itemsize), dtype=dt)[0]
        if vtype == GGUFValueType.BOOL:
            return bool(v), vtype
        return v.item(), vtype

    # -- tensors -------------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The bytes of a tensor, as a read-only uint8 view of the mapped file."""
        info = self.tensors[name]
        return self.data[info.data_start:info.data_start + info.nbytes]

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantised to float64, in numpy shape (GGUF dims reversed)."""
        info = self.tensors[name]
        return dequantize(info.ggml_type, self.raw(name), info.n_elements).reshape(info.shape)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# --------------------------------------------------------------------------------------------------
# Writer (for test fixtures)
# --------------------------------------------------------------------------------------------------

def _pack_value(vtype, value) -> bytes:
    """vtype: a GGUFValueType, or (ARRAY, element type) where the element type may again be a tuple."""
    if isinstance(vtype, tuple):
        outer, etype = vtype
        if outer != GGUFValueType.ARRAY:
            raise ValueError(f"bad type {vtype!r}")
        etag = etype[0] if isinstance(etype, tuple) else etype
        out = [struct.pack("<IQ", int(etag), len(value))]
        if not isinstance(etype, tuple) and etype in _SCALAR_DTYPES:
            out.append(np.asarray(value).astype(_SCALAR_DTYPES[etype]).tobytes())
        else:
            out.extend(_pack_value(etype, v) for v in value)
        return b"".join(out)
    vtype = GGUFValueType(vtype)
    if vtype == GGUFValueType.STRING:
        b = value.encode("utf-8", errors="surrogateescape") if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(b)) + b
    if vtype == GGUFValueType.ARRAY:
        raise ValueError("an array needs its element type: use (GGUFValueType.ARRAY, element_type)")
    return np.array(value).astype(_SCALAR_DTYPES[vtype]).tobytes()


def _infer_type(value):
    """Type of a plain python value: bool, int (INT32, or INT64 if it does not fit), float (FLOAT32),
    str, list (element type from the first element; empty lists need an explicit type)."""
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        return GGUFValueType.INT32 if -2**31 <= int(value) < 2**31 else GGUFValueType.INT64
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("cannot infer the element type of an empty array")
        return (GGUFValueType.ARRAY, _infer_type(value[0]))
    raise ValueError(f"cannot infer the GGUF type of {value!r}")


def write_gguf(path: str, metadata: dict, tensors: dict, alignment: int | None = None) -> None:
    """Write a GGUF v3 file.

    metadata: key -> (value_type, value), value_type a GGUFValueType or, for arrays,
              (GGUFValueType.ARRAY, element_type) (nested for arrays of arrays); a bare value is
              typed by _infer_type.
    tensors:  name -> (ggml_type, array) or a bare array (F32). The array is in numpy shape; its
              GGUF dims are the reversed shape. It is converted/quantised to ggml_type.
    alignment: written as general.alignment (u32) when given and not already in metadata.
    """
    md = dict(metadata)
    if alignment is not None and "general.alignment" not in md:
        md["general.alignment"] = (GGUFValueType.UINT32, alignment)
    align = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in md:
        a = md["general.alignment"]
        align = int(a[1] if isinstance(a, tuple) else a)

    head = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(md))]
    for key, entry in md.items():
        vtype, value = entry if isinstance(entry, tuple) and len(entry) == 2 and \
            isinstance(entry[0], (GGUFValueType, tuple)) else (_infer_type(entry), entry)
        head.append(_pack_value(GGUFValueType.STRING, key))
        head.append(struct.pack("<I", int(vtype[0] if isinstance(vtype, tuple) else vtype)))
        head.append(_pack_value(vtype, value))

    blobs, offset = [], 0
    for name, entry in tensors.items():
        ggml_type, arr = entry if isinstance(entry, tuple) else (GGMLType.F32, entry)
        arr = np.asarray(arr)
        dims = tuple(reversed(arr.shape)) if arr.ndim else (1,)
        data = quantize(ggml_type, arr)
        head.append(_pack_value(GGUFValueType.STRING, name))
        head.append(struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
        head.append(struct.pack("<IQ", int(ggml_type), offset))
        pad = _align(len(data), align) - len(data)
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad

    header = b"".join(head)
    header += b"\0" * (_align(len(header), align) - len(header))
    with open(path, "wb") as f:
        f.write(header)
        for b in blobs:
            f.write(b)


def main(argv=None) -> int:
    """Print a GGUF's metadata and tensor table: python3 gguf.py FILE.gguf"""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: gguf.py FILE.gguf", file=sys.stderr)
        return 2
    f = GGUFReader(args[0])
    print(f"GGUF v{f.version}, {len(f.metadata)} metadata keys, {len(f.tensors)} tensors, "
          f"alignment {f.alignment}, data at {f.data_offset}")
    for k, v in f.metadata.items():
        t = f.metadata_types[k]
        tname = f"{t[0].name}[{t[1].name if not isinstance(t[1], tuple) else 'ARRAY'}]" if isinstance(t, tuple) else t.name
        if isinstance(v, list):
            shown = repr(v[:8])[:-1] + (", ...]" if len(v) > 8 else "]")
            print(f"  {k}: {tname} (n={len(v)}) {shown}")
        else:
            print(f"  {k}: {tname} = {v!r}")
    for info in f.tensors.values():
        print(f"  {info.name}: {info.ggml_type.name} dims={list(info.dims)} offset={info.offset}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
