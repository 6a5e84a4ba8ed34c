//! Build script: carry librankguard.so inside the `rankguard` binary (`cli/embedded.rs`).
//!
//! Why: `cargo install` installs binaries only, and a wheel's `rankguard` lands in `bin/`;
//! either way the CLI must still find the library it injects. The binary cannot depend on
//! the cdylib of its own package (artifact dependencies are unstable), so this script builds
//! the library with a nested `cargo build --release --lib` and the CLI `include_bytes!` it.
//!
//! Two builds are carried (docs/install.md, "Two builds"): the glibc 2.28 build (the same
//! `.cargo/config.toml` linker wrapper as the outer build) and, on x86_64, the glibc 2.34
//! build (the wrapper with `RANKGUARD_LINK_GLIBC=2.34`: no libdl/libpthread dependency).
//! The 2.34 build is also copied to `<profile dir>/glibc-2.34/librankguard.so` (e.g.
//! `target/release/glibc-2.34/`), beside the outer build's `librankguard.so`, where
//! `rankguard lib` of a checkout finds it. It needs zig: without it (no `scripts/setup`, or
//! `RANKGUARD_SYSTEM_LINKER=1`) a warning says so, nothing is carried or copied for it, and
//! `rankguard lib` hands out the 2.28 build everywhere.
//!
//! Cost (2 cores): each nested build has its own target directory
//! (`<target>/rankguard-embed`, `<target>/rankguard-embed-glibc-2.34`, beside cargo's profile
//! directories, as substrate's wasm-builder does), so after the first time each recompiles
//! only this crate's library when `src/` changes (~20 s each). To keep developers'
//! edit-compile loops fast it runs for the release profile only (what `cargo install` and
//! the wheel use); other profiles embed nothing and `rankguard lib` says so.
//! `RANKGUARD_EMBED=0` turns it off, `=1` forces it for any profile.
//!
//! The nested cargo is told by `RANKGUARD_NESTED_BUILD` not to nest again.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const NESTED: &str = "RANKGUARD_NESTED_BUILD";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    frame_pointer_cfg();
    symver_cfg();
    library_link_args();
    println!("cargo:rerun-if-env-changed=RANKGUARD_EMBED");
    println!("cargo:rerun-if-env-changed={NESTED}");
    println!("cargo:rerun-if-env-changed=RANKGUARD_SYSTEM_LINKER");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("librankguard.so.embedded");

    if env::var_os(NESTED).is_some() {
        // Inside the nested build: only the library is compiled; nothing to embed.
        embed_native(&out.join("librankguard.so.embedded-glibc-2.34"), &[]);
        return embed(&dest, &[], "nothing (nested build)");
    }
    let profile = env::var("PROFILE").unwrap_or_default();
    let wanted = match env::var("RANKGUARD_EMBED").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => profile == "release",
    };
    if !wanted {
        embed_native(&out.join("librankguard.so.embedded-glibc-2.34"), &[]);
        return embed(
            &dest,
            &[],
            "nothing: this is not a release build (RANKGUARD_EMBED=1 embeds anyway)",
        );
    }
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    for p in [
        "src",
        "crates",
        "Cargo.toml",
        "Cargo.lock",
        ".cargo/config.toml",
        "scripts/link-glibc-2.28",
        ".venv/bin/cargo-zigbuild",
    ] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }
    let root = target_root(&out);
    let floor = nested_build(&manifest, &root.join("rankguard-embed"), None).unwrap_or_else(|e| {
        panic!("{e}. RANKGUARD_EMBED=0 builds the CLI without the embedded library")
    });
    let native_dest = out.join("librankguard.so.embedded-glibc-2.34");
    // The wrapper links the 2.34 build with zig only (scripts/link-glibc-2.28); without it
    // the nested build would compile everything and then fail to link.
    let zig = manifest
        .join(".venv")
        .join("bin")
        .join("cargo-zigbuild")
        .is_file()
        && env::var_os("RANKGUARD_SYSTEM_LINKER").is_none_or(|v| v.is_empty());
    let native = if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        Vec::new() // the glibc floor link, and so the second build, is x86_64's only
    } else if !zig {
        println!("cargo:warning=no glibc 2.34 build of librankguard.so: it is linked with zig (.venv/bin/cargo-zigbuild \
                  missing, or RANKGUARD_SYSTEM_LINKER set); `rankguard lib` hands out librankguard.so, the one build, \
                  everywhere. Run scripts/setup and rebuild to get it.");
        Vec::new()
    } else {
        match nested_build(
            &manifest,
            &root.join("rankguard-embed-glibc-2.34"),
            Some("2.34"),
        ) {
            Ok(bytes) => {
                install_native(&out, &bytes);
                bytes
            }
            Err(e) => {
                println!("cargo:warning=no glibc 2.34 build of librankguard.so ({e}); `rankguard lib` hands out \
                          librankguard.so, the one build, everywhere. Run scripts/setup (zig) and rebuild to get it.");
                Vec::new()
            }
        }
    };
    embed_native(&native_dest, &native);
    embed(
        &dest,
        &floor,
        "the release library, built by build.rs with this checkout's linker settings",
    );
}

