"""The symbol versions a shared library needs from others (its ELF .gnu.version_r section).

setup.py uses it to tag a wheel with the manylinux baseline that its libnvshare.so really needs, and
tests/hook/test_wheel.py to fail when a build needs a newer glibc than that baseline. Pure Python on
purpose: it runs in pip's build environment, where neither pyelftools nor binutils can be assumed.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

SHT_GNU_VERNEED = 0x6FFFFFFE
MANYLINUX_BASELINE = (2, 28)   # EL8, Ubuntu 20.04 (2.31), Debian 11 (2.31) and newer


def needed_versions(path: str | Path) -> dict[str, set[str]]:
    """{'libc.so.6': {'GLIBC_2.2.5', ...}, ...}: every version the library needs, by the file named."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out: dict[str, set[str]] = {}
    for _name, kind, _flags, _addr, offset, _size, link, count, _align, _entsize in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][4]

        def string(at: int, strtab: int = strtab) -> str:     # this section's table, bound now
            end = data.index(b"\0", strtab + at)
            return data[strtab + at:end].decode()

        entry = offset
        for _ in range(count):
            _version, aux_count, file_at, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
            names = out.setdefault(string(file_at), set())
            at = entry + aux
            for _ in range(aux_count):
                _hash, _vflags, _other, name_at, next_aux = struct.unpack_from("<IHHII", data, at)
                names.add(string(name_at))
                at += next_aux
            entry += next_entry
    return out


def glibc_needed(path: str | Path) -> tuple[int, int]:
    """The newest GLIBC_x.y the library needs (from any of glibc's libraries), (2, 2) when none."""
    newest = (2, 2)
    for names in needed_versions(path).values():
        for name in names:
            m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", name)
            if m:
                newest = max(newest, (int(m[1]), int(m[2])))
    return newest
