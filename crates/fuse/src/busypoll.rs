//! Busy polling of `/dev/fuse` while the mount is busy: the round trip of
//! a FUSE request without the server's wake-up.
//!
//! Every request is a round trip: the caller queues it and sleeps, a
//! server thread blocked in `read(/dev/fuse)` is woken, serves it and
//! writes the reply, which wakes the caller. On a virtual machine a wake-up
//! of a thread on another, idle CPU costs an inter-processor interrupt and
//! a halted vCPU's exit (with `guest_halt_poll_ns` 0, as on our machines,
//! the guest never polls first): measured here, a create loop in a shell
//! takes ~350-700 µs per file with blocking reads, against ~120 µs when
//! server and caller happen to share a CPU. `ext4kit` cannot choose the
//! caller's CPU, but it can keep one server thread from sleeping: while
//! requests keep coming, the primary descriptor is switched to
//! `O_NONBLOCK` and its thread (fuser's loop retries `EAGAIN` at once)
//! spins in `read`, so a new request is picked up without any wake-up —
//! one of the two wake-ups of every round trip is gone. This is the
//! networking stack's `SO_BUSY_POLL` idea, applied to the FUSE channel;
//! FUSE over io_uring (kernel 6.14+, off unless the `fuse` module's
//! `enable_uring` is set) would get the same by serving each CPU's
//! requests on that CPU.
//!
//! That is [`Style::ReadSpin`]. On a machine of two CPUs, [`Style::Occupy`]
//! does better: the server threads keep blocking, and a spinning thread
//! keeps the caller's *other* CPU from going idle. The scheduler places a
//! woken task on an idle CPU if there is one (`select_idle_sibling`); with
//! none, it wakes the server thread on the
//! CPU of the caller that is about to sleep waiting for it, and the reply
//! wakes the caller there too: no inter-processor wake-up either way.
//! Measured here (requests of one process, medians): chmod 49-53 µs per
//! call with `ReadSpin` against 21-24 µs, utime 42-55 against 19-23, a
//! create 197-333 against 94-165; a round trip 18-20 µs against ~30. The
//! spinner runs at normal priority: at nice 19 round trips took 48 µs
//! (measured; presumably the scheduler's load comparison found the
//! spinner's CPU the lighter one and woke the server there), and a
//! `SCHED_IDLE` spinner counts as idle for the placement (68-78 µs). It
//! shares its CPU fairly with real work, as the `ReadSpin` thread does, and
//! only while requests keep coming. With more CPUs one spinner cannot leave
//! none idle, so `ReadSpin` is used there.
//!
//! It costs one CPU while the mount is busy, and nothing when it is idle:
//! a governor thread checks every [`BusyPoll::window`] whether any request
//! arrived since its last look and, if none did, stops spinning (`Occupy`:
//! the governor is the spinner and goes to sleep; `ReadSpin`: it switches
//! the descriptor back to blocking reads and the spinning thread sleeps in
//! its next `read`). The first request after that starts spinning again.
//! With `ReadSpin` only the primary descriptor spins; the other threads'
//! cloned descriptors (each its own open file description, so
//! `O_NONBLOCK` is theirs alone) keep blocking, so a second CPU stays free
//! for the callers. `-o busy_poll=0` turns it off.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long the mount spins after the last request unless told otherwise
/// (`-o busy_poll=MICROSECONDS`): long enough to cover a caller's work
/// between two requests (a shell loop's fork-free builtins, tar's writes),
/// short enough that an idle mount stops burning a CPU at once.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(2);

/// How a busy mount avoids the server's wake-up (see the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// The primary descriptor is non-blocking; its thread spins in `read`.
    ReadSpin,
    /// The server threads block; a thread spins so that no CPU is idle and
    /// wake-ups stay on the caller's CPU (machines of two CPUs).
    Occupy,
}

impl Style {
    /// The style for this machine: [`Style::Occupy`] where one spinning
    /// thread leaves no CPU idle besides the caller's.
    pub fn for_this_machine() -> Style {
        match std::thread::available_parallelism() {
            Ok(n) if n.get() <= 2 => Style::Occupy,
            _ => Style::ReadSpin,
        }
    }
}

/// The busy-polling state of one mount (see the module documentation).
#[derive(Debug)]
pub struct BusyPoll {
    /// Zero: never spin.
    window: Duration,
    style: Style,
    /// A request arrived since the governor last looked.
    recent: AtomicBool,
    /// The primary descriptor is non-blocking (its thread spins).
    hot: AtomicBool,
    /// Our duplicate of the primary descriptor: the same open file
    /// description, so `O_NONBLOCK` set through it is the reading thread's.
    /// `None` until [`BusyPoll::attach`], and after a failed `fcntl`.
    fd: Mutex<Option<OwnedFd>>,
    /// Wakes the governor when spinning starts.
    started: Condvar,
}

impl BusyPoll {
    /// A mount that spins for `window` after each request (zero: never),
    /// in the style that suits this machine.
    pub fn new(window: Duration) -> Arc<Self> {
        Self::with_style(window, Style::for_this_machine())
    }

    /// [`BusyPoll::new`] in a given style.
    pub fn with_style(window: Duration, style: Style) -> Arc<Self> {
        Arc::new(BusyPoll {
            window,
            style,
            recent: AtomicBool::new(false),
            hot: AtomicBool::new(false),
            fd: Mutex::new(None),
            started: Condvar::new(),
        })
    }

