#!/usr/bin/env python3
"""Writes the .npy/.npz fixtures under tests/data/npy/ with numpy itself, so that
tests/unit/npy_test.cc checks kiln's reader against real numpy output (and kiln's writer
byte for byte against np.save). Deterministic: fixed values, fixed zip timestamps.

Run: .venv/bin/python tests/data/make_npy_fixtures.py   (rewrites tests/data/npy/)
The values here are repeated in npy_test.cc; change both together.
"""
import io
import os
import sys
import time
import zipfile

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npy")

# Zip members carry a timestamp; pin it so the archives are byte-identical between runs.
_FIXED = time.struct_time((2020, 1, 2, 3, 4, 6, 3, 2, 0))
time.localtime = lambda *args: _FIXED

# One 2x3 array per dtype; the values exercise sign, fractions and each type's extremes.
VALUES = {
    "f32": (np.float32, [0.0, 1.5, -2.25, 3.0, -4.5, 0.125]),
    "f16": (np.float16, [0.0, 1.5, -2.25, 3.0, -4.5, 0.125]),
    "f64": (np.float64, [0.0, 1.5, -2.25, 3.0, -4.5, 1e300]),
    "i8": (np.int8, [0, 1, -2, 3, -128, 127]),
    "u8": (np.uint8, [0, 1, 2, 3, 128, 255]),
    "i16": (np.int16, [0, 1, -2, 3, -32768, 32767]),
    "u16": (np.uint16, [0, 1, 2, 3, 32768, 65535]),
    "i32": (np.int32, [0, 1, -2, 3, -2**31, 2**31 - 1]),
    "u32": (np.uint32, [0, 1, 2, 3, 2**31, 2**32 - 1]),
    "i64": (np.int64, [0, 1, -2, 3, -2**63, 2**63 - 1]),
    "u64": (np.uint64, [0, 1, 2, 3, 2**63, 2**64 - 1]),
    "bool": (np.bool_, [True, False, True, True, False, False]),
}


def save(name, array):
    np.save(os.path.join(OUT, name), array)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        if name.endswith((".npy", ".npz")):
            os.remove(os.path.join(OUT, name))

    for name, (dtype, values) in VALUES.items():
        save(f"{name}.npy", np.array(values, dtype=dtype).reshape(2, 3))

    # Fortran order: element [i, j, k] = 100*i + 10*j + k, stored column-major.
    grid = np.fromfunction(lambda i, j, k: 100 * i + 10 * j + k, (2, 3, 4))
    save("fortran_f32.npy", np.asfortranarray(grid.astype(np.float32)))
    save("fortran_i16.npy", np.asfortranarray(grid.astype(np.int16)))
    # Big-endian: the same 2x3 values as above, byte order '>'.
    for name in ("f32", "f16", "f64", "i64", "u16", "i32"):
        dtype, values = VALUES[name]
        save(f"be_{name}.npy", np.array(values, dtype=np.dtype(dtype).newbyteorder(">")).reshape(2, 3))
    # A big-endian Fortran array: both conversions at once.
    save("fortran_be_i32.npy", np.asfortranarray(grid.astype(">i4")))
    save("scalar_f64.npy", np.array(2.5, dtype=np.float64))
    save("empty_0x3_f32.npy", np.zeros((0, 3), dtype=np.float32))
    save("empty_3x0_i64.npy", np.zeros((3, 0), dtype=np.int64))
    save("vector_i32.npy", np.arange(5, dtype=np.int32))
    # Header format versions 2.0 and 3.0 (numpy picks them only for huge headers).
    for version in ((2, 0), (3, 0)):
        with open(os.path.join(OUT, f"v{version[0]}_f32.npy"), "wb") as f:
            np.lib.format.write_array(f, np.array([1.0, -2.0, 3.5], dtype=np.float32), version=version)
    # Rejected by kiln: object, string and structured arrays.
    save("object.npy", np.array([1, "a", None], dtype=object))
    save("unicode.npy", np.array(["ab", "c"]))
    save("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))

    arrays = {
        "x": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
        "ids": np.array([7, 8, 9], dtype=np.int64),
        "mask": np.array([True, False], dtype=np.bool_),
    }
    np.savez(os.path.join(OUT, "stored.npz"), **arrays)
    np.savez_compressed(os.path.join(OUT, "compressed.npz"), **arrays)
    # zip64 records everywhere (numpy writes them only past 4 GiB): lower zipfile's limits so
    # Python's own zip64 code writes the central-directory extras and zip64 end records.
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0
    try:
        np.savez(os.path.join(OUT, "zip64.npz"), **arrays)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved
    # The archive must still be readable by numpy and carry a zip64 end record.
    data = open(os.path.join(OUT, "zip64.npz"), "rb").read()
    assert b"PK\x06\x06" in data and b"PK\x06\x07" in data, "no zip64 end record"
    with np.load(os.path.join(OUT, "zip64.npz")) as z:
        assert np.array_equal(z["ids"], arrays["ids"])
    # Positional arrays get numpy's default names arr_0, arr_1.
    np.savez(os.path.join(OUT, "positional.npz"), np.arange(3, dtype=np.uint8), np.float16(1.5))

    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {OUT}")
    assert total < 50_000


if __name__ == "__main__":
    sys.exit(main())