/// `cargo build --release --lib` into `target_dir`, linked for `glibc` (None: the outer
/// build's setting); the library's bytes.
fn nested_build(
    manifest: &Path,
    target_dir: &Path,
    glibc: Option<&str>,
) -> Result<Vec<u8>, String> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(manifest)
        .args(["build", "--release", "--lib", "--target-dir"])
        .arg(target_dir)
        .env(NESTED, "1")
        // Debug info is for developers' builds; the shipped copy keeps its dynamic symbols.
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    match glibc {
        Some(v) => cmd.env("RANKGUARD_LINK_GLIBC", v),
        None => cmd.env_remove("RANKGUARD_LINK_GLIBC"),
    };
    if Path::new(&manifest.join("Cargo.lock")).exists() {
        cmd.arg("--locked");
    }
    // What cargo tells this script about the outer build must not steer the nested one.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy();
        if matches!(
            k.as_ref(),
            "CARGO_TARGET_DIR"
                | "CARGO_BUILD_TARGET_DIR"
                | "CARGO_BUILD_TARGET"
                | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_PRIMARY_PACKAGE"
                | "RUSTC_WORKSPACE_WRAPPER"
        ) || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
        {
            cmd.env_remove(k.as_ref());
        }
    }
    let what = match glibc {
        Some(v) => format!("the nested glibc {v} build of librankguard.so"),
        None => "the nested build of librankguard.so".to_string(),
    };
    // The 2.34 build's errors are expected without zig: keep them out of the outer output.
    if glibc.is_some() {
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "{what} failed ({status}){}",
            if glibc.is_some() {
                ""
            } else {
                "; its errors are above"
            }
        ));
    }
    let lib = target_dir.join("release").join("librankguard.so");
    fs::read(&lib).map_err(|e| format!("{what} left no {}: {e}", lib.display()))
}

/// Put the glibc 2.34 build beside the outer build's library: `<profile dir>/glibc-2.34/`
/// (OUT_DIR is `<profile dir>/build/<pkg>-<hash>/out`). Written to a temporary name and
/// renamed, so a test or rank reading the old one never sees half a file.
fn install_native(out: &Path, bytes: &[u8]) {
    let Some(profile) = out.ancestors().nth(3) else {
        return;
    };
    let dir = profile.join("glibc-2.34");
    let dest = dir.join("librankguard.so");
    if fs::read(&dest).is_ok_and(|b| b == bytes) {
        return;
    }
    let tmp = dir.join(format!(".librankguard.so.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        fs::create_dir_all(&dir)?;
        // 0755 like the linker's output beside it.
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&tmp)?
            .write_all(bytes)?;
        fs::rename(&tmp, &dest)
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        println!(
            "cargo:warning=cannot write the glibc 2.34 build to {}: {e}",
            dest.display()
        );
    }
}

/// The root of cargo's target directory: the nearest ancestor of OUT_DIR holding the
/// CACHEDIR.TAG cargo writes there (OUT_DIR itself if none, e.g. an unusual layout).
fn target_root(out: &Path) -> PathBuf {
    out.ancestors()
        .find(|a| a.join("CACHEDIR.TAG").is_file())
        .unwrap_or(out)
        .to_path_buf()
}

