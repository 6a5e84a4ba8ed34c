//! What a rank's child needs, prepared in the launcher before its clone (`rank_start.rs`
//! does the clone and exec): its environment, its `argv`/`envp` as C strings, the paths its
//! exec tries, and the line it prints when it cannot be started.
//!
//! Why: the launcher used to start ranks with `std::process::Command` and a `pre_exec` hook,
//! which makes std wait, rank after rank, until the child has exec'ed (to return exec errors
//! from `spawn`): the ranks started one after the other. `rank_start::spawn` does not wait;
//! a rank that cannot exec reports it itself, on its stderr, and exits 127 (not found) or
//! 126 (any other failure), as a shell does; the launcher sees a failed rank like any other
//! (docs/cli.md). Between its clone and its exec the child runs in the launcher's memory
//! and may not allocate, nor call the C library, so everything it uses is built here.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The environment of a rank: `base` (the launcher's, in its order) with `changes` applied
/// in order (`None` removes a variable); variables new to `base` follow it, in the order of
/// `changes`.
///
/// By comparison, not hashing: a rank's changes are a dozen names, and hashing the whole
/// environment once per rank (a `HashMap` keyed by every variable, SipHash) was ~115,000
/// of the launcher's ~1,000,000 instructions for 8 ranks (docs/benchmarks.md, figure 4).
pub fn merge_env(
    base: &[(OsString, OsString)],
    changes: &[(&str, Option<OsString>)],
) -> Vec<(OsString, OsString)> {
    // A variable's value is its last change's.
    let last = |k: &OsStr| {
        changes
            .iter()
            .rev()
            .find(|(c, _)| OsStr::new(c) == k)
            .map(|(_, v)| v)
    };
    let mut out = Vec::with_capacity(base.len() + changes.len());
    for (i, (k, v)) in base.iter().enumerate() {
        // A name twice in `base` (possible in a raw environment): only its last occurrence
        // is changed or removed.
        let changed = last(k).filter(|_| !base[i + 1..].iter().any(|(b, _)| b == k));
        match changed {
            Some(Some(nv)) => out.push((k.clone(), nv.clone())),
            Some(None) => {}
            None => out.push((k.clone(), v.clone())),
        }
    }
    for (i, (k, v)) in changes.iter().enumerate() {
        let name = OsStr::new(k);
        // A new variable takes the place of its first setting, and its last change's value.
        let first_set = v.is_some()
            && !base.iter().any(|(b, _)| b == name)
            && !changes[..i]
                .iter()
                .any(|(c, cv)| OsStr::new(c) == name && cv.is_some());
        if let (true, Some(Some(nv))) = (first_set, last(name)) {
            out.push((OsString::from(k), nv.clone()));
        }
    }
    out
}

/// Where a rank's exec looks for its program: `execvp`'s rule (glibc's `execvpe`, which the
/// child called before it could no longer use the C library, `rank_start.rs`).
/// - A name with a `/` is the one path tried.
/// - Otherwise each entry of the launcher's `PATH` (`/bin:/usr/bin` without one), in
///   order, with the name appended; an empty entry is the current directory. A path that
///   is not there (ENOENT, ENOTDIR, ...) goes on to the next; one that is there but denied
///   (EACCES) too, and EACCES is reported if no later one runs; any other error ends the
///   search with it.
/// - A file the kernel cannot exec (ENOEXEC: no `#!` line) runs under `/bin/sh`.
#[derive(Debug, PartialEq)]
pub struct Search {
    /// The paths to try, in order.
    pub paths: Vec<CString>,
    /// Whether they come from `PATH` (the rules above) rather than being the name itself.
    pub in_path: bool,
    /// The error reported when there is nothing to try (an empty name: ENOENT).
    pub none: i32,
}

/// The [`Search`] for `program` (no NUL byte) under `path` (the launcher's `PATH`).
pub fn search(program: &[u8], path: Option<&[u8]>) -> Search {
    let none = libc::ENOENT;
    if program.is_empty() {
        return Search {
            paths: Vec::new(),
            in_path: false,
            none,
        };
    }
    if program.contains(&b'/') {
        return Search {
            paths: CString::new(program).into_iter().collect(),
            in_path: false,
            none,
        };
    }
    let paths = path
        .unwrap_or(b"/bin:/usr/bin")
        .split(|&b| b == b':')
        .filter_map(|dir| {
            let mut p = dir.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(program);
            CString::new(p).ok()
        })
        .collect();
    Search {
        paths,
        in_path: true,
        none,
    }
}

/// Everything the child uses between its clone and its exec, owned by the parent.
pub struct Prepared {
    pub search: Search,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    /// `rankguard launch: rank R: cannot execute 'PROGRAM': ` (the reason follows).
    pub exec_failed: Vec<u8>,
    /// `rankguard launch: rank R: cannot set up its process before exec: ` (the step and
    /// reason follow).
    pub setup_failed: Vec<u8>,
}

