//! Keeping the installation in place: inotify on the net dir, the service account's directory
//! and the bin dirs, a periodic re-check in case an event was missed, and a stop pipe (written
//! by `StopHandle::stop` or by the SIGTERM/SIGINT handler) that wakes the loop at once.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::config_file::ConfigStatus;
use super::installer::Installer;
use super::rate_limit::RewriteLimiter;
use super::Progress;
use crate::atomic_file::TEMP_MARKER;
use crate::error::{Error, Result};
use crate::telemetry::Install;
use crate::PLUGIN_TYPE;
use cni_protocol::events::{Readiness, READY_NAME};

/// Stops a running `watch` (and so `run`) from another thread or a signal handler.
#[derive(Debug, Clone)]
pub struct StopHandle {
    inner: Arc<StopPipe>,
}

#[derive(Debug)]
struct StopPipe {
    read: OwnedFd,
    write: OwnedFd,
    stopped: AtomicBool,
}

impl StopHandle {
    /// A handle not stopped yet, on a new pipe.
    pub fn new() -> Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| Error::Watch(format!("pipe: {e}")))?;
        Ok(StopHandle {
            inner: Arc::new(StopPipe {
                read,
                write,
                stopped: AtomicBool::new(false),
            }),
        })
    }

    /// Ask the loop to stop; it wakes at once.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.inner.write, b"s");
    }

    /// Whether `stop` was called or a byte arrived on the pipe (from a signal handler).
    pub fn is_stopped(&self) -> bool {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return true;
        }
        let mut fds = [PollFd::new(self.inner.read.as_fd(), PollFlags::POLLIN)];
        let readable = matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0);
        if readable {
            self.inner.stopped.store(true, Ordering::SeqCst);
        }
        readable
    }

    /// The pipe's write end, for a signal handler (valid while any clone of `self` lives).
    pub(crate) fn raw_write_fd(&self) -> RawFd {
        self.inner.write.as_raw_fd()
    }
}

/// The watch loop's timings and limits.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Re-check everything this often even without events.
    pub resync: Duration,
    /// After an event, wait until events stop for this long before acting (another installer
    /// often writes several files in a row).
    pub debounce: Duration,
    /// After an error, retry this soon.
    pub retry: Duration,
    /// More config rewrites than this per `rewrite_window` is a fight with another installer.
    pub max_rewrites: usize,
    /// The sliding window `max_rewrites` counts over.
    pub rewrite_window: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            resync: Duration::from_secs(60),
            debounce: Duration::from_millis(100),
            retry: Duration::from_secs(5),
            max_rewrites: 10,
            rewrite_window: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    NetDir,
    Credentials,
    BinDir,
    /// The run directory: the plugin's kubeconfig and the agent's status file.
    RunDir,
}

#[derive(Debug, Default, Clone, Copy)]
struct Pending {
    config: bool,
    kubeconfig: bool,
    binaries: bool,
}

impl Pending {
    fn all() -> Self {
        Pending {
            config: true,
            kubeconfig: true,
            binaries: true,
        }
    }
    fn any(&self) -> bool {
        self.config || self.kubeconfig || self.binaries
    }
    fn add(&mut self, other: &Pending) {
        self.config |= other.config;
        self.kubeconfig |= other.kubeconfig;
        self.binaries |= other.binaries;
    }
}

struct Watches {
    inotify: Inotify,
    kinds: HashMap<WatchDescriptor, Kind>,
    /// The files of the run directory a pass puts right: the kubeconfig, the status file.
    run_files: Vec<String>,
}

const DIR_EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

