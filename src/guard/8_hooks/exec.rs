//! `exec*` replaces the process image and with it the counts of violations not yet written
//! (`tally.rs`) and the image that wrote the process's rank record (`root_walk.rs`) and its
//! export records (`decide::own_records`): the new program, guarded or not, cannot know it
//! has them to remove at its end, so they go now (a guarded program records again at its
//! own first `cuInit` and exports). These exports do all three first, then jump to the real
//! function with the caller's registers and stack untouched (the `execl` family is
//! variadic, so the shims are naked trampolines, like our `dlsym`). When the process never
//! violated, wrote no rank record and exported nothing, a shim costs three atomic loads
//! and, once per function, a `dlsym(RTLD_NEXT)`.
//!
//! They also hand the new program its lineage note (`process::lineage`, docs/design.md §1,
//! "The lineage note"): `execve`, `execv`, `execvp`, `execvpe` and `fexecve` are functions
//! that build the new environment array on their own stack (the note's entry added, any
//! inherited one dropped) and call the real function with it (`execv` and `execvp`, which
//! take `environ`, become the real `execve` and `execvpe` with the array); `posix_spawn` and
//! `posix_spawnp` do the same for the child they start. The variadic `execl` family stays
//! a naked trampoline and hands no note (the program's walk reads `/proc`).
//!
//! x86-64 only; on other architectures nothing is interposed and an `exec` after
//! violations loses at most the last interval's counts, like `_exit` (README).
#![allow(unsafe_code)]
// Unit-test builds do not export the shims (as for `dlsym`), so nothing calls the hook there.
#![cfg_attr(test, allow(dead_code))]

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::ffi::{c_char, c_int};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::guard::audit::tally;
    use crate::guard::decide::own_records;
    use crate::guard::process::lineage::{self, Start};
    use crate::guard::process::root_walk;
    use crate::guard::resolve::{exec_real, real};

    /// A real function that cannot be found: fail the call the way exec fails.
    extern "C" fn missing() -> c_int {
        // SAFETY: __errno_location always returns this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        -1
    }

    /// What every `exec` does first: flush the counts, write the rank record a `vfork`
    /// parent owes (`root_walk::pay_owed`: its child is about to start), remove this
    /// process's rank record and export records. Never unwinds.
    fn before_exec() {
        let _ = std::panic::catch_unwind(tally::before_exec);
        let _ = std::panic::catch_unwind(|| root_walk::pay_owed(true));
        root_walk::drop_record();
        own_records::drop_all();
    }

    /// Called by every shim with its index (into `table::EXEC_NAMES`): [`before_exec`], then
    /// return the real function. Never unwinds into the caller.
    extern "C" fn rg_exec_hook(which: usize) -> usize {
        before_exec();
        match exec_real::get(which) {
            0 => missing as *const () as usize,
            p => p,
        }
    }

    /// Indexes into `table::EXEC_NAMES` of the functions that hand a note (constants, so
    /// that no table of the names is kept: each entry would be a relocation at every start;
    /// a unit test holds them to the table).
    const EXECVE: usize = 0;
    const EXECV: usize = 1;
    const EXECVP: usize = 2;
    const EXECVPE: usize = 3;
    const FEXECVE: usize = 7;

    #[cfg(test)]
    #[test]
    fn the_indexes_name_their_functions() {
        use crate::guard::table::EXEC_NAMES;
        for (i, name) in [
            (EXECVE, c"execve"),
            (EXECV, c"execv"),
            (EXECVP, c"execvp"),
            (EXECVPE, c"execvpe"),
            (FEXECVE, c"fexecve"),
        ] {
            assert_eq!(EXEC_NAMES[i], name);
        }
    }

    type Execve =
        unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    type Execv = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;

    /// The array `envp` with this process's note for the program it starts (None: none
    /// to give), built in `entry` and `array`: the caller's locals, alive until its real
    /// call returns (an `exec` returns only when it fails).
    ///
    /// # Safety
    /// `envp` is the caller's environment array (exec's contract).
    unsafe fn with_note(
        envp: *const *const c_char,
        start: Start,
        entry: &mut [u8; lineage::NOTE_BUF],
        array: &mut [std::mem::MaybeUninit<*const c_char>; lineage::ENVP_MAX],
    ) -> Option<*const *const c_char> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract; the array returned points into `entry`,
            // `array` and `envp`'s strings.
            unsafe { lineage::envp_with_note(envp, start, entry, array) }
        }))
        .ok()
        .flatten()
    }

    /// The stack space a hook builds the new environment in.
    macro_rules! note_space {
        ($entry:ident, $array:ident) => {
            let mut $entry = [0u8; lineage::NOTE_BUF];
            // Not zeroed: only the entries written are touched (a page of stack each 512).
            let mut $array =
                [const { std::mem::MaybeUninit::<*const c_char>::uninit() }; lineage::ENVP_MAX];
        };
    }

    /// Fail the call the way exec fails when its real function is missing.
    fn enosys() -> c_int {
        missing()
    }

    /// An `exec` that takes an environment array (`execve`, `execvpe`, `fexecve`): real
    /// function `WHICH` of `table::EXEC_NAMES` (a constant, so that no table of the names
    /// is kept), called with `envp` or with the array built
    /// from it with the note. `first` is its first argument (a path, or a descriptor).
    ///
    /// # Safety
    /// The contract of glibc's function `WHICH`.
    unsafe fn exec_with_envp<const WHICH: usize, T>(
        first: T,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int {
        before_exec();
        let real = exec_real::get(WHICH);
        if real == 0 {
            return enosys();
        }
        note_space!(entry, array);
        // SAFETY: `envp` is the caller's environment array (the function's contract).
        let new = unsafe { with_note(envp, Start::Exec, &mut entry, &mut array) };
        // SAFETY: `real` is glibc's function `WHICH` (resolved by name), whose arguments are
        // (T, argv, envp); the caller's, the environment array theirs or built above.
        unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn(T, Argv, Argv) -> c_int>(real)(
                first,
                argv,
                new.unwrap_or(envp),
            )
        }
    }

    /// An `exec` of the current `environ` (`execv`, `execvp`): with a note, the same call
    /// of `WITH_ENVP` (`execve`, `execvpe`) on the array built from `environ`, else of
    /// `PLAIN` itself.
    ///
    /// # Safety
    /// The contract of glibc's function `PLAIN`.
    unsafe fn exec_with_environ<const WITH_ENVP: usize, const PLAIN: usize>(
        file: *const c_char,
        argv: *const *const c_char,
    ) -> c_int {
        before_exec();
        let env = environ();
        note_space!(entry, array);
        // SAFETY: `env` is the process's environment array, as `PLAIN` would read it.
        let new = unsafe { with_note(env, Start::Exec, &mut entry, &mut array) };
        match (new, exec_real::get(WITH_ENVP), exec_real::get(PLAIN)) {
            // SAFETY: glibc's `WITH_ENVP` with `environ` and the note: what `PLAIN` would
            // do (an `execvp`'s search path is this process's PATH either way).
            (Some(new), ve, _) if ve != 0 => unsafe {
                std::mem::transmute::<usize, Execve>(ve)(file, argv, new)
            },
            (_, _, 0) => enosys(),
            // SAFETY: glibc's `PLAIN` with the caller's arguments.
            (_, _, v) => unsafe { std::mem::transmute::<usize, Execv>(v)(file, argv) },
        }
    }

    type Argv = *const *const c_char;

    /// # Safety
    /// Same contract as glibc's `execve`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
        // SAFETY: the caller's contract is execve's.
        unsafe { exec_with_envp::<EXECVE, _>(path, argv, envp) }
    }

    /// # Safety
    /// Same contract as glibc's `execv`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
        // SAFETY: the caller's contract is execv's.
        unsafe { exec_with_environ::<EXECVE, EXECV>(path, argv) }
    }

    /// # Safety
    /// Same contract as glibc's `execvp`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
        // SAFETY: the caller's contract is execvp's.
        unsafe { exec_with_environ::<EXECVPE, EXECVP>(file, argv) }
    }

    /// # Safety
    /// Same contract as glibc's `execvpe`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
        // SAFETY: the caller's contract is execvpe's.
        unsafe { exec_with_envp::<EXECVPE, _>(file, argv, envp) }
    }

    /// # Safety
    /// Same contract as glibc's `fexecve`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
        // SAFETY: the caller's contract is fexecve's.
        unsafe { exec_with_envp::<FEXECVE, _>(fd, argv, envp) }
    }

    type Spawn = unsafe extern "C" fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;

    static SPAWN: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

    /// `posix_spawn` (0) or `posix_spawnp` (1), resolved on first use (in the caller: no
    /// `vfork` child runs this).
    fn real_spawn(which: usize) -> usize {
        let Some(slot) = SPAWN.get(which) else {
            return 0;
        };
        let mut p = slot.load(Ordering::Acquire);
        if p == 0 {
            let name = if which == 0 {
                c"posix_spawn"
            } else {
                c"posix_spawnp"
            };
            p = real::lookup(libc::RTLD_NEXT, name) as usize;
            slot.store(p, Ordering::Release);
        }
        p
    }

    /// The spawned child gets this process's note; nothing else changes.
    ///
    /// # Safety
    /// Same contract as glibc's `posix_spawn`.
    unsafe fn spawn_with_note(
        which: usize,
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int {
        let real = real_spawn(which);
        if real == 0 {
            return libc::ENOSYS;
        }
        // The child may walk: the rank record this process owes is written first.
        let _ = std::panic::catch_unwind(|| root_walk::pay_owed(false));
        note_space!(entry, array);
        // SAFETY: `envp` is the caller's environment array (the function's contract).
        let new = unsafe { with_note(envp, Start::Spawn, &mut entry, &mut array) };
        // SAFETY: glibc's function of this name; the caller's arguments, the environment
        // array theirs or built above from theirs (alive until the call returns).
        unsafe {
            std::mem::transmute::<usize, Spawn>(real)(
                pid,
                path,
                actions,
                attr,
                argv,
                new.unwrap_or(envp),
            )
        }
    }

    /// # Safety
    /// Same contract as glibc's `posix_spawn`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn posix_spawn(
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int {
        // SAFETY: the caller's contract is posix_spawn's.
        unsafe { spawn_with_note(0, pid, path, actions, attr, argv, envp) }
    }

    /// # Safety
    /// Same contract as glibc's `posix_spawnp`.
    #[cfg_attr(not(test), no_mangle)]
    pub unsafe extern "C" fn posix_spawnp(
        pid: *mut libc::pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int {
        // SAFETY: the caller's contract is posix_spawnp's.
        unsafe { spawn_with_note(1, pid, file, actions, attr, argv, envp) }
    }

    /// The address of the C library's `environ`, looked up on first use (a data symbol
    /// the loader would otherwise bind at every process start). The first use is an
    /// `execv`/`execvp`, which looks up the real function at the same moment (`exec_real`:
    /// the same lock, taken once more), or a `posix_spawn`.
    static ENVIRON: AtomicUsize = AtomicUsize::new(0);

    /// The process's environment array now, as `execv` and `execvp` take it (null when
    /// `environ` cannot be found: no note then).
    fn environ() -> *const *const c_char {
        let mut at = ENVIRON.load(Ordering::Acquire);
        if at == 0 {
            at = real::lookup(libc::RTLD_DEFAULT, c"environ") as usize;
            ENVIRON.store(at, Ordering::Release);
        }
        if at == 0 {
            return std::ptr::null();
        }
        // SAFETY: `at` is the address of the C library's `environ`, a pointer variable.
        unsafe { *(at as *const *const *const c_char) }
    }

    /// Save every argument register (and `al`, the vector count of a variadic call), ask
    /// the hook, restore, and jump to its answer with the caller's return address intact.
    /// Seven pushes take rsp from 8 mod 16 (after the call) to 0 mod 16 for the hook call.
    macro_rules! exec_shim {
        // Functions of their own above (they hand the new program its note).
        (execve, $idx:literal) => {};
        (execv, $idx:literal) => {};
        (execvp, $idx:literal) => {};
        (execvpe, $idx:literal) => {};
        (fexecve, $idx:literal) => {};
        ($name:ident, $idx:literal) => {
            #[unsafe(naked)]
            #[cfg_attr(not(test), no_mangle)]
            /// # Safety
            /// Same contract as glibc's function of this name.
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "push rdi", "push rsi", "push rdx", "push rcx", "push r8", "push r9", "push rax",
                    concat!("mov edi, ", $idx),
                    "call {hook}",
                    "mov r11, rax",
                    "pop rax", "pop r9", "pop r8", "pop rcx", "pop rdx", "pop rsi", "pop rdi",
                    "jmp r11",
                    hook = sym rg_exec_hook,
                )
            }
        };
    }

    // One shim per name of `table::EXEC_NAMES`, with its index (generated from guarded.spec's
    // `exec:` line).
    crate::guard::table::exec_shims!(exec_shim);
}