fn embed_native(dest: &Path, bytes: &[u8]) {
    fs::write(dest, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
    println!(
        "cargo:rustc-env=RANKGUARD_EMBEDDED_NATIVE_LIB={}",
        dest.display()
    );
    println!(
        "cargo:rustc-env=RANKGUARD_EMBEDDED_NATIVE_HASH={:016x}",
        fnv1a64(bytes)
    );
}

fn embed(dest: &Path, bytes: &[u8], how: &str) {
    fs::write(dest, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
    println!("cargo:rustc-env=RANKGUARD_EMBEDDED_LIB={}", dest.display());
    println!(
        "cargo:rustc-env=RANKGUARD_EMBEDDED_HASH={:016x}",
        fnv1a64(bytes)
    );
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
/// frame pointer (`guard/6_audit/site.rs`). `.cargo/config.toml` turns frame pointers on; a build
/// whose RUSTFLAGS replaced that (cargo then ignores the config's flags) must not read
/// `[rbp+8]`, so the read is compiled in only when the flag is really there.
fn frame_pointer_cfg() {
    println!("cargo:rustc-check-cfg=cfg(rankguard_frame_pointers)");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let mut on = false;
    let mut it = flags.split('\x1f').peekable();
    while let Some(f) = it.next() {
        let v = if f == "-C" {
            it.next().unwrap_or("")
        } else {
            f.strip_prefix("-C").unwrap_or("")
        };
        if let Some(val) = v.strip_prefix("force-frame-pointers") {
            on = matches!(val, "" | "=yes" | "=y" | "=on" | "=true");
        }
    }
    if on {
        println!("cargo:rustc-cfg=rankguard_frame_pointers");
    }
}

/// `rankguard_symver`: the library is linked by `scripts/link-glibc-2.28`, which gives the
/// linker `src/guard/2_table/librankguard.map` (the runtime majors' version nodes) in place of
/// rustc's anonymous version script, so each runtime major's wrappers can be defined under
/// their node (`cudaSetDevice@libcudart.so.12`, `@@libcudart.so.13`; docs/design.md §2).
/// Linked any other way (a `cargo install` run outside the checkout), the nodes cannot be
/// defined: the 12 wrappers are exported unversioned, as before CUDA 13 support, and this
/// says so.
fn symver_cfg() {
    println!("cargo:rustc-check-cfg=cfg(rankguard_symver)");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let linker = env::var("RUSTC_LINKER").unwrap_or_default();
    if Path::new(&linker)
        .file_name()
        .is_some_and(|n| n == "link-glibc-2.28")
    {
        println!("cargo:rustc-cfg=rankguard_symver");
    } else if env::var_os(NESTED).is_none() {
        println!("cargo:warning=librankguard.so is not linked by scripts/link-glibc-2.28 (linker: {}): no \
                  libcudart.so.12/.13 version nodes, so CUDA 13 programs' runtime calls reach the CUDA 12 \
                  wrappers (README, \"Runtime majors\"). Build from the checkout to get them.",
                 if linker.is_empty() { "the default" } else { &linker });
    }
}

/// librankguard.so binds its own references to its own exports (`-Bsymbolic`): the guarded
/// table's pointers to the wrappers (and calls between them) are then relative relocations,
/// which the loader applies without a symbol lookup, instead of ~70 lookups through every
/// object of the process at each process start (docs/benchmarks.md, figure 3). Other
/// objects still find the exports as before; only a definition of the same name earlier in
/// the lookup order (the executable's, another preload's) no longer captures the guard's
/// own references to them, which is what the table means anyway.
///
/// `-z lazy`: the library's calls to other objects' functions (libc's) are bound on first
/// use, not at load (`.cargo/config.toml` has rustc emit them through the PLT with
/// `relro-level=partial`): a process that never touches CUDA never pays those ~35 symbol
/// lookups (~700 loader instructions each). std's precompiled calls through the GOT are
/// made lazy by stubs ([`lazy_libc`]); what stays bound at load is data and std's weak
/// references.
fn library_link_args() {
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
        hot_text();
    }
    lazy_libc();
}

/// `src/guard/hot_text.ld` (written by `scripts/gen_hot_text.py`): an `INSERT` linker script
/// that gathers the functions a guarded process runs at its start and first `cuInit` into one
/// section after `.text`, next to the PLT, and the statics it writes onto the PLT slots' page.
/// A first touch of text maps the pages around it (the kernel's fault-around: a 64 KiB
/// window; or a whole page-cache folio), and those ~50 KiB of code were spread over 9 of the
/// text's 10 windows (docs/benchmarks.md, "The first cuInit's text pages"). Both linkers the
/// build uses (zig's lld, the system `ld`) take an `INSERT` script without replacing their
/// default layout; a pattern that matches nothing is no error. `-T` and the path are two
/// arguments of the compiler driver, so a checkout path with a comma or a space links too.
fn hot_text() {
    let script =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("src/guard/hot_text.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-T");
    println!("cargo:rustc-cdylib-link-arg={}", script.display());
}

/// The C library functions that std's precompiled code calls through the GOT (its bitcode's
/// declarations are `nonlazybind`, whatever `relro-level` this crate is built with), which
/// the loader would otherwise look up at every process start: 48 of the 52 symbols bound
/// at load with rustc 1.95 (with them bound on first use, the library adds 15,125 loader
/// instructions to `/bin/true`'s start instead of 52,571: docs/benchmarks.md, "Binding
/// std's C calls on first use"). Left out: the weak
/// references (`gettid`, `statx`, `__cxa_thread_atexit_impl`: std tests them for null, and
/// a stub would never be null) and data (`stderr`, the unwinder's). A name std stops
/// calling costs nothing (its stub is dropped with its section); one it starts calling
/// through the GOT shows up in python-tests/test_startup_cost.py, which names this list.
const LAZY_LIBC: &[&str] = &[
    "abort",
    "bcmp",
    "calloc",
    "clock_nanosleep",
    "closedir",
    "dirfd",
    "free",
    "fstat",
    "fstat64",
    "getcwd",
    "getenv",
    "lseek64",
    "lstat64",
    "malloc",
    "memcmp",
    "memcpy",
    "memmove",
    "memset",
    "mkdir",
    "mmap64",
    "open",
    "open64",
    "opendir",
    "pause",
    "posix_memalign",
    "pthread_attr_destroy",
    "pthread_attr_init",
    "pthread_attr_setstacksize",
    "pthread_create",
    "pthread_detach",
    "pthread_key_create",
    "pthread_key_delete",
    "pthread_self",
    "pthread_setname_np",
    "pthread_setspecific",
    "read",
    "readdir64",
    "readlink",
    "realloc",
    "realpath",
    "rename",
    "stat64",
    "strlen",
    "sysconf",
    "unlink",
    "write",
    "writev",
    "__xpg_strerror_r",
];

/// Each [`LAZY_LIBC`] function gets a one-instruction stub, `__wrap_NAME: jmp
/// __real_NAME@PLT`, and the library links with `--wrap=NAME`: every reference to `NAME`
/// in the library (std's GOT loads included) binds to the stub, which the linker resolves
/// inside the library (a relative relocation, no lookup), and the stub's reference to the
/// real function is a lazy PLT slot bound on first use (`-z lazy`), like the library's own
/// calls. Same function, same symbol version, same interposition by other objects (a
/// jemalloc `malloc` still wins); two jumps more per call. The stubs are written to
/// `$OUT_DIR/lazy_libc.s`, which `src/guard/1_sys/lazy_libc.rs` assembles (cfg
/// `rankguard_lazy_libc`: x86_64 Linux; elsewhere the library links as before).
fn lazy_libc() {
    println!("cargo:rustc-check-cfg=cfg(rankguard_lazy_libc)");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux")
        || env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64")
    {
        return;
    }
    let mut asm = String::new();
    for name in LAZY_LIBC {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap={name}");
        // A section per stub: `--gc-sections` drops the stub of a name nothing references,
        // and its PLT slot with it.
        asm += &format!(
            ".pushsection .text.rankguard_lazy_libc.{name},\"ax\",@progbits\n\
             .globl __wrap_{name}\n.hidden __wrap_{name}\n.type __wrap_{name},@function\n\
             __wrap_{name}:\n    jmp __real_{name}@PLT\n.size __wrap_{name}, . - __wrap_{name}\n\
             .popsection\n"
        );
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(e) = fs::write(out.join("lazy_libc.s"), asm) {
        panic!("cannot write {}: {e}", out.join("lazy_libc.s").display());
    }
    println!("cargo:rustc-cfg=rankguard_lazy_libc");
}
