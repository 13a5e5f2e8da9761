//! FUSE over io_uring (Linux 6.14+), added by ext4kit.
//!
//! Instead of one `read()` and one `write()` on `/dev/fuse` per request, the
//! server registers ring entries with the kernel once, and each request then
//! arrives as the completion of an `IORING_OP_URING_CMD`; its reply is
//! committed together with the fetch of the next request, one
//! `io_uring_enter` per request. The kernel keeps one queue per possible CPU
//! and puts a request on the queue of the CPU its caller runs on
//! (`fuse_uring_task_to_queue` in fs/fuse/dev_uring.c), so a server thread
//! pinned to that CPU is woken on the caller's own CPU.
//!
//! The protocol, as fs/fuse/dev_uring.c implements it and
//! Documentation/filesystems/fuse-io-uring.rst describes it:
//!
//! 1. FUSE_INIT over `/dev/fuse`: the kernel offers `FUSE_OVER_IO_URING`
//!    when the `fuse` module's `enable_uring` parameter is Y
//!    (`fuse_new_init`); the server grants it in its reply, and from then
//!    on the kernel holds every new request until the ring is ready
//!    (`fuse_block_alloc`).
//! 2. Per entry, a `FUSE_IO_URING_CMD_REGISTER` command (an SQE128 with
//!    `struct fuse_uring_cmd_req` in its 80-byte command area, naming the
//!    queue) whose `addr`/`len` point at two iovecs: the 288-byte
//!    `struct fuse_uring_req_header` and the payload buffer, at least the
//!    kernel's `max_payload_sz` long (`fuse_uring_create_ring_ent`). Once
//!    every queue has an entry the ring is ready and requests flow through
//!    it (`fuse_uring_do_register`, `is_ring_ready`). A failed REGISTER makes
//!    the kernel give up on io_uring for the connection (`fc->io_uring = 0`,
//!    in `fuse_uring_cmd`) and requests flow through `/dev/fuse` again.
//! 3. A request completes the entry's command: `fuse_in_header` is in
//!    `in_out`, the per-opcode struct (`in_args[0]`) in `op_in`, everything
//!    else (names, write data) in the payload, whose length is
//!    `ring_ent_in_out.payload_sz` (`fuse_uring_args_to_ring`).
//! 4. The reply: `fuse_out_header` into `in_out`, the reply's arguments
//!    into the payload, their length into `ring_ent_in_out.payload_sz`, then
//!    `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` with the request's `commit_id`
//!    (`fuse_uring_commit_fetch`), which also makes the entry wait for the
//!    next request.
//! 5. FORGET, BATCH_FORGET and INTERRUPT still come through `/dev/fuse`
//!    (`fuse_io_uring_ops`), and notifications are still written to it, so
//!    one `/dev/fuse` thread keeps running beside the rings.
//! 6. When the connection ends (unmount, abort) every waiting command
//!    completes with `-ENOTCONN` (`fuse_uring_stop_queues`), which ends the
//!    ring threads.
//!
//! Here each ring thread owns one io_uring and one entry, so the kernel
//! hands a request only to a thread that is idle; a queue has
//! `threads / queues` (at least one) threads. The request is made
//! contiguous for the parser without copying its payload: the header and
//! per-opcode struct are copied into the bytes just before the payload.

use std::alloc::Layout;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd` (include/uapi/linux/fuse.h).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IOV_SEGS` (fs/fuse/dev_uring.c): header and payload.
const FUSE_URING_IOV_SEGS: u32 = 2;
/// `FUSE_URING_IN_OUT_HEADER_SZ`, `FUSE_URING_OP_IN_OUT_SZ`.
const IN_OUT_SZ: usize = 128;
const OP_IN_SZ: usize = 128;
/// `sizeof(struct fuse_in_header)`, `sizeof(struct fuse_out_header)`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `FUSE_MIN_READ_BUFFER`: the kernel's smallest `max_payload_sz`.
const MIN_PAYLOAD: usize = 8192;
/// Where the payload area starts in an entry's memory (the header area is
/// at 0): page-aligned, with room before it for the in-header and per-op
/// struct of a request.
const PAYLOAD_OFFSET: usize = 4096;
/// The `user_data` of every command (one entry per ring).
const ENTRY_TAG: u64 = 1;