impl Watches {
    fn new(inst: &Installer) -> Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| Error::Watch(format!("inotify_init: {e}")))?;
        let kubeconfig = inst.settings.kubeconfig_path();
        let mut w = Watches {
            inotify,
            kinds: HashMap::new(),
            run_files: [kubeconfig.file_name(), Some(READY_NAME.as_ref())]
                .into_iter()
                .flatten()
                .map(|n| n.to_string_lossy().into_owned())
                .collect(),
        };
        let net_dir = inst.config.net_dir().to_path_buf();
        std::fs::create_dir_all(&net_dir).map_err(|e| Error::io("create", &net_dir, e))?;
        w.add(&net_dir, Kind::NetDir, true)?;
        for dir in inst.kubeconfig.watched_dirs() {
            w.add(&dir, Kind::Credentials, false)?;
        }
        for dir in &inst.settings.cni_bin_dirs {
            w.add(dir, Kind::BinDir, false)?;
        }
        // A kubeconfig or status file replaced behind our back is put right at once, not at
        // the next resync.
        w.add(&inst.settings.cni_agent_run_dir, Kind::RunDir, false)?;
        Ok(w)
    }

    fn add(&mut self, dir: &Path, kind: Kind, required: bool) -> Result<()> {
        match self.inotify.add_watch(dir, DIR_EVENTS) {
            Ok(wd) => {
                self.kinds.insert(wd, kind);
                Ok(())
            }
            Err(e) if required => Err(Error::Watch(format!("inotify on {}: {e}", dir.display()))),
            Err(e) => {
                tracing::warn!(
                    "cannot watch {} ({e}); it is re-checked every resync only",
                    dir.display()
                );
                Ok(())
            }
        }
    }

    /// Read what is queued: what needs a look, and whether the watches must be set up again.
    fn drain(&self, pending: &mut Pending) -> bool {
        let mut rebuild = false;
        loop {
            let events = match self.inotify.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                Ok(_) | Err(Errno::EAGAIN) => return rebuild,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("reading inotify events: {e}");
                    *pending = Pending::all();
                    return true;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    *pending = Pending::all();
                    continue;
                }
                if ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                ) {
                    // A watched directory went away or moved: watch it again.
                    *pending = Pending::all();
                    rebuild = true;
                    continue;
                }
                let name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
                if name.as_deref().is_some_and(|n| n.contains(TEMP_MARKER)) {
                    continue; // our own temporary file
                }
                match self.kinds.get(&ev.wd) {
                    Some(Kind::NetDir) => pending.config = true,
                    Some(Kind::Credentials) => pending.kubeconfig = true,
                    Some(Kind::BinDir) if name.as_deref() == Some(PLUGIN_TYPE) => {
                        pending.binaries = true
                    }
                    Some(Kind::RunDir)
                        if name
                            .as_deref()
                            .is_some_and(|n| self.run_files.iter().any(|f| f == n)) =>
                    {
                        pending.kubeconfig = true
                    }
                    Some(Kind::BinDir | Kind::RunDir) | None => {}
                }
            }
        }
    }
}

