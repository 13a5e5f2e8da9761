//! The few process-level system calls the mount lifecycle needs and the
//! standard library does not offer: fork, session, signal masks, unmount.
//! Each wrapper is safe to call; the `unsafe` blocks are the FFI calls
//! themselves, with the argument invariants stated beside them.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The signals that end the server.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and edit a sigset_t we own.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        for sig in STOP_SIGNALS {
            libc::sigaddset(&mut s, sig);
        }
        s
    }
}

/// Block SIGINT/SIGTERM/SIGHUP in the calling thread; threads started
/// afterwards inherit the mask, so only [`wait_stop_signal`] sees them.
pub fn block_stop_signals() -> io::Result<()> {
    let s = stop_set();
    // SAFETY: valid sigset pointer, null old-set pointer.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &s, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Wait for one of the blocked stop signals; returns its number.
pub fn wait_stop_signal() -> io::Result<libc::c_int> {
    let s = stop_set();
    let mut sig: libc::c_int = 0;
    // SAFETY: valid sigset and output pointers.
    let r = unsafe { libc::sigwait(&s, &mut sig) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(sig)
}

/// What [`fork`] returned.
pub enum Forked {
    /// In the parent: the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// `fork()`. Must be called while the process has one thread (the child
/// gets only the calling thread; locks held by others would stay locked).
pub fn fork() -> io::Result<Forked> {
    // SAFETY: fork has no pointer arguments; the single-thread requirement
    // is the caller's (documented above).
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 { Forked::Child } else { Forked::Parent(pid) })
}

/// Start a new session (detach from the controlling terminal).
pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    cvt(unsafe { libc::setsid() }).map(|_| ())
}

/// A pipe (read end, write end), close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Point standard input, output and error at /dev/null (a detached server
/// must not keep its starter's terminal or pipes open).
pub fn stdio_to_devnull() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    use std::os::fd::AsRawFd;
    for fd in 0..3 {
        // SAFETY: dup2 of a valid descriptor onto 0..2.
        cvt(unsafe { libc::dup2(null.as_raw_fd(), fd) })?;
    }
    Ok(())
}

/// Wait for child `pid`; its exit status as the shell shows it.
pub fn wait_child(pid: libc::pid_t) -> io::Result<i32> {
    let mut st: libc::c_int = 0;
    // SAFETY: valid output pointer.
    cvt(unsafe { libc::waitpid(pid, &mut st, 0) })?;
    Ok(if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        128 + libc::WTERMSIG(st)
    })
}

/// `umount2(path, flags)` (root only; others go through fusermount3).
pub fn umount(path: &Path, lazy: bool) -> io::Result<()> {
    let c = cpath(path)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::umount2(c.as_ptr(), flags) }).map(|_| ())
}

/// `mount --bind from to` (root only): a second mount point of the
/// filesystem mounted at `from`.
pub fn mount_bind(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cpath(from)?, cpath(to)?);
    // SAFETY: valid NUL-terminated paths; no fstype and no data for a bind.
    cvt(unsafe {
        libc::mount(
            f.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })
    .map(|_| ())
}

/// `mount -o remount,bind,FLAGS to`: set the per-mount-point flags of a
/// bind mount (`MS_RDONLY`, `MS_NOSUID`, `MS_NODEV`, `MS_NOEXEC`, the atime
/// flags), leaving the filesystem itself alone.
pub fn remount_bind(to: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let t = cpath(to)?;
    // SAFETY: valid NUL-terminated path; no source, fstype or data.
    cvt(unsafe {
        libc::mount(
            std::ptr::null(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    })
    .map(|_| ())
}

/// Whether the effective user is root.
pub fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// Whether the calling user may open `path` for reading and writing.
pub fn can_read_write(path: &Path) -> bool {
    match cpath(path) {
        // SAFETY: valid NUL-terminated path.
        Ok(c) => unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) == 0 },
        Err(_) => false,
    }
}

/// A connected pair of Unix stream sockets: (ours, close-on-exec; the
/// child's, inheritable by a program we start).
pub fn socketpair_for_child() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors socketpair writes.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETFD on a descriptor we own.
    cvt(unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    Ok((ours, theirs))
}

/// Receive one descriptor sent with SCM_RIGHTS on `sock` (what fusermount3
/// sends: the opened /dev/fuse).
pub fn recv_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, 8-byte aligned.
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; we point it at live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space);
    // SAFETY: msg points at iov/space, which outlive the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CMSG_FIRSTHDR/CMSG_DATA walk the control buffer the kernel
    // filled and reported in msg_controllen.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n == 0 || c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "fusermount3 sent no /dev/fuse descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
