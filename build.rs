//! Build script: carry librankguard.so inside the `rankguard` binary (`cli/embedded.rs`).
//!
//! Why: `cargo install` installs binaries only, and a wheel's `rankguard` lands in `bin/`;
//! either way the CLI must still find the library it injects. The binary cannot depend on
//! the cdylib of its own package (artifact dependencies are unstable), so this script builds
//! the library with a nested `cargo build --release --lib` and the CLI `include_bytes!` it.
//!
//! Cost (2 cores): the nested build has its own target directory (`<target>/rankguard-embed`,
//! beside cargo's profile directories, as substrate's wasm-builder does), so after the first
//! time it recompiles only this crate's library when `src/` changes (~20 s). To keep
//! developers' edit-compile loops fast it runs for the release profile only (what
//! `cargo install` and the wheel use); other profiles embed nothing and `rankguard lib` says
//! so. `RANKGUARD_EMBED=0` turns it off, `=1` forces it for any profile.
//!
//! The nested build uses the same `.cargo/config.toml` (the glibc 2.28 linker wrapper) as
//! the outer one, so the embedded library is the floor-respecting one whenever the outer
//! build is. The nested cargo is told by `RANKGUARD_NESTED_BUILD` not to nest again.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const NESTED: &str = "RANKGUARD_NESTED_BUILD";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    frame_pointer_cfg();
    println!("cargo:rerun-if-env-changed=RANKGUARD_EMBED");
    println!("cargo:rerun-if-env-changed={NESTED}");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("librankguard.so.embedded");

    if env::var_os(NESTED).is_some() {
        // Inside the nested build: only the library is compiled; nothing to embed.
        return embed(&dest, &[], "nothing (nested build)");
    }
    let profile = env::var("PROFILE").unwrap_or_default();
    let wanted = match env::var("RANKGUARD_EMBED").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => profile == "release",
    };
    if !wanted {
        return embed(&dest, &[], "nothing: this is not a release build (RANKGUARD_EMBED=1 embeds anyway)");
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    for p in ["src", "Cargo.toml", "Cargo.lock", ".cargo/config.toml", "scripts/link-glibc-2.28"] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }
    let target_dir = target_root(&out).join("rankguard-embed");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&manifest)
        .args(["build", "--release", "--lib", "--target-dir"])
        .arg(&target_dir)
        .env(NESTED, "1")
        // Debug info is for developers' builds; the shipped copy keeps its dynamic symbols.
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if Path::new(&manifest.join("Cargo.lock")).exists() {
        cmd.arg("--locked");
    }
    // What cargo tells this script about the outer build must not steer the nested one.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy();
        if matches!(
            k.as_ref(),
            "CARGO_TARGET_DIR" | "CARGO_BUILD_TARGET_DIR" | "CARGO_BUILD_TARGET" | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_PRIMARY_PACKAGE" | "RUSTC_WORKSPACE_WRAPPER"
        ) || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
        {
            cmd.env_remove(k.as_ref());
        }
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run the nested cargo build of librankguard.so: {e}"));
    if !status.success() {
        panic!(
            "the nested build of librankguard.so failed ({status}); its errors are above. \
             RANKGUARD_EMBED=0 builds the CLI without the embedded library"
        );
    }
    let lib = target_dir.join("release").join("librankguard.so");
    let bytes = fs::read(&lib).unwrap_or_else(|e| panic!("nested build left no {}: {e}", lib.display()));
    embed(&dest, &bytes, "the release library, built by build.rs with this checkout's linker settings");
}

/// The root of cargo's target directory: the nearest ancestor of OUT_DIR holding the
/// CACHEDIR.TAG cargo writes there (OUT_DIR itself if none, e.g. an unusual layout).
fn target_root(out: &Path) -> PathBuf {
    out.ancestors().find(|a| a.join("CACHEDIR.TAG").is_file()).unwrap_or(out).to_path_buf()
}

fn embed(dest: &Path, bytes: &[u8], how: &str) {
    fs::write(dest, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
    println!("cargo:rustc-env=RANKGUARD_EMBEDDED_LIB={}", dest.display());
    println!("cargo:rustc-env=RANKGUARD_EMBEDDED_HASH={:016x}", fnv1a64(bytes));
    println!("cargo:rustc-env=RANKGUARD_EMBEDDED_HOW={how}");
}

/// FNV-1a, 64 bits: names the cache directory of one build's library (not a security
/// measure: the CLI compares the cached file's bytes with the embedded ones).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The guard keys a repeated violation on its wrapper's return address, read through the
/// frame pointer (`guard/site.rs`). `.cargo/config.toml` turns frame pointers on; a build
/// whose RUSTFLAGS replaced that (cargo then ignores the config's flags) must not read
/// `[rbp+8]`, so the read is compiled in only when the flag is really there.
fn frame_pointer_cfg() {
    println!("cargo:rustc-check-cfg=cfg(rankguard_frame_pointers)");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let mut on = false;
    let mut it = flags.split('\x1f').peekable();
    while let Some(f) = it.next() {
        let v = if f == "-C" { it.next().unwrap_or("") } else { f.strip_prefix("-C").unwrap_or("") };
        if let Some(val) = v.strip_prefix("force-frame-pointers") {
            on = matches!(val, "" | "=yes" | "=y" | "=on" | "=true");
        }
    }
    if on {
        println!("cargo:rustc-cfg=rankguard_frame_pointers");
    }
}