    /// The spinning window (zero: off).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Take the session's primary descriptor (the one fuser's last thread
    /// reads) and start the governor. Without a usable duplicate, the mount
    /// simply never spins.
    pub fn attach(self: &Arc<Self>, primary: BorrowedFd<'_>) {
        if self.window.is_zero() {
            return;
        }
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we borrow returns a new
        // descriptor we own (or -1).
        let dup = unsafe { libc::fcntl(primary.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return;
        }
        // SAFETY: `dup` is a fresh descriptor nobody else owns.
        *self.fd.lock() = Some(unsafe { OwnedFd::from_raw_fd(dup) });
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("ext4kit-busypoll".into())
            .spawn(move || governor(weak));
        if spawned.is_err() {
            *self.fd.lock() = None;
        }
    }

    /// Called at the start of every request: marks the mount busy and
    /// starts spinning if it was not. Two relaxed loads when already hot.
    #[inline]
    pub fn touch(&self) {
        if !self.recent.load(Ordering::Relaxed) {
            self.recent.store(true, Ordering::Relaxed);
        }
        if !self.hot.load(Ordering::Relaxed) {
            self.heat();
        }
    }

    #[cold]
    fn heat(&self) {
        let fd = self.fd.lock();
        let Some(fd) = fd.as_ref() else { return };
        if self.hot.load(Ordering::Relaxed) {
            return;
        }
        if self.style == Style::Occupy || set_nonblocking(fd, true) {
            self.hot.store(true, Ordering::Relaxed);
            self.started.notify_one();
        }
    }

    /// The style in use.
    pub fn style(&self) -> Style {
        self.style
    }

    /// Whether the mount spins now (for tests).
    pub fn is_hot(&self) -> bool {
        self.hot.load(Ordering::Relaxed)
    }
}

fn set_nonblocking(fd: &OwnedFd, on: bool) -> bool {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 {
            return false;
        }
        let new = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        new == fl || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) == 0
    }
}

/// Keep this CPU busy for `d` (see [`Style::Occupy`]).
fn occupy(d: Duration) {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

/// Cools the descriptor down once a whole window passed without a
/// request; sleeps while it is cold. Ends when the mount's server (the
/// owner of the last strong reference) is gone, closing the duplicate.
fn governor(weak: Weak<BusyPoll>) {
    loop {
        let Some(bp) = weak.upgrade() else { return };
        let mut fd = bp.fd.lock();
        if fd.is_none() {
            return;
        }
        if !bp.hot.load(Ordering::Relaxed) {
            // Cold: wait for a request to heat it (re-checking now and
            // then whether the mount is still there).
            bp.started.wait_for(&mut fd, Duration::from_secs(1));
            continue;
        }
        drop(fd);
        let (window, style) = (bp.window, bp.style);
        drop(bp);
        match style {
            Style::ReadSpin => std::thread::sleep(window),
            Style::Occupy => occupy(window),
        }
        let Some(bp) = weak.upgrade() else { return };
        if bp.recent.swap(false, Ordering::Relaxed) {
            continue;
        }
        let mut fd = bp.fd.lock();
        // A request may have come between the swap and the lock: it set
        // `recent` again, and the next window keeps spinning.
        if bp.recent.load(Ordering::Relaxed) {
            continue;
        }
        if let Some(f) = fd.as_ref() {
            if bp.style == Style::Occupy || set_nonblocking(f, false) {
                bp.hot.store(false, Ordering::Relaxed);
            } else {
                // Cannot switch back: never spin again rather than spin
                // forever.
                *fd = None;
                bp.hot.store(false, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn nonblocking(fd: &impl AsRawFd) -> bool {
        // SAFETY: F_GETFL on a live descriptor.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) & libc::O_NONBLOCK != 0 }
    }

    /// A pipe stands in for /dev/fuse: O_NONBLOCK lives on the open file
    /// description, which the duplicate shares.
    #[test]
    fn spins_while_touched_and_cools_down_when_idle() {
        let (r, _w) = std::io::pipe().expect("pipe");
        let bp = BusyPoll::with_style(Duration::from_millis(20), Style::ReadSpin);
        bp.attach(r.as_fd());
        assert!(!nonblocking(&r), "cold before any request");
        bp.touch();
        assert!(bp.is_hot() && nonblocking(&r), "the first request starts spinning");
        // Requests every 5 ms keep it hot across several windows.
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(5));
            bp.touch();
            assert!(nonblocking(&r), "busy: still spinning");
        }
        // Idle for several windows: back to blocking reads.
        let t = std::time::Instant::now();
        while nonblocking(&r) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!nonblocking(&r) && !bp.is_hot(), "idle: blocking again");
        bp.touch();
        assert!(nonblocking(&r), "heats again on the next request");
    }

    /// The occupier spins while requests come and stops after a quiet
    /// window; the descriptor itself stays blocking.
    #[test]
    fn occupy_heats_and_cools_without_touching_the_descriptor() {
        let (r, _w) = std::io::pipe().expect("pipe");
        let bp = BusyPoll::with_style(Duration::from_millis(20), Style::Occupy);
        bp.attach(r.as_fd());
        bp.touch();
        assert!(bp.is_hot() && !nonblocking(&r));
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(5));
            bp.touch();
            assert!(bp.is_hot(), "busy: still spinning");
        }
        let t = std::time::Instant::now();
        while bp.is_hot() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!bp.is_hot() && !nonblocking(&r), "idle: spinning stopped");
    }

    #[test]
    fn zero_window_never_spins() {
        let (r, _w) = std::io::pipe().expect("pipe");
        let bp = BusyPoll::new(Duration::ZERO);
        bp.attach(r.as_fd());
        bp.touch();
        assert!(!bp.is_hot() && !nonblocking(&r));
    }
}