/// `struct fuse_uring_ent_in_out` (include/uapi/linux/fuse.h, 7.42).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FuseUringEntInOut {
    flags: u64,
    /// The request's `unique`, to be echoed in `fuse_uring_cmd_req.commit_id`.
    commit_id: u64,
    /// Bytes used in the payload area, in either direction.
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: iov[0] of a REGISTER.
#[repr(C)]
struct FuseUringReqHeader {
    /// `fuse_in_header` from the kernel, `fuse_out_header` back.
    in_out: [u8; IN_OUT_SZ],
    /// The per-opcode struct (`in_args[0]`).
    op_in: [u8; OP_IN_SZ],
    ring_ent_in_out: FuseUringEntInOut,
}

const _: () = assert!(size_of::<FuseUringEntInOut>() == 32);
const _: () = assert!(size_of::<FuseUringReqHeader>() == 288);
const _: () = assert!(std::mem::offset_of!(FuseUringReqHeader, ring_ent_in_out) == 256);
const _: () = assert!(size_of::<FuseUringReqHeader>() + IN_HEADER + OP_IN_SZ <= PAYLOAD_OFFSET);

/// The 80-byte command area of an SQE128 for `/dev/fuse`: `struct
/// fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }`
/// followed by zeros.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// Set `sqe->len`, which the builder of io-uring 0.7's `UringCmd80` does
/// not expose but REGISTER needs (`fuse_uring_get_iovec_from_sqe` wants
/// `FUSE_URING_IOV_SEGS`). `squeue::Entry128` is `#[repr(C)]`: the 64-byte
/// `struct io_uring_sqe` (whose `len` is the `__u32` at byte 24,
/// include/uapi/linux/io_uring.h) and 64 more bytes; the layout is checked
/// by a test.
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is a repr(C) struct of 128 bytes of plain integer
    // fields, fully initialised by its builder (sqe_zeroed), without padding.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: any 128 bytes are a valid Entry128 (integers and unions of
    // integers only).
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// How many queues the kernel makes: `num_possible_cpus()`
/// (`fuse_uring_create`), the weight of `/sys/devices/system/cpu/possible`.
/// Registering fewer would leave the ring never ready and every request
/// waiting, so an unreadable mask means no io_uring.
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/devices/system/cpu/possible: cannot parse {text:?}"),
        )
    })
}

/// The number of CPUs in a kernel CPU list ("0-3,8,10-11").
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
            n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
        } else {
            let _: usize = part.parse().ok()?;
            n = n.checked_add(1)?;
        }
    }
    (n > 0).then_some(n)
}

/// The payload area every entry needs: the kernel's `max_payload_sz`
/// (`fuse_uring_create`: the largest of `FUSE_MIN_READ_BUFFER`,
/// `fc->max_write` and `fc->max_pages * PAGE_SIZE`), rounded up to pages.
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    let page = page_size::get();
    let need = MIN_PAYLOAD
        .max(max_write as usize)
        .max(usize::from(max_pages) * page);
    need.div_ceil(page) * page
}

/// One entry's memory: the header area at 0 (iov[0]) and the payload area
/// at [`PAYLOAD_OFFSET`] (iov[1]), page-aligned.
struct EntryMem {
    base: NonNull<u8>,
    layout: Layout,
    payload_cap: usize,
}

impl EntryMem {
    fn new(payload_cap: usize) -> io::Result<EntryMem> {
        let layout = Layout::from_size_align(PAYLOAD_OFFSET + payload_cap, page_size::get())
            .map_err(|e| io::Error::other(format!("ring entry of {payload_cap} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(p).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, "allocating a ring entry failed")
        })?;
        Ok(EntryMem {
            base,
            layout,
            payload_cap,
        })
    }

    fn header(&self) -> *mut FuseUringReqHeader {
        self.base.as_ptr().cast()
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: PAYLOAD_OFFSET is inside the allocation.
        unsafe { self.base.as_ptr().add(PAYLOAD_OFFSET) }
    }
}

impl Drop for EntryMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// Where a reply's arguments may be written at once: the entry's payload
/// area, when the request does not borrow it (no payload came with it).
#[derive(Clone, Copy)]
struct PayloadArea {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: the area belongs to the entry of a ring thread that, while a
// request's reply is outstanding, does not touch it and waits for the
// reply (`Slot::wait`) before reusing or freeing the memory; the slot's
// mutex orders the writes before that thread's reads.
unsafe impl Send for PayloadArea {}

/// The reply of the request an entry is serving.
#[derive(Default)]
struct SlotState {
    /// A request is being served and has no reply yet.
    waiting: bool,
    /// The reply's `fuse_out_header`, once it came.
    header: Option<[u8; OUT_HEADER]>,
    /// Its arguments' length.
    len: usize,
    /// Written to the payload area at once when set; else staged.
    direct: Option<PayloadArea>,
    staged: Vec<u8>,
}

#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    replied: Condvar,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

impl Slot {
    fn begin(&self, direct: Option<PayloadArea>) {
        let mut st = self.state.lock();
        st.waiting = true;
        st.header = None;
        st.len = 0;
        st.direct = direct;
        st.staged.clear();
    }