/// Build the C strings of a rank's `exec`, its program searched in `path` (the launcher's
/// `PATH`, as `execvp` searches). An argument or variable with a NUL byte cannot be passed
/// to `exec`: the error names it.
pub fn prepare(
    rank: u32,
    cmd: &[OsString],
    env: &[(OsString, OsString)],
    path: Option<&OsStr>,
) -> Result<Prepared, String> {
    let cstr = |what: &str, b: Vec<u8>| {
        CString::new(b).map_err(|e| {
            format!(
                "{what} '{}' contains a NUL byte, which exec cannot pass; fix it",
                String::from_utf8_lossy(&e.into_vec())
            )
        })
    };
    let program = cmd.first().ok_or("no command given")?;
    let argv = cmd
        .iter()
        .map(|a| cstr("the argument", a.as_bytes().to_vec()))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone().into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstr("the environment variable", kv)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let program = cstr("the program", program.as_bytes().to_vec())?;
    Ok(Prepared {
        search: search(program.as_bytes(), path.map(OsStr::as_bytes)),
        argv,
        envp,
        exec_failed: format!(
            "rankguard launch: rank {rank}: cannot execute '{}': ",
            program.to_string_lossy()
        )
        .into_bytes(),
        setup_failed: format!(
            "rankguard launch: rank {rank}: cannot set up its process before exec: "
        )
        .into_bytes(),
    })
}

/// The exit status of a rank that could not be started, as a shell's: 127 when the
/// program was not found, 126 for every other failure.
pub fn failure_status(errno: i32) -> i32 {
    if errno == libc::ENOENT {
        127
    } else {
        126
    }
}

/// `strerror`'s text for the errors `execve` and the child's set-up can give (glibc's
/// wording), without `strerror`: it is not async-signal-safe (locale, allocation).
pub fn errno_text(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "Operation not permitted",
        libc::ENOENT => "No such file or directory",
        libc::ESRCH => "No such process",
        libc::EINTR => "Interrupted system call",
        libc::EIO => "Input/output error",
        libc::E2BIG => "Argument list too long",
        libc::ENOEXEC => "Exec format error",
        libc::EBADF => "Bad file descriptor",
        libc::ENOMEM => "Cannot allocate memory",
        libc::EACCES => "Permission denied",
        libc::EFAULT => "Bad address",
        libc::ENOTDIR => "Not a directory",
        libc::EISDIR => "Is a directory",
        libc::EINVAL => "Invalid argument",
        libc::ENFILE => "Too many open files in system",
        libc::EMFILE => "Too many open files",
        libc::ETXTBSY => "Text file busy",
        libc::ENAMETOOLONG => "File name too long",
        libc::ELOOP => "Too many levels of symbolic links",
        libc::ELIBBAD => "Accessing a corrupted shared library",
        _ => "error",
    }
}

/// A fixed-size line built without allocating (the child between its clone and its exec):
/// pieces beyond its capacity are cut, and the line always ends with a newline.
pub struct Line {
    buf: [u8; 1024],
    len: usize,
}

impl Line {
    pub fn new() -> Line {
        Line {
            buf: [0; 1024],
            len: 0,
        }
    }

    pub fn push(&mut self, s: &[u8]) -> &mut Line {
        let room = self.buf.len() - 1 - self.len; // one byte kept for the newline
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
        self
    }

