//! The text of a GPU or MIG UUID, as nvidia-smi and `CUDA_VISIBLE_DEVICES` spell it:
//! `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`. Written by the guard (the UUID of the device a
//! process sees, into a stack buffer) and by `rankguard gpus`/`check`, from this one function.

use std::fmt::{self, Write};

/// Which kind of device a UUID names: its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UuidKind {
    /// A whole GPU (`GPU-`).
    Gpu,
    /// A MIG instance (`MIG-`).
    Mig,
}

impl UuidKind {
    pub fn prefix(self) -> &'static str {
        match self {
            UuidKind::Gpu => "GPU-",
            UuidKind::Mig => "MIG-",
        }
    }
}

/// The length of a UUID's text (prefix included).
pub const UUID_TEXT_LEN: usize = 40;

/// Write `kind`'s prefix and the 16 bytes as 8-4-4-4-12 lowercase hex digits. Allocates
/// nothing: the guard writes it into a stack buffer.
pub fn write_uuid<W: Write>(w: &mut W, kind: UuidKind, bytes: &[u8; 16]) -> fmt::Result {
    // Digit by digit from a table, not `{:02x}` per byte: the exporter writes a UUID at
    // every export (PyTorch: one per share of a tensor), and sixteen formatting calls cost
    // more than the rest of its record's text.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    w.write_str(kind.prefix())?;
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            w.write_char('-')?;
        }
        w.write_char(char::from(HEX[usize::from(b >> 4)]))?;
        w.write_char(char::from(HEX[usize::from(b & 0xf)]))?;
    }
    Ok(())
}

/// [`write_uuid`] into a new string.
pub fn uuid_text(kind: UuidKind, bytes: &[u8; 16]) -> String {
    let mut s = String::with_capacity(UUID_TEXT_LEN);
    let _ = write_uuid(&mut s, kind, bytes);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_like_nvidia_smi() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&[0x12, 0xc0, 0xff, 0xee]);
        b[6] = 0x40;
        b[8] = 0x80;
        b[15] = 2;
        let t = uuid_text(UuidKind::Gpu, &b);
        assert_eq!(t, "GPU-12c0ffee-0000-4000-8000-000000000002");
        assert_eq!(t.len(), UUID_TEXT_LEN);
        assert!(crate::rankgpu::is_full_uuid(&t));
        assert!(uuid_text(UuidKind::Mig, &b).starts_with("MIG-12c0ffee-"));
    }
}