    /// Take a reply (fuser's `ReplySender::send`): `data[0]` is the
    /// `fuse_out_header`, the rest its arguments.
    fn put(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut st = self.state.lock();
        if !st.waiting || st.header.is_some() {
            return Err(io::Error::other("io_uring: a reply to no pending request"));
        }
        let Some((head, args)) = data.split_first() else {
            return Err(io::Error::other("io_uring: an empty reply"));
        };
        let mut header = [0u8; OUT_HEADER];
        if head.len() != OUT_HEADER {
            return Err(io::Error::other(format!(
                "io_uring: a reply header of {} bytes",
                head.len()
            )));
        }
        header.copy_from_slice(head);
        let len: usize = args.iter().map(|a| a.len()).sum();
        match st.direct {
            Some(area) if len > area.cap => {
                set_error(&mut header, libc::EIO);
                st.len = 0;
                error!(
                    "io_uring: a reply of {len} bytes does not fit the {} bytes of the ring entry",
                    area.cap
                );
            }
            Some(area) => {
                let mut at = 0;
                for a in args {
                    // SAFETY: `area` is the entry's payload area, which no
                    // reference borrows while the request is served without
                    // a payload; `at + a.len() <= len <= area.cap`.
                    unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), area.ptr.add(at), a.len()) };
                    at += a.len();
                }
                st.len = len;
            }
            None => {
                for a in args {
                    st.staged.extend_from_slice(a);
                }
                st.len = len;
            }
        }
        st.header = Some(header);
        drop(st);
        self.replied.notify_one();
        Ok(())
    }

    /// Answer with `errno` (0: an empty success) unless a reply came.
    fn answer_if_silent(&self, unique: u64, errno: i32) {
        let mut st = self.state.lock();
        if st.header.is_none() {
            let mut h = [0u8; OUT_HEADER];
            h[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            h[8..16].copy_from_slice(&unique.to_ne_bytes());
            set_error(&mut h, errno);
            st.header = Some(h);
            st.len = 0;
            st.staged.clear();
        }
    }

    /// Wait for the reply; returns its header and length (staged arguments
    /// are still in the state).
    fn wait(&self) -> parking_lot::MutexGuard<'_, SlotState> {
        let mut st = self.state.lock();
        while st.header.is_none() {
            self.replied.wait(&mut st);
        }
        st
    }
}

fn set_error(header: &mut [u8; OUT_HEADER], errno: i32) {
    header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
}

/// fuser's reply sink for a request that came through a ring.
pub(crate) struct UringReply {
    slot: Arc<Slot>,
    /// `/dev/fuse`, for what is not a reply (backing files).
    ch: ChannelSender,
}

impl std::fmt::Debug for UringReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringReply").finish_non_exhaustive()
    }
}

impl UringReply {
    pub(crate) fn new(slot: Arc<Slot>, ch: ChannelSender) -> Self {
        UringReply { slot, ch }
    }

    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        self.slot.put(data)
    }

    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ch
    }
}

/// What a ring thread waits for after it is set up.
enum Command<FS: Filesystem> {
    /// Submit the REGISTER (or, `Some(qid)`, a deliberately invalid one:
    /// see [`Pool::register`]).
    Register(Option<u16>),
    /// Serve requests until the connection ends.
    Start(SessionEventLoop<FS>),
}

