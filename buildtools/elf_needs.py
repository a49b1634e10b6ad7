"""What a shared library needs from others, and what it defines: its ELF dynamic section, symbols and
symbol versions (.dynsym, .gnu.version, .gnu.version_r, .gnu.version_d).

setup.py uses it to check that every build of libnvshare.so needs no glibc newer than
MANYLINUX_BASELINE and to tag the wheel with it; buildtools/glibc_floor.py to find which of the hook's
references a gcc build must bind to older versions, and the build machine's glibc's older versions of
them; tests/hook/test_wheel.py and tests/hook/test_glibc_floor.py to check the results. Pure Python on
purpose: it runs in pip's build environment, where neither pyelftools nor binutils can be assumed.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import NamedTuple

SHT_DYNSYM = 11
SHT_DYNAMIC = 6
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
DT_NEEDED = 1
# glibc 2.17: EL7 / CentOS 7 (2.17), Ubuntu 18.04 (2.27), EL8 (2.28), Ubuntu 20.04 and Debian 11 (2.31),
# and newer. manylinux2014's floor on x86_64 and aarch64 alike (aarch64's first glibc was 2.17).
MANYLINUX_BASELINE = (2, 17)


class DynamicSymbol(NamedTuple):
    name: str
    version: str | None     # GLIBC_2.2.5, ...; None for an unversioned symbol
    defined: bool           # False: a reference to another library
    default: bool           # a definition's default version (name@@V), or a reference


class _Elf:
    """The sections of one 64-bit little-endian ELF file, and their strings."""

    def __init__(self, path: str | Path) -> None:
        self.data = data = Path(path).read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        # (type, offset, size, link, info, entsize) of each section
        self.sections = [(s[1], s[4], s[5], s[6], s[7], s[9]) for s in (
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum))]

    def of_type(self, kind: int) -> list[tuple[int, int, int, int, int, int]]:
        return [s for s in self.sections if s[0] == kind]

    def string(self, table: int, at: int) -> str:
        """The string at `at` in the string table that is section `table`."""
        start = self.sections[table][1] + at
        return self.data[start:self.data.index(b"\0", start)].decode()

    def version_names(self) -> dict[int, str]:
        """.gnu.version's indexes -> names, both needed (version_r) and defined (version_d)."""
        names: dict[int, str] = {}
        for _kind, offset, _size, link, count, _entsize in self.of_type(SHT_GNU_VERNEED):
            entry = offset
            for _ in range(count):
                _version, aux_count, _file, aux, next_entry = struct.unpack_from("<HHIII", self.data, entry)
                at = entry + aux
                for _ in range(aux_count):
                    _hash, _vflags, index, name_at, next_aux = struct.unpack_from("<IHHII", self.data, at)
                    names[index] = self.string(link, name_at)
                    at += next_aux
                entry += next_entry
        for _kind, offset, _size, link, count, _entsize in self.of_type(SHT_GNU_VERDEF):
            entry = offset
            for _ in range(count):
                _version, _flags, index, _cnt, _hash, aux, next_entry = struct.unpack_from(
                    "<HHHHIII", self.data, entry)
                name_at, = struct.unpack_from("<I", self.data, entry + aux)
                names[index] = self.string(link, name_at)
                entry += next_entry
        return names


def needed_versions(path: str | Path) -> dict[str, set[str]]:
    """{'libc.so.6': {'GLIBC_2.2.5', ...}, ...}: every version the library needs, by the file named."""
    elf = _Elf(path)
    out: dict[str, set[str]] = {}
    for _kind, offset, _size, link, count, _entsize in elf.of_type(SHT_GNU_VERNEED):
        entry = offset
        for _ in range(count):
            _version, aux_count, file_at, aux, next_entry = struct.unpack_from("<HHIII", elf.data, entry)
            names = out.setdefault(elf.string(link, file_at), set())
            at = entry + aux
            for _ in range(aux_count):
                _hash, _vflags, _other, name_at, next_aux = struct.unpack_from("<IHHII", elf.data, at)
                names.add(elf.string(link, name_at))
                at += next_aux
            entry += next_entry
    return out


def needed_libraries(path: str | Path) -> list[str]:
    """The DT_NEEDED entries, in order: the libraries ld.so loads with this one."""
    elf = _Elf(path)
    out = []
    for _kind, offset, size, link, _info, _entsize in elf.of_type(SHT_DYNAMIC):
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", elf.data, at)
            if tag == DT_NEEDED:
                out.append(elf.string(link, value))
    return out


def dynamic_symbols(path: str | Path) -> list[DynamicSymbol]:
    """Every named symbol of .dynsym with its version: what the library defines and what it needs."""
    elf = _Elf(path)
    names = elf.version_names()
    versym = elf.of_type(SHT_GNU_VERSYM)
    out = []
    for _kind, offset, size, link, _info, entsize in elf.of_type(SHT_DYNSYM):
        for i in range(1, size // entsize):
            name_at, _info_byte, _other, shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", elf.data, offset + i * entsize)
            index = struct.unpack_from("<H", elf.data, versym[0][1] + 2 * i)[0] if versym else 1
            # 0 local, 1 global (unversioned); bit 15: a hidden (non-default) definition
            version = names.get(index & 0x7FFF) if (index & 0x7FFF) > 1 else None
            out.append(DynamicSymbol(elf.string(link, name_at), version, shndx != 0,
                                     shndx == 0 or not index & 0x8000))
    return out


def glibc_version(name: str | None) -> tuple[int, ...] | None:
    """GLIBC_2.3.4 -> (2, 3, 4); None for anything else (GLIBC_PRIVATE, other libraries' versions)."""
    m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)+)", name or "")
    return tuple(int(x) for x in m[1].split(".")) if m else None


def glibc_needed(path: str | Path) -> tuple[int, int]:
    """The newest GLIBC_x.y the library needs (from any of glibc's libraries), (2, 2) when none."""
    newest = (2, 2)
    for names in needed_versions(path).values():
        for name in names:
            version = glibc_version(name)
            if version:
                newest = max(newest, (version[0], version[1]))
    return newest


def symbols_above(path: str | Path, floor: tuple[int, int] = MANYLINUX_BASELINE) -> list[str]:
    """`name@GLIBC_x.y` for each glibc symbol the library references at a version newer than floor."""
    return sorted(f"{s.name}@{s.version}" for s in dynamic_symbols(path)
                  if not s.defined and (glibc_version(s.version) or ())[:2] > floor)
