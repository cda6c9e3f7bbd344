//! SIGTERM and SIGINT stop the installer: the handler writes one byte to the stop pipe (the
//! only async-signal-safe way to wake the loop), which then uninstalls and exits.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use super::watch::StopHandle;
use crate::error::{Error, Result};

static STOP_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd: RawFd = STOP_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let saved = Errno::last_raw();
        // SAFETY: write(2) is async-signal-safe; the pipe stays open while the handle lives.
        unsafe {
            libc::write(fd, b"t".as_ptr().cast(), 1);
        }
        Errno::set_raw(saved);
    }
}

/// Make SIGTERM and SIGINT call `stop.stop()` (in effect). `stop` (or a clone) must live as
/// long as the process may receive them.
pub fn stop_on_signals(stop: &StopHandle) -> Result<()> {
    STOP_FD.store(stop.raw_write_fd(), Ordering::SeqCst);
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only touches an atomic and calls write(2).
        unsafe { sigaction(sig, &action) }
            .map_err(|e| Error::Watch(format!("sigaction({sig}): {e}")))?;
    }
    Ok(())
}