/// One ring thread's io_uring, entry and state.
struct Worker {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Freed by `Drop` only when the kernel holds no command naming it.
    mem: ManuallyDrop<EntryMem>,
    iov: [libc::iovec; 2],
    /// `/dev/fuse` (kept open while its descriptor is used).
    ch: Channel,
    slot: Arc<Slot>,
    /// Commands of ours the kernel holds (submitted, not completed): while
    /// any is, the entry's memory must not be freed (the kernel may still
    /// write a request into it).
    pending: u32,
    /// The last command, to resubmit after -EINTR/-EAGAIN.
    last: (u32, u64),
    /// A completion seen right after REGISTER (a request already).
    early: Option<cqueue::Entry>,
    /// For a request whose parts cannot be joined in place.
    scratch: Vec<u64>,
}

impl Worker {
    fn new(qid: u16, ch: Channel, payload_cap: usize) -> io::Result<Worker> {
        let mem = EntryMem::new(payload_cap)?;
        // One command in flight; the completion queue is twice as large.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let iov = [
            libc::iovec {
                iov_base: mem.header().cast(),
                iov_len: size_of::<FuseUringReqHeader>(),
            },
            libc::iovec {
                iov_base: mem.payload().cast(),
                iov_len: payload_cap,
            },
        ];
        Ok(Worker {
            qid,
            ring,
            mem: ManuallyDrop::new(mem),
            iov,
            ch,
            slot: Arc::default(),
            pending: 0,
            last: (FUSE_IO_URING_CMD_REGISTER, 0),
            early: None,
            scratch: Vec::new(),
        })
    }

    fn sqe(&self, cmd_op: u32, commit_id: u64, qid: u16) -> squeue::Entry128 {
        let fd = types::Fd(self.ch.as_fd().as_raw_fd());
        let b = opcode::UringCmd80::new(fd, cmd_op).cmd(cmd_req(commit_id, qid));
        if cmd_op == FUSE_IO_URING_CMD_REGISTER {
            let e = b
                .addr(Some(self.iov.as_ptr() as u64))
                .build()
                .user_data(ENTRY_TAG);
            with_len(e, FUSE_URING_IOV_SEGS)
        } else {
            b.build().user_data(ENTRY_TAG)
        }
    }

    fn push(&mut self, cmd_op: u32, commit_id: u64, qid: u16) -> io::Result<()> {
        let sqe = self.sqe(cmd_op, commit_id, qid);
        // SAFETY: the iovecs and the entry memory they point at live in
        // `self` for as long as the kernel may use them (`pending` keeps
        // the memory from being freed while it might).
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.pending += 1;
        self.last = (cmd_op, commit_id);
        Ok(())
    }

    /// REGISTER this thread's entry on its queue (`invalid_qid`: on that
    /// queue number instead, which the kernel refuses, falling back to
    /// `/dev/fuse`). A failed REGISTER completes at once, during the
    /// submission (`fuse_uring_cmd` returns the error instead of
    /// -EIOCBQUEUED); a good one stays pending until a request comes.
    fn register(&mut self, invalid_qid: Option<u16>) -> io::Result<()> {
        self.push(
            FUSE_IO_URING_CMD_REGISTER,
            0,
            invalid_qid.unwrap_or(self.qid),
        )?;
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        if let Some(c) = self.ring.completion().next() {
            self.pending = self.pending.saturating_sub(1);
            if c.result() < 0 {
                return Err(io::Error::from_raw_os_error(-c.result()));
            }
            // The ring became ready with this entry and a request came at once.
            self.early = Some(c);
        }
        Ok(())
    }

    fn next_completion(&mut self) -> io::Result<cqueue::Entry> {
        if let Some(c) = self.early.take() {
            return Ok(c);
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {}
                Err(e) => return Err(e),
            }
            if let Some(c) = self.ring.completion().next() {
                // Its command is no longer held by the kernel.
                self.pending = self.pending.saturating_sub(1);
                return Ok(c);
            }
        }
    }

    /// Serve until the connection ends.
    fn serve<FS: Filesystem>(&mut self, se: &SessionEventLoop<FS>) -> io::Result<()> {
        loop {
            let c = self.next_completion()?;
            let res = c.result();
            if res < 0 {
                match -res {
                    // The connection ended (fuse_uring_stop_queues,
                    // fuse_uring_cancel) or was never ready to serve.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                        return Ok(());
                    }
                    libc::EINTR | libc::EAGAIN => {
                        let (op, id) = self.last;
                        self.push(op, id, self.qid)?;
                        continue;
                    }
                    e => {
                        error!("io_uring queue {}: command failed: errno {e}", self.qid);
                        return Err(io::Error::from_raw_os_error(e));
                    }
                }
            }
            let commit_id = self.handle(se);
            if commit_id == 0 {
                // The kernel could not match a commit to its request
                // (ring_ent_in_out.commit_id is the request's unique, never 0).
                return Err(io::Error::other(format!(
                    "io_uring queue {}: a request without a commit id",
                    self.qid
                )));
            }
            self.push(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, commit_id, self.qid)?;
        }
    }

    /// Serve the request in the entry and put its reply there; returns the
    /// commit id.
    fn handle<FS: Filesystem>(&mut self, se: &SessionEventLoop<FS>) -> u64 {
        let hdr = self.mem.header();
        // SAFETY: the entry is ours until it is committed: the kernel wrote
        // it before completing the command (fuse_uring_send_next_to_ring) and
        // does not touch it again before our COMMIT_AND_FETCH.
        let (ent, in_header) = unsafe {
            let ent = std::ptr::read(std::ptr::addr_of!((*hdr).ring_ent_in_out));
            let mut h = [0u8; IN_HEADER];
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!((*hdr).in_out).cast::<u8>(),
                h.as_mut_ptr(),
                IN_HEADER,
            );
            (ent, h)
        };
        let len =
            u32::from_ne_bytes([in_header[0], in_header[1], in_header[2], in_header[3]]) as usize;
        let mut unique_bytes = [0u8; 8];
        unique_bytes.copy_from_slice(&in_header[8..16]);
        let unique = u64::from_ne_bytes(unique_bytes);
        let payload = ent.payload_sz as usize;
        // The per-opcode struct is what the message has besides the header
        // and the payload (the kernel sets in.len for the whole message:
        // fuse_send_one, fuse_request_queue_background_uring).
        let op_len = len
            .checked_sub(IN_HEADER)
            .and_then(|l| l.checked_sub(payload))
            .filter(|&l| l <= OP_IN_SZ && payload <= self.mem.payload_cap);
        let Some(op_len) = op_len else {
            error!(
                "io_uring queue {}: malformed request (len {len}, payload {payload} of {})",
                self.qid, self.mem.payload_cap
            );
            self.slot.begin(None);
            self.slot.answer_if_silent(unique, libc::EIO);
            self.finish();
            return ent.commit_id;
        };
        let start = PAYLOAD_OFFSET - IN_HEADER - op_len;
        // SAFETY: start..PAYLOAD_OFFSET lies between the header area (288
        // bytes) and the payload area, in our allocation; header and op_in
        // are read from the header area. The request is valid for
        // `IN_HEADER + op_len + payload` bytes from `start`.
        let data: &[u8] = unsafe {
            let base = self.mem.base.as_ptr();
            std::ptr::copy_nonoverlapping(in_header.as_ptr(), base.add(start), IN_HEADER);
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!((*hdr).op_in).cast::<u8>(),
                base.add(start + IN_HEADER),
                op_len,
            );
            std::slice::from_raw_parts(base.add(start), IN_HEADER + op_len + payload)
        };
        // Every per-opcode struct is a multiple of 8 bytes ("all structures
        // are padded to 64bit boundary", fuse.h), so `start` is aligned for
        // the parser; should one not be, the request is copied.
        let data: &[u8] = if start % 8 == 0 {
            data
        } else {
            self.scratch.clear();
            self.scratch.resize(data.len().div_ceil(8), 0);
            // SAFETY: `scratch` holds at least data.len() bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.scratch.as_mut_ptr().cast::<u8>(),
                    data.len(),
                );
                std::slice::from_raw_parts(self.scratch.as_ptr().cast::<u8>(), data.len())
            }
        };
        // A request without payload leaves the payload area free for the
        // reply (READ's data goes there directly).
        let direct = (payload == 0).then_some(PayloadArea {
            ptr: self.mem.payload(),
            cap: self.mem.payload_cap,
        });
        self.slot.begin(direct);
        match RequestWithSender::new_uring(se.ch.sender(), self.slot.clone(), data) {
            Some(req) => match req.request.operation() {
                // Answered; the kernel then ends the connection
                // (fuse_conn_destroy) and the thread ends with ENOTCONN.
                // The filesystem's destroy() runs when every thread is done.
                Ok(Operation::Destroy(_)) => req.reply::<ReplyEmpty>().ok(),
                // These come through /dev/fuse, not through a ring
                // (fuse_io_uring_ops); should one come, it has no reply,
                // but the entry must still be committed.
                Ok(Operation::Forget(_) | Operation::BatchForget(_)) => {
                    req.dispatch(se);
                    self.slot.answer_if_silent(unique, 0);
                }
                _ => req.dispatch(se),
            },
            None => self.slot.answer_if_silent(unique, libc::EIO),
        }
        self.finish();
        ent.commit_id
    }

    /// Wait for the reply, then put it in the entry for the commit.
    fn finish(&mut self) {
        let hdr = self.mem.header();
        let mut st = self.slot.wait();
        let Some(mut header) = st.header else { return };
        let mut len = st.len;
        if st.direct.is_none() && len > 0 {
            if len > self.mem.payload_cap {
                error!(
                    "io_uring: a reply of {len} bytes does not fit the {} bytes of the ring entry",
                    self.mem.payload_cap
                );
                set_error(&mut header, libc::EIO);
                len = 0;
            } else {
                // SAFETY: the request no longer borrows the entry (it was
                // dropped before), and len <= payload_cap.
                unsafe {
                    std::ptr::copy_nonoverlapping(st.staged.as_ptr(), self.mem.payload(), len)
                };
            }
        }
        st.waiting = false;
        st.direct = None;
        drop(st);
        // SAFETY: the entry is ours until committed (see `handle`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                header.as_ptr(),
                std::ptr::addr_of_mut!((*hdr).in_out).cast::<u8>(),
                OUT_HEADER,
            );
            std::ptr::addr_of_mut!((*hdr).ring_ent_in_out.payload_sz).write(len as u32);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.pending > 0 {
            // The kernel may still hold a command naming this memory and
            // write a request into it; keep it (bounded: one entry per ring
            // thread, only on paths that abandon a registered ring).
            warn!(
                "io_uring queue {}: keeping a ring entry the kernel may still use",
                self.qid
            );
        } else {
            // SAFETY: dropped once, here; no command of ours is held by the
            // kernel, so nothing writes to the memory any more.
            unsafe { ManuallyDrop::drop(&mut self.mem) }
        }
    }
}

