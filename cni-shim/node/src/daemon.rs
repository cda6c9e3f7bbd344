//! `redirect-cni-node`: the node DaemonSet's process. It installs the plugin (`install`)
//! and runs the node agent beside it (`agent`: repair, untaint, metrics and probes), told when
//! the plugin is installed and stopped before anything is uninstalled.

use std::cell::RefCell;
use std::ffi::OsString;

use redirect_program::logging::Sink;
use tracing::level_filters::LevelFilter;

use crate::agent::Agent;
use crate::informers::KnownPods;
use crate::install::{self, signals, StopHandle, WatchOptions};
use crate::settings::{self, Parsed, Settings};
use crate::telemetry::Install;
use crate::upgrade::Stop;
use crate::Error;
use cni_protocol::events::Readiness;

/// `redirect-cni-node [flags]`: `args` are the arguments after the binary (a leading
/// `install`, as `redirect-cni install` passes it, is skipped; a leading `hand-back` runs
/// [`crate::hand_back::main`] instead), `env` looks up environment variables. Returns the
/// exit code: 0 after a clean stop (SIGTERM/SIGINT) or `--help`, 1 on failure, 2 on bad flags.
pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    // `level<TAB>message` on stderr, from info up, the agent's lines and kube's warnings too.
    redirect_program::logging::install(Sink::stderr(None, LevelFilter::INFO));
    let hand_back = args.first().is_some_and(|a| a == "hand-back");
    let args = if hand_back { args[1..].to_vec() } else { args };
    let settings = match settings::parse(args, env) {
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            return 0;
        }
        Ok(Parsed::Run(s)) => *s,
        Err(e) => {
            tracing::error!("{}", redirect_program::errors::chain(&e));
            return 2;
        }
    };
    // The configured levels (Istio's scope:level list) and format, from here on.
    redirect_program::logging::install(Sink {
        json: settings.log_as_json,
        ..Sink::stderr(None, LevelFilter::INFO).with_levels(settings.log_levels.clone())
    });
    if hand_back {
        return crate::hand_back::main(&settings);
    }
    let stop = match StopHandle::new().and_then(|s| signals::stop_on_signals(&s).map(|()| s)) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{}", redirect_program::errors::chain(&e));
            return 1;
        }
    };
    log_start(&settings);
    let agent = match Agent::start(&settings) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{}", redirect_program::errors::chain(&e));
            return if matches!(e, Error::InvalidSetting { .. }) {
                2
            } else {
                1
            };
        }
    };
    match run(settings, &stop, &WatchOptions::default(), agent) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{}", redirect_program::errors::chain(&e));
            1
        }
    }
}

/// [`install::run`] with the agent told what the installer does, and stopped first. A clean
/// stop takes the agent's status file away with it; a failure leaves it saying why, so that
/// the plugin's STATUS answers "not ready" while the DaemonSet's pod restarts.
pub fn run(
    settings: Settings,
    stop: &StopHandle,
    opts: &WatchOptions,
    agent: Agent,
) -> crate::Result<()> {
    let run_dir = settings.cni_agent_run_dir.clone();
    let known = agent.known_pods();
    let with_agent = WithAgent(RefCell::new(Some(agent)), settings.clone(), known);
    let result = install::run(settings, stop, opts, &with_agent);
    drop(with_agent);
    if let Err(e) = &result {
        crate::agent::write_readiness(
            &run_dir.join(cni_protocol::events::READY_NAME),
            &Readiness::NotReady(format!(
                "the node agent exited: {}",
                redirect_program::errors::chain(e)
            )),
        );
    }
    result
}

/// The installer's progress, told to the agent (stopped when the uninstall begins), and the
/// pods its watch last listed (for the hand-back at an uninstall).
struct WithAgent(RefCell<Option<Agent>>, Settings, Option<KnownPods>);

impl install::Progress for WithAgent {
    fn ready(&self, verdict: &Readiness) {
        if let Some(a) = self.0.borrow().as_ref() {
            a.set_ready(verdict);
        }
    }

    fn installed(&self, result: Install) {
        if let Some(a) = self.0.borrow().as_ref() {
            a.metrics().installed(result);
        }
    }

    fn stopping(&self) {
        if let Some(a) = self.0.borrow_mut().take() {
            a.stop();
        }
    }

    fn keep_installed(&self) -> Option<String> {
        if !self.1.safe_upgrade {
            return None;
        }
        match crate::upgrade::decide(&self.1) {
            Stop::Keep(why) => Some(why),
            Stop::Remove(why) => {
                tracing::info!("not an upgrade: {why}");
                if let Some(form) = self.1.hand_back_on_uninstall {
                    hand_back_at_uninstall(&self.1, form, self.2.as_ref());
                }
                None
            }
        }
    }
}

/// `HAND_BACK_ON_UNINSTALL`: the node's pods handed back before our entry goes. A failure is
/// logged (each pod named); the uninstall goes on, and the pods not handed back keep our
/// table until they are recreated.
fn hand_back_at_uninstall(
    settings: &Settings,
    form: crate::adopted_forms::HandBackForm,
    known: Option<&KnownPods>,
) {
    match crate::hand_back::run(settings, form, known) {
        Ok(s) if s.failed == 0 => {}
        Ok(s) => tracing::warn!(
            "{} pods were not handed back (named above): they keep our table until recreated",
            s.failed
        ),
        Err(e) => tracing::warn!(
            "the hand-back at uninstall did not run: {}; the pods keep our table until recreated",
            redirect_program::errors::chain(&e)
        ),
    }
}

fn log_start(settings: &Settings) {
    tracing::info!(
        "redirect-cni-node {}: {} mode, net dir {} (host {}), bin dirs {}, run dir {}",
        env!("CARGO_PKG_VERSION"),
        if settings.chained {
            "chained"
        } else {
            "standalone"
        },
        settings.mounted_cni_net_dir.display(),
        settings.cni_net_dir.display(),
        settings
            .cni_bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(","),
        settings.cni_agent_run_dir.display()
    );
}
