"""Reading the registry's handle table (crates/core/src/handle_table.rs) from a test: the
records of exported 64-byte IPC handles (memory, events), in fixed slots of one shared
file, not a file each."""
from __future__ import annotations

import os
import struct

FILE_NAME = "handles.table"
SLOTS, SLOT_WORDS, HEADER_WORDS = 4096, 64, 512
FULL = 2


def records(registry) -> list[tuple[int, str]]:
    """(owner pid, record text) of each record in REGISTRY's handle table (none: no table)."""
    path = os.path.join(registry, FILE_NAME)
    try:
        data = open(path, "rb").read()
    except FileNotFoundError:
        return []
    assert len(data) == (HEADER_WORDS + SLOTS * SLOT_WORDS) * 8, len(data)
    assert data[:16] == b"rankguard-handle", data[:16]
    out = []
    for i in range(SLOTS):
        at = (HEADER_WORDS + i * SLOT_WORDS) * 8
        state, length = struct.unpack_from("<QQ", data, at)
        if state & 3 == FULL:
            # The second word: the text's length, the handle's kind in bits 32-39.
            length &= 0xFFFFFFFF
            text = data[at + 80: at + 80 + length].decode()
            out.append((state >> 32, text))
    return out


def names(registry, prefix: str = "") -> list[str]:
    """The handle records in REGISTRY whose names start with PREFIX (`event-`, `mem-`, ...):
    the handle table's, by the name their file would have, and the record files (a handle
    whose slots were all taken is written as a file). Not rank records, the overflow mark,
    a writer's temporary file or the table itself."""
    out = [t.split("\nkey ", 1)[1].split("\n", 1)[0] for _, t in records(registry)]
    out += [n for n in os.listdir(registry)
            if not n.startswith(("rank-", "overflow", ".tmp")) and n != FILE_NAME]
    return sorted(n for n in out if n.startswith(prefix))


def create(registry, full=()) -> None:
    """Write REGISTRY's handle table as the guard creates it (its header, mode 0600), with
    the slots numbered in FULL holding a record each (a doctor test counts them)."""
    data = bytearray((HEADER_WORDS + SLOTS * SLOT_WORDS) * 8)
    data[:16] = b"rankguard-handle"
    struct.pack_into("<QQ", data, 16, 1, (SLOTS << 16) | SLOT_WORDS)
    for i in full:
        struct.pack_into("<Q", data, (HEADER_WORDS + i * SLOT_WORDS) * 8, (os.getpid() << 32) | (1 << 2) | FULL)
    path = os.path.join(registry, FILE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def rewrite(registry, change) -> int:
    """Replace the text of each record in REGISTRY's handle table by CHANGE(text), its length
    word with it (a tampering test); returns how many were changed."""
    path = os.path.join(registry, FILE_NAME)
    data = bytearray(open(path, "rb").read())
    n = 0
    for i in range(SLOTS):
        at = (HEADER_WORDS + i * SLOT_WORDS) * 8
        state, word = struct.unpack_from("<QQ", data, at)
        if state & 3 != FULL:
            continue
        new = change(bytes(data[at + 80: at + 80 + (word & 0xFFFFFFFF)]))
        assert len(new) <= (SLOT_WORDS - 10) * 8
        struct.pack_into("<Q", data, at + 8, (word & ~0xFFFFFFFF) | len(new))
        data[at + 80: at + 80 + len(new)] = new
        n += 1
    with open(path, "r+b") as f:
        f.write(data)
    return n