/// Pin the calling thread to `cpu` (best effort: a CPU that is possible but
/// offline refuses, and the thread then runs anywhere).
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET is bounds-checked below.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * size_of::<libc::cpu_set_t>() {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "io_uring queue {cpu}: not pinned: {}",
                io::Error::last_os_error()
            );
        }
    }
}

struct Handle<FS: Filesystem> {
    qid: u16,
    tx: mpsc::Sender<Command<FS>>,
    reports: mpsc::Receiver<io::Result<()>>,
    thread: JoinHandle<io::Result<()>>,
}

/// The ring threads of a session, from before FUSE_INIT's reply until
/// they are started.
pub(crate) struct Pool<FS: Filesystem> {
    handles: Vec<Handle<FS>>,
    queues: usize,
}

impl<FS: Filesystem> std::fmt::Debug for Pool<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("queues", &self.queues)
            .field("threads", &self.handles.len())
            .finish()
    }
}

impl<FS: Filesystem> Pool<FS> {
    /// Start `per_queue` threads for each of `queues` queues, each with its
    /// ring and entry of `payload_cap` bytes; fails if any cannot be set up
    /// (before FUSE_INIT's reply: nothing is promised to the kernel yet).
    pub(crate) fn prepare(
        ch: &Channel,
        queues: usize,
        per_queue: usize,
        payload_cap: usize,
    ) -> io::Result<Self> {
        let qmax = u16::try_from(queues).map_err(|_| {
            io::Error::other(format!(
                "{queues} queues: more than io_uring's u16 queue ids"
            ))
        })?;
        let mut pool = Pool {
            handles: Vec::with_capacity(queues * per_queue),
            queues,
        };
        for k in 0..per_queue {
            for qid in 0..qmax {
                let (tx, rx) = mpsc::channel::<Command<FS>>();
                let (rtx, reports) = mpsc::channel();
                let ch = ch.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("fuser-uring-{qid}.{k}"))
                    .spawn(move || ring_thread(qid, ch, payload_cap, rx, rtx))?;
                let h = Handle {
                    qid,
                    tx,
                    reports,
                    thread,
                };
                let ready = h
                    .reports
                    .recv()
                    .unwrap_or_else(|_| Err(io::Error::other("a ring thread ended")));
                pool.handles.push(h);
                ready
                    .map_err(|e| io::Error::new(e.kind(), format!("io_uring queue {qid}: {e}")))?;
            }
        }
        Ok(pool)
    }

    /// Queues and ring threads.
    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.queues, self.handles.len())
    }

    /// Register every entry (after FUSE_INIT's reply granted
    /// FUSE_OVER_IO_URING). One at a time, and the first entry of the last
    /// queue last: the ring turns ready only with that one, so every other
    /// registration has succeeded by then. On failure the kernel is made to
    /// fall back to `/dev/fuse`: a failed REGISTER does that itself
    /// (`fc->io_uring = 0` in `fuse_uring_cmd`); after any other failure a
    /// REGISTER for a queue that does not exist is sent to make it so.
    ///
    /// `Err((error, true))`: not registered, and the kernel serves through
    /// `/dev/fuse`. `Err((error, false))`: the kernel could not be made to
    /// fall back; the connection would hold every request, so the mount
    /// must fail.
    pub(crate) fn register(&mut self) -> Result<(), (io::Error, bool)> {
        // Threads are made queue by queue for each round (`prepare`): the
        // first thread of the last queue is at `queues - 1`.
        let last = self.queues - 1;
        let order = (0..self.handles.len()).filter(|&i| i != last).chain([last]);
        for i in order {
            let h = &self.handles[i];
            let r =
                h.tx.send(Command::Register(None))
                    .map_err(|_| io::Error::other("a ring thread ended"))
                    .and_then(|()| {
                        h.reports
                            .recv()
                            .unwrap_or_else(|_| Err(io::Error::other("a ring thread ended")))
                    });
            if let Err(e) = r {
                let e = io::Error::new(
                    e.kind(),
                    format!("registering io_uring queue {}: {e}", h.qid),
                );
                return Err(match self.fall_back() {
                    Ok(()) => (e, true),
                    Err(f) => (io::Error::new(e.kind(), format!("{e}; {f}")), false),
                });
            }
        }
        Ok(())
    }

    /// Make sure the kernel serves through `/dev/fuse`: a REGISTER naming
    /// queue `u16::MAX` fails with -EINVAL (`qid >= ring->nr_queues` in
    /// `fuse_uring_register`), which sets `fc->io_uring = 0` and wakes the
    /// waiting requests (`fuse_uring_cmd`).
    fn fall_back(&mut self) -> io::Result<()> {
        for h in &self.handles {
            if h.tx.send(Command::Register(Some(u16::MAX))).is_err() {
                continue;
            }
            match h.reports.recv() {
                // EOPNOTSUPP: io_uring is off for the connection already
                // (`!enable_uring && !fc->io_uring`).
                Ok(Err(e)) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    return Ok(());
                }
                _ => continue,
            }
        }
        Err(io::Error::other(
            "io_uring registration failed and the kernel could not be made to fall back to /dev/fuse",
        ))
    }

    /// Start serving; each thread gets its own event loop context.
    pub(crate) fn start(
        mut self,
        mut ctx: impl FnMut(String) -> SessionEventLoop<FS>,
    ) -> Vec<JoinHandle<io::Result<()>>> {
        let mut threads = Vec::with_capacity(self.handles.len());
        for h in std::mem::take(&mut self.handles) {
            let name = h
                .thread
                .thread()
                .name()
                .unwrap_or("fuser-uring")
                .to_string();
            // A thread that ended already reports through its join handle.
            let _ = h.tx.send(Command::Start(ctx(name)));
            threads.push(h.thread);
        }
        threads
    }
}