    /// A non-negative decimal number.
    pub fn push_num(&mut self, mut v: u32) -> &mut Line {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..])
    }

    /// `TEXT (os error N)`, as `std::io::Error` prints it.
    pub fn push_errno(&mut self, errno: i32) -> &mut Line {
        self.push(errno_text(errno).as_bytes())
            .push(b" (os error ")
            .push_num(errno.unsigned_abs())
            .push(b")")
    }

    /// The line with its newline.
    pub fn finish(&mut self) -> &[u8] {
        self.buf[self.len] = b'\n';
        &self.buf[..=self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn merge_env_sets_replaces_in_place_removes_and_appends() {
        let base = os(&[("A", "1"), ("RANK", "x"), ("B", "2"), ("OLD", "o")]);
        let changes = [
            ("RANK", Some(OsString::from("3"))),
            ("NEW", Some(OsString::from("n"))),
            ("OLD", None),
            ("GONE", None),
        ];
        assert_eq!(
            merge_env(&base, &changes),
            os(&[("A", "1"), ("RANK", "3"), ("B", "2"), ("NEW", "n")])
        );
    }

    #[test]
    fn merge_env_later_change_wins() {
        let changes = [
            ("X", Some(OsString::from("1"))),
            ("X", None),
            ("X", Some(OsString::from("3"))),
        ];
        assert_eq!(merge_env(&[], &changes), os(&[("X", "3")]));
    }

    #[test]
    fn merge_env_changes_the_last_of_a_duplicated_name_and_places_new_names_first_set() {
        let base = os(&[("D", "1"), ("A", "a"), ("D", "2")]);
        let changes = [
            ("N", Some(OsString::from("1"))),
            ("D", Some(OsString::from("3"))),
            ("M", None),
            ("M", Some(OsString::from("m"))),
            ("N", Some(OsString::from("2"))),
        ];
        assert_eq!(
            merge_env(&base, &changes),
            os(&[("D", "1"), ("A", "a"), ("D", "3"), ("N", "2"), ("M", "m")])
        );
        let removed = [("D", None), ("N", Some(OsString::from("1"))), ("N", None)];
        assert_eq!(merge_env(&base, &removed), os(&[("D", "1"), ("A", "a")]));
    }

    #[test]
    fn prepare_builds_c_strings_and_the_failure_lines() {
        let cmd = [OsString::from("/no/such"), OsString::from("-v")];
        let p = prepare(3, &cmd, &os(&[("RANK", "3")]), Some(OsStr::new("/bin"))).unwrap();
        assert_eq!(p.search.paths, [CString::new("/no/such").unwrap()]);
        assert!(!p.search.in_path);
        assert_eq!(p.argv.len(), 2);
        assert_eq!(p.envp[0].as_bytes(), b"RANK=3");
        assert_eq!(
            p.exec_failed,
            b"rankguard launch: rank 3: cannot execute '/no/such': "
        );
        assert!(String::from_utf8_lossy(&p.setup_failed).starts_with("rankguard launch: rank 3: "));
    }

    fn paths(s: &Search) -> Vec<&str> {
        s.paths.iter().map(|p| p.to_str().unwrap()).collect()
    }

    #[test]
    fn search_follows_execvp_a_name_with_a_slash_is_the_one_path() {
        let s = search(b"./train.py", Some(b"/usr/bin"));
        assert_eq!((paths(&s), s.in_path), (vec!["./train.py"], false));
        let s = search(b"/opt/x", None);
        assert_eq!((paths(&s), s.in_path), (vec!["/opt/x"], false));
    }

    #[test]
    fn search_follows_execvp_path_entries_in_order_an_empty_one_is_the_cwd() {
        let s = search(b"python", Some(b"/venv/bin::/usr/bin:"));
        assert_eq!(
            paths(&s),
            ["/venv/bin/python", "python", "/usr/bin/python", "python"]
        );
        assert!(s.in_path);
        // No PATH: glibc's default (confstr _CS_PATH).
        assert_eq!(
            paths(&search(b"true", None)),
            ["/bin/true", "/usr/bin/true"]
        );
    }

    #[test]
    fn search_of_an_empty_name_tries_nothing_and_reports_enoent() {
        let s = search(b"", Some(b"/bin"));
        assert!(s.paths.is_empty());
        assert_eq!(s.none, libc::ENOENT);
        assert_eq!(failure_status(s.none), 127);
    }

    #[test]
    fn prepare_refuses_a_nul_byte_naming_it() {
        let cmd = [OsString::from("/bin/true"), OsString::from("a\0b")];
        let e = prepare(0, &cmd, &[], None).err().unwrap();
        assert!(e.contains("argument 'a\0b'") && e.contains("NUL"), "{e}");
        let e = prepare(0, &cmd[..1], &os(&[("K", "v\0w")]), None)
            .err()
            .unwrap();
        assert!(e.contains("environment variable 'K=v\0w'"), "{e}");
    }

    #[test]
    fn failure_status_is_the_shells() {
        assert_eq!(failure_status(libc::ENOENT), 127);
        assert_eq!(failure_status(libc::EACCES), 126);
        assert_eq!(failure_status(libc::ENOEXEC), 126);
    }

    #[test]
    fn line_matches_std_io_error_wording() {
        for e in [
            libc::ENOENT,
            libc::EACCES,
            libc::ENOEXEC,
            libc::ENOTDIR,
            libc::E2BIG,
            libc::ELOOP,
        ] {
            let mut l = Line::new();
            l.push(b"x: ").push_errno(e);
            let want = format!("x: {}\n", std::io::Error::from_raw_os_error(e));
            assert_eq!(String::from_utf8_lossy(l.finish()), want);
        }
        let mut l = Line::new();
        assert_eq!(l.push_errno(9999).finish(), b"error (os error 9999)\n");
    }

    #[test]
    fn line_cuts_what_does_not_fit_and_keeps_the_newline() {
        let mut l = Line::new();
        l.push(&[b'a'; 2000]).push_num(42);
        let out = l.finish();
        assert_eq!(out.len(), 1024);
        assert_eq!(out[1023], b'\n');
        let mut l = Line::new();
        assert_eq!(
            l.push_num(0).push(b"/").push_num(u32::MAX).finish(),
            b"0/4294967295\n"
        );
    }
}
