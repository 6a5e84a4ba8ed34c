"""The glibc symbol versions an ELF file needs, read from its version-needed section
(SHT_GNU_verneed): exactly what the dynamic loader checks before it loads the file (a
library needing `GLIBC_2.34` is refused by glibc 2.28 with "version `GLIBC_2.34' not
found"). Pure Python, so the floor test needs no binutils. Layouts: ELF-64 little-endian,
`<elf.h>` Elf64_Ehdr, Elf64_Shdr, Elf64_Verneed, Elf64_Vernaux."""
from __future__ import annotations

import pathlib
import re
import struct

SHT_GNU_VERNEED = 0x6FFFFFFE


def _sections(path: pathlib.Path) -> tuple[bytes, list[tuple[int, int, int, int, int]]]:
    """The file's bytes and its section headers as (sh_type, sh_offset, sh_size, sh_link,
    sh_info), in order (Elf64_Shdr)."""
    data = pathlib.Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not an ELF-64 little-endian file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info
        _, sh_type, _, _, sh_offset, sh_size, sh_link, sh_info = struct.unpack_from(
            "<IIQQQQII", data, e_shoff + i * e_shentsize)
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_info))
    return data, sections


def needed_versions(path: pathlib.Path) -> dict[str, set[str]]:
    """{needed file name: {version names}} of an ELF-64 LE file, e.g.
    {"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.28"}}."""
    data, sections = _sections(path)
    out: dict[str, set[str]] = {}
    for sh_type, sh_offset, _, sh_link, sh_info in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = sections[sh_link][1]

        def cstr(o: int) -> str:
            end = data.index(b"\0", strtab + o)
            return data[strtab + o:end].decode()

        vn = sh_offset
        for _ in range(sh_info):  # sh_info: number of Verneed entries
            _, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, vn)
            names = out.setdefault(cstr(vn_file), set())
            aux = vn + vn_aux
            for _ in range(vn_cnt):
                _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                names.add(cstr(vna_name))
                aux += vna_next
            if vn_next == 0:
                break
            vn += vn_next
    return out


def glibc_versions(path: pathlib.Path) -> list[tuple[int, ...]]:
    """Every GLIBC_x.y[.z] version the file needs, as sorted tuples."""
    found = set()
    for names in needed_versions(path).values():
        for n in names:
            m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)+)", n)
            if m:
                found.add(tuple(int(x) for x in m.group(1).split(".")))
    return sorted(found)


SHT_DYNAMIC = 6
DT_NULL, DT_NEEDED = 0, 1


def needed_libraries(path: pathlib.Path) -> list[str]:
    """The DT_NEEDED entries of an ELF-64 LE file's dynamic section, in order: the
    libraries the loader maps with it (`readelf -d`'s "NEEDED" lines)."""
    data, sections = _sections(path)
    out = []
    for sh_type, sh_offset, sh_size, sh_link, _ in sections:
        if sh_type != SHT_DYNAMIC:
            continue
        strtab = sections[sh_link][1]
        for off in range(sh_offset, sh_offset + sh_size, 16):  # Elf64_Dyn: d_tag, d_val
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                end = data.index(b"\0", strtab + val)
                out.append(data[strtab + val:end].decode())
    return out