impl<FS: Filesystem> Drop for Pool<FS> {
    fn drop(&mut self) {
        // Not started: closing the command channels ends the threads.
        for h in self.handles.drain(..) {
            drop(h.tx);
            let _ = h.thread.join();
        }
    }
}

/// Tests of the fallback (debug builds only): `FUSER_URING_TEST_FAIL_QUEUE=N`
/// makes queue N's REGISTER name a queue that does not exist, so that the
/// kernel refuses it as it would a real failure.
fn injected_failure(qid: u16) -> Option<u16> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let n: u16 = std::env::var("FUSER_URING_TEST_FAIL_QUEUE")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (n == qid).then_some(u16::MAX)
}

fn ring_thread<FS: Filesystem>(
    qid: u16,
    ch: Channel,
    payload_cap: usize,
    rx: mpsc::Receiver<Command<FS>>,
    report: mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    pin_to(usize::from(qid));
    let mut w = match Worker::new(qid, ch, payload_cap) {
        Ok(w) => {
            let _ = report.send(Ok(()));
            w
        }
        Err(e) => {
            let _ = report.send(Err(e));
            return Ok(());
        }
    };
    while let Ok(cmd) = rx.recv() {
        match cmd {
            Command::Register(invalid) => {
                let _ = report.send(w.register(invalid.or_else(|| injected_failure(qid))));
            }
            Command::Start(se) => {
                debug!("io_uring queue {qid}: serving");
                return w.serve(&se);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn payload_covers_the_kernels_max_payload() {
        let page = page_size::get();
        assert_eq!(payload_size(4096, 1), MIN_PAYLOAD.div_ceil(page) * page);
        assert!(payload_size(1 << 20, 257) >= 257 * page);
        assert!(payload_size(1 << 20, 1) >= 1 << 20);
    }

    /// The SQE we hand the kernel, byte by byte against `struct
    /// io_uring_sqe` (include/uapi/linux/io_uring.h): this guards the
    /// `len` patch against a change of io-uring's Entry128 layout.
    #[test]
    fn register_sqe_layout() {
        let iov = [0u8; 32];
        let e = opcode::UringCmd80::new(types::Fd(7), FUSE_IO_URING_CMD_REGISTER)
            .cmd(cmd_req(0x1122334455667788, 3))
            .addr(Some(iov.as_ptr() as u64))
            .build()
            .user_data(ENTRY_TAG);
        let e = with_len(e, FUSE_URING_IOV_SEGS);
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], 46, "opcode IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            1,
            "cmd_op"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64,
            "addr"
        );
        assert_eq!(
            u32::from_ne_bytes(raw[24..28].try_into().unwrap()),
            2,
            "len"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[32..40].try_into().unwrap()),
            ENTRY_TAG,
            "user_data"
        );
        // cmd[] starts at byte 48: fuse_uring_cmd_req {flags, commit_id, qid}.
        assert_eq!(
            u64::from_ne_bytes(raw[48..56].try_into().unwrap()),
            0,
            "flags"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[56..64].try_into().unwrap()),
            0x1122334455667788,
            "commit_id"
        );
        assert_eq!(
            u16::from_ne_bytes(raw[64..66].try_into().unwrap()),
            3,
            "qid"
        );
        assert!(raw[66..].iter().all(|&b| b == 0));
    }

    /// A reply's header and arguments land where the kernel reads them.
    #[test]
    fn replies_direct_and_staged() {
        let mut payload = vec![0u8; 64];
        let slot = Slot::default();
        let head = [16u8 + 5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0];
        slot.begin(Some(PayloadArea {
            ptr: payload.as_mut_ptr(),
            cap: payload.len(),
        }));
        slot.put(&[
            io::IoSlice::new(&head),
            io::IoSlice::new(b"ab"),
            io::IoSlice::new(b"cde"),
        ])
        .unwrap();
        assert!(
            slot.put(&[io::IoSlice::new(&head)]).is_err(),
            "one reply per request"
        );
        {
            let st = slot.wait();
            assert_eq!((st.header, st.len), (Some(head), 5));
        }
        assert_eq!(&payload[..5], b"abcde");
        slot.begin(None);
        slot.put(&[io::IoSlice::new(&head), io::IoSlice::new(b"xyz")])
            .unwrap();
        let st = slot.wait();
        assert_eq!((st.len, &st.staged[..]), (3, &b"xyz"[..]));
        drop(st);
        // Too large for the area: an EIO reply instead.
        slot.begin(Some(PayloadArea {
            ptr: payload.as_mut_ptr(),
            cap: 2,
        }));
        slot.put(&[io::IoSlice::new(&head), io::IoSlice::new(b"xyz")])
            .unwrap();
        let st = slot.wait();
        assert_eq!(st.len, 0);
        assert_eq!(
            i32::from_ne_bytes(st.header.unwrap()[4..8].try_into().unwrap()),
            -libc::EIO
        );
        drop(st);
        slot.begin(None);
        slot.answer_if_silent(42, libc::ENOSYS);
        let h = slot.wait().header.unwrap();
        assert_eq!(u64::from_ne_bytes(h[8..16].try_into().unwrap()), 42);
        assert_eq!(
            i32::from_ne_bytes(h[4..8].try_into().unwrap()),
            -libc::ENOSYS
        );
    }
}