/// Wait until the stop pipe or inotify is readable, or `timeout` passes. `true`: stop.
fn wait(watches: &Watches, stop: &StopHandle, timeout: Duration) -> bool {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [
        PollFd::new(stop.inner.read.as_fd(), PollFlags::POLLIN),
        PollFd::new(watches.inotify.as_fd(), PollFlags::POLLIN),
    ];
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(_) | Err(Errno::EINTR) => {}
        Err(e) => {
            tracing::warn!("poll: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let readable = fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP));
    readable || stop.is_stopped()
}

/// Whether the plugin is installed after a pass, and if not, why.
fn verdict(failed: &Pending, held: bool, last: Option<&ConfigStatus>) -> Readiness {
    let why = if failed.binaries {
        "the plugin binary could not be copied into the CNI bin directories"
    } else if failed.kubeconfig {
        "the plugin's kubeconfig could not be written"
    } else if failed.config {
        "the CNI config could not be written"
    } else if held {
        "rewrites of the CNI config are held back: something keeps removing our entry"
    } else {
        match last {
            Some(ConfigStatus::Written(_) | ConfigStatus::Unchanged(_)) => return Readiness::Ready,
            Some(ConfigStatus::Waiting) => "waiting for a CNI config to chain into",
            None => "the CNI config is not written yet",
        }
    };
    Readiness::NotReady(why.into())
}

/// Watch and repair until `stop`. The watches are set up first and everything is checked
/// right after, so no change made before the loop starts goes unseen. `progress` hears, after
/// every pass, whether the plugin is installed (binaries, kubeconfig and CNI config in place)
/// or why not, and each install step's result.
pub fn watch(
    inst: &mut Installer,
    stop: &StopHandle,
    opts: &WatchOptions,
    progress: &dyn Progress,
) -> Result<()> {
    let mut watches = Watches::new(inst)?;
    let mut w = Watcher::new(inst, opts, progress);
    loop {
        let retry_at = w.pass();
        let deadline = [Some(w.next_resync), w.hold_until, retry_at]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(w.next_resync);
        if wait(
            &watches,
            stop,
            deadline.saturating_duration_since(Instant::now()),
        ) {
            return Ok(());
        }
        let mut rebuild = watches.drain(&mut w.pending);
        // Debounce: let a burst of writes finish.
        while w.pending.any() {
            if wait(&watches, stop, opts.debounce) {
                return Ok(());
            }
            let mut more = Pending::default();
            rebuild |= watches.drain(&mut more);
            if !more.any() {
                break;
            }
            w.pending.add(&more);
        }
        if rebuild {
            watches = Watches::new(w.inst)?;
        }
        w.schedule(retry_at);
    }
}

/// What the watch loop keeps between passes.
struct Watcher<'a> {
    inst: &'a mut Installer,
    opts: &'a WatchOptions,
    progress: &'a dyn Progress,
    limiter: RewriteLimiter,
    next_resync: Instant,
    /// Rewrites of the CNI config are held back until then (a rewrite loop).
    hold_until: Option<Instant>,
    /// The steps to run at the next pass, and those whose last run failed.
    pending: Pending,
    failed: Pending,
    last: Option<ConfigStatus>,
    installed_once: bool,
    /// The last error logged, so that a lasting one is not logged at every retry.
    last_error: String,
}

impl<'a> Watcher<'a> {
    fn new(inst: &'a mut Installer, opts: &'a WatchOptions, progress: &'a dyn Progress) -> Self {
        Watcher {
            inst,
            opts,
            progress,
            limiter: RewriteLimiter::new(opts.max_rewrites, opts.rewrite_window),
            next_resync: Instant::now() + opts.resync,
            hold_until: None,
            pending: Pending::all(),
            failed: Pending::default(),
            last: None,
            installed_once: false,
            last_error: String::new(),
        }
    }

    /// Runs the pending steps, tells `progress` where the install stands; returns when to
    /// retry what failed.
    fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        if std::mem::take(&mut self.pending.binaries) {
            self.failed.binaries = false;
            if let Err(e) = self.inst.install_binaries() {
                self.fail(Install::CopyBinariesFailure, e);
                self.failed.binaries = true;
            }
        }
        if std::mem::take(&mut self.pending.kubeconfig) {
            self.failed.kubeconfig = false;
            if let Err(e) = self.inst.ensure_kubeconfig() {
                self.fail(super::kubeconfig_failure(&e), e);
                self.failed.kubeconfig = true;
            }
        }
        if self.pending.config && self.hold_until.is_none() {
            self.pending.config = false;
            self.failed.config = false;
            match self.inst.reconcile_config() {
                Ok(status) => self.config_done(status, now),
                Err(e) => {
                    self.fail(Install::CreateCniConfigFailure, e);
                    self.failed.config = true;
                }
            }
        }
        if !self.failed.any() {
            self.last_error.clear();
        }
        let ready = verdict(&self.failed, self.hold_until.is_some(), self.last.as_ref());
        self.progress.ready(&ready);
        self.failed.any().then(|| Instant::now() + self.opts.retry)
    }

    fn fail(&mut self, result: Install, e: Error) {
        self.progress.installed(result);
        report(e, &mut self.last_error, self.opts);
    }

    /// What the CNI config's pass did: counted, logged once, and a rewrite once it had been
    /// in place (a repair) counted against the rewrite limit.
    fn config_done(&mut self, status: ConfigStatus, now: Instant) {
        if matches!(
            (&status, &self.last),
            (ConfigStatus::Written(_), _) | (ConfigStatus::Unchanged(_), None)
        ) {
            self.progress.installed(Install::Success);
        }
        match (&status, &self.last) {
            (ConfigStatus::Waiting, Some(ConfigStatus::Waiting)) => {}
            (ConfigStatus::Waiting, _) => tracing::info!(
                "waiting for a CNI config in {} to chain into ({})",
                self.inst.config.net_dir().display(),
                self.inst.config.describe_dir()
            ),
            (ConfigStatus::Unchanged(path), None) => {
                tracing::info!("the CNI config {} is already in place", path.display())
            }
            (ConfigStatus::Written(path), _) if self.installed_once => {
                self.limiter.record(now);
                if let Some(wait) = self.limiter.wait_needed(now) {
                    self.hold_until = Some(now + wait);
                    warn_rewrite_loop(self.inst, path, self.limiter.count(), self.opts, wait);
                }
            }
            _ => {}
        }
        self.installed_once |= !matches!(status, ConfigStatus::Waiting);
        self.last = Some(status);
    }

    /// After a wait: everything at the resync, what failed at its retry, the config when its
    /// hold ends.
    fn schedule(&mut self, retry_at: Option<Instant>) {
        let now = Instant::now();
        if now >= self.next_resync {
            self.pending = Pending::all();
            self.next_resync = now + self.opts.resync;
        }
        if retry_at.is_some_and(|t| now >= t) {
            let failed = self.failed;
            self.pending.add(&failed);
        }
        if self.hold_until.is_some_and(|t| now >= t) {
            self.hold_until = None;
            self.pending.config = true;
        }
    }
}

/// Log an error unless it is the one logged last.
fn report(e: Error, last_error: &mut String, opts: &WatchOptions) {
    let text = redirect_program::errors::chain(&e);
    if text != *last_error {
        tracing::error!("{text}; retrying every {}s", opts.retry.as_secs().max(1));
        *last_error = text;
    }
}

fn warn_rewrite_loop(
    inst: &Installer,
    path: &Path,
    count: usize,
    opts: &WatchOptions,
    wait: Duration,
) {
    let culprit = match inst.config.owner_hint() {
        Some(t) => format!(" (likely the owner of the {t:?} plugin)"),
        None => String::new(),
    };
    tracing::warn!(
        "the CNI config {} had to be rewritten {count} times in {}s: another CNI{culprit} keeps \
         rewriting its config without our entry; for Cilium set cni.exclusive=false; next \
         repair in {}s",
        path.display(),
        opts.rewrite_window.as_secs(),
        wait.as_secs().max(1)
    );
}
