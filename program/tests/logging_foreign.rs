//! `logging::install` in a process that already has a subscriber (a test harness's, or an
//! embedding program's): it must neither panic nor take the events. A process of its own,
//! since the global subscriber is set once per process.

use std::sync::atomic::{AtomicUsize, Ordering};

use redirect_program::logging::{install, Sink};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static SEEN: AtomicUsize = AtomicUsize::new(0);

struct Count;

impl<S: Subscriber> Layer<S> for Count {
    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        SEEN.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_subscriber_set_first_keeps_the_events() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Count)).unwrap();
    assert!(!install(Sink::stderr(
        Some("redirect-cni"),
        LevelFilter::INFO
    )));
    // A second call (the plugin's, once its config is read) is as harmless.
    assert!(!install(Sink::stderr(None, LevelFilter::DEBUG)));
    tracing::info!("to the first subscriber");
    assert_eq!(SEEN.load(Ordering::SeqCst), 1);
}
