//! A function's name from an object file's own `.symtab`, for addresses `dladdr` cannot
//! name (a program's `main` is in `.symtab` but not in the dynamic symbol table).
//!
//! Cold path only (a full violation record, a site's first sight). The last object read is
//! cached; the cache is taken with `try_lock`, so a thread that finds it busy (or a fork
//! child that inherited it locked) never waits: it reads the file itself.
use std::fmt::Write;
use std::io::Read;
use std::sync::Mutex;

/// Section tables larger than this are not read (a name is a nicety, not worth 100 MB).
const MAX_TABLE: u64 = 64 << 20;

struct Syms {
    path: String,
    /// ELF type: ET_EXEC symbols are absolute addresses, others are relative to the base.
    exec: bool,
    /// (start, size, name offset), sorted by start.
    funcs: Vec<(u64, u64, u32)>,
    strtab: Vec<u8>,
}

static CACHE: Mutex<Option<Syms>> = Mutex::new(None);

/// The function containing `addr` (loaded at `base`) in the object file at `path`: its name
/// into `out`, and `addr`'s offset from its start. The same answer whoever asks: a thread
/// that finds the cache busy reads the file itself rather than going without the name (a
/// site's text must not depend on timing: the report groups by it).
pub fn lookup<W: Write>(path: &str, base: usize, addr: usize, out: &mut W) -> Option<usize> {
    let Ok(mut guard) = CACHE.try_lock() else {
        return find(&read(path)?, base, addr, out);
    };
    if guard.as_ref().is_none_or(|s| s.path != path) {
        *guard = Some(read(path).unwrap_or(Syms {
            path: path.to_string(),
            exec: false,
            funcs: Vec::new(),
            strtab: Vec::new(),
        }));
    }
    find(guard.as_ref()?, base, addr, out)
}

fn find<W: Write>(s: &Syms, base: usize, addr: usize, out: &mut W) -> Option<usize> {
    let target = if s.exec {
        addr as u64
    } else {
        (addr as u64).wrapping_sub(base as u64)
    };
    let i = s.funcs.partition_point(|&(start, _, _)| start <= target);
    let &(start, size, name) = s.funcs.get(i.checked_sub(1)?)?;
    if target >= start.saturating_add(size) {
        return None;
    }
    let rest = s.strtab.get(name as usize..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    let _ = out.write_str(std::str::from_utf8(&rest[..end]).ok()?);
    Some((target - start) as usize)
}

fn u16_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?) as u64)
}
fn u32_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?) as u64)
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn read_at(f: &mut std::fs::File, off: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::Seek;
    if len > MAX_TABLE {
        return None;
    }
    f.seek(std::io::SeekFrom::Start(off)).ok()?;
    let mut v = vec![0u8; len as usize];
    f.read_exact(&mut v).ok()?;
    Some(v)
}

/// Parse an ELF64 little-endian file's `.symtab` function symbols.
fn read(path: &str) -> Option<Syms> {
    let mut f = std::fs::File::open(path).ok()?;
    let h = read_at(&mut f, 0, 64)?;
    // ELF64 (class 2), little-endian (data 1). A pattern, not indexing: each index keeps a
    // panic location, a relocation in every process that loads the guard.
    if !matches!(h.get(..6), Some([0x7f, b'E', b'L', b'F', 2, 1])) {
        return None;
    }
    let exec = u16_at(&h, 16)? == 2;
    let (shoff, shentsize, shnum) = (u64_at(&h, 40)?, u16_at(&h, 58)?, u16_at(&h, 60)?);
    if shentsize < 64 || shnum == 0 {
        return None;
    }
    let sh = read_at(&mut f, shoff, shentsize * shnum)?;
    let sec = |i: u64| -> Option<(u64, u64, u64, u64)> {
        let o = (i * shentsize) as usize;
        // (type, offset, size, link)
        Some((
            u32_at(&sh, o + 4)?,
            u64_at(&sh, o + 24)?,
            u64_at(&sh, o + 32)?,
            u32_at(&sh, o + 40)?,
        ))
    };
    let symtab = (0..shnum).find(|&i| sec(i).is_some_and(|s| s.0 == 2))?;
    let (_, off, size, link) = sec(symtab)?;
    let (_, stroff, strsize, _) = sec(link)?;
    let syms = read_at(&mut f, off, size)?;
    let strtab = read_at(&mut f, stroff, strsize)?;
    let mut funcs = Vec::new();
    for e in syms.chunks_exact(24) {
        let info = e[4];
        let (name, value, sz) = (u32_at(e, 0)?, u64_at(e, 8)?, u64_at(e, 16)?);
        // STT_FUNC, defined, with a size.
        if info & 0xf == 2 && u16_at(e, 6)? != 0 && sz > 0 && value != 0 {
            funcs.push((value, sz, name as u32));
        }
    }
    funcs.sort_unstable();
    Some(Syms {
        path: path.to_string(),
        exec,
        funcs,
        strtab,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_function_of_this_test_binary() {
        // This test binary has a .symtab (debug build or release with symbols).
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let s = read(exe.to_str().unwrap()).expect("the test binary has a .symtab");
        assert!(!s.funcs.is_empty());
        assert!(read("/nonexistent").is_none());
        assert!(read("/proc/self/cmdline").is_none());
    }
}
