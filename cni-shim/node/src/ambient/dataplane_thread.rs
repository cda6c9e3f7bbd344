//! The data plane's own thread: the [`Dataplane`] blocks (netlink, `setns`, ZDS's sockets), so
//! it lives on one OS thread made for it, and the controller holds a [`DataplaneThread`], a
//! handle whose [`call`](DataplaneThread::call) sends the work there and awaits its answer.
//! Calls are served one at a time, in the order sent; no lock is shared, and no runtime
//! thread blocks on the data plane.

use std::sync::mpsc;

use tokio::sync::oneshot;

use super::dataplane::Dataplane;

/// One call: the work, which sends its own answer.
type Call<D> = Box<dyn FnOnce(&mut D) + Send>;

/// The handle of the thread that owns the data plane (`D` is the [`Dataplane`] but in tests).
/// Dropped, the thread serves the calls already sent, drops the data plane and ends.
pub struct DataplaneThread<D = Dataplane> {
    calls: mpsc::Sender<Call<D>>,
    /// Closed when the thread has dropped the data plane (and ended).
    ended: oneshot::Receiver<()>,
}

impl<D: Send + 'static> DataplaneThread<D> {
    /// Moves `dataplane` onto a thread of its own (named `name`) that serves the calls.
    pub fn start(name: &str, dataplane: D) -> std::io::Result<DataplaneThread<D>> {
        let (calls, queue) = mpsc::channel::<Call<D>>();
        let (ended_tx, ended) = oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || serve(dataplane, queue, ended_tx))?;
        Ok(DataplaneThread { calls, ended })
    }

    /// Runs `f` on the data plane, on its thread, after the calls sent before it.
    ///
    /// A panic in `f` is a bug, not a state to carry on from: the shipped build aborts on it
    /// (`panic = "abort"`), and elsewhere the caller panics too (its answer's sender dropped
    /// as the thread unwinds; the thread's own panic is reported as any thread's is), as the
    /// controller did when the data plane ran in `spawn_blocking` and it `expect`ed the join:
    /// the thread has ended with the data plane perhaps half-changed, so no later call may
    /// use it, and the controller must not wait for an answer that will not come.
    pub async fn call<T: Send + 'static>(&self, f: impl FnOnce(&mut D) -> T + Send + 'static) -> T {
        let (answer, answered) = oneshot::channel();
        let call: Call<D> = Box::new(move |dp| {
            // The caller may be gone (its task dropped): the work is done all the same.
            let _ = answer.send(f(dp));
        });
        self.calls
            .send(call)
            .expect("the data plane's thread does not panic");
        answered
            .await
            .expect("the data plane's thread does not panic")
    }

    /// Ends the thread after the calls sent, and waits until it has dropped the data plane
    /// (its ZDS socket removed, as when the data plane was the controller's own).
    pub async fn close(self) {
        let DataplaneThread { calls, ended } = self;
        drop(calls);
        // Closed without a value, whether the thread ended or panicked: either way it is gone.
        let _ = ended.await;
    }
}

/// The thread's loop: each call in turn until every handle is dropped.
fn serve<D>(dataplane: D, queue: mpsc::Receiver<Call<D>>, ended: oneshot::Sender<()>) {
    // Dropped in the reverse order: the data plane first, then `ended` says it is gone (also
    // when a call panics and unwinds).
    let _ended = ended;
    let mut dataplane = dataplane;
    while let Ok(call) = queue.recv() {
        call(&mut dataplane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::{self, ThreadId};

    /// What the tests' stand-in for the data plane records: the thread of each call, in order.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<(u32, ThreadId)>,
    }

    #[tokio::test]
    async fn calls_are_served_in_order_on_one_thread_that_is_not_the_callers() {
        let dp = DataplaneThread::start("test-dataplane", Recorder::default()).unwrap();
        for n in 0..5 {
            let name = dp
                .call(move |r: &mut Recorder| {
                    r.calls.push((n, thread::current().id()));
                    thread::current().name().map(str::to_owned)
                })
                .await;
            assert_eq!(name.as_deref(), Some("test-dataplane"));
        }
        let calls = dp.call(|r| std::mem::take(&mut r.calls)).await;
        assert_eq!(
            calls.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        let first = calls[0].1;
        assert!(calls.iter().all(|(_, t)| *t == first), "{calls:?}");
        assert_ne!(first, thread::current().id());
    }

    #[tokio::test]
    async fn calls_sent_together_are_served_one_at_a_time_in_the_order_sent() {
        let dp = DataplaneThread::start("test-dataplane", Vec::<u32>::new()).unwrap();
        // Sent before any is awaited: the thread takes them as they were queued.
        let calls = (0..20u32).map(|n| {
            dp.call(move |v: &mut Vec<u32>| {
                v.push(n);
                v.len()
            })
        });
        let lens = futures_util::future::join_all(calls).await;
        assert_eq!(lens, (1..=20).collect::<Vec<usize>>());
        assert_eq!(dp.call(|v| v.clone()).await, (0..20).collect::<Vec<_>>());
    }

    /// Tells what happens to it, and on which thread: the data plane's end seen from outside.
    struct Told(std::sync::mpsc::Sender<(&'static str, ThreadId)>);

    impl Told {
        fn tell(&self, what: &'static str) {
            let _ = self.0.send((what, thread::current().id()));
        }
    }

    impl Drop for Told {
        fn drop(&mut self) {
            self.tell("dropped");
        }
    }

    #[tokio::test]
    async fn a_dropped_handle_ends_the_thread_after_the_calls_sent() {
        use futures_util::FutureExt;
        let (tx, told) = std::sync::mpsc::channel();
        let dp = DataplaneThread::start("test-dataplane", Told(tx)).unwrap();
        let on = dp.call(|_: &mut Told| thread::current().id()).await;
        // Sent (polled once), its caller gone at once, and the handle dropped behind it.
        let sent = dp.call(|t: &mut Told| {
            thread::sleep(std::time::Duration::from_millis(50));
            t.tell("served");
        });
        assert!(sent.now_or_never().is_none());
        drop(dp);
        let wait = std::time::Duration::from_secs(10);
        assert_eq!(told.recv_timeout(wait).unwrap(), ("served", on));
        // The loop is over: the data plane dropped on its thread, and nothing after it.
        assert_eq!(told.recv_timeout(wait).unwrap(), ("dropped", on));
        assert!(
            told.recv_timeout(wait).is_err(),
            "the sender is gone with it"
        );
    }

    #[tokio::test]
    async fn close_returns_once_the_data_plane_is_dropped() {
        let (tx, told) = std::sync::mpsc::channel();
        let dp = DataplaneThread::start("test-dataplane", Told(tx)).unwrap();
        dp.call(|t: &mut Told| t.tell("served")).await;
        tokio::time::timeout(std::time::Duration::from_secs(10), dp.close())
            .await
            .expect("the thread ends once its handle is closed");
        let seen: Vec<_> = told.try_iter().map(|(what, _)| what).collect();
        assert_eq!(seen, ["served", "dropped"]);
    }

    #[tokio::test]
    async fn a_panic_in_a_call_is_the_callers_not_a_hang() {
        let dp = DataplaneThread::start("test-dataplane", ()).unwrap();
        let caller = tokio::spawn(async move {
            dp.call::<()>(|_: &mut ()| panic!("a bug in the data plane"))
                .await
        });
        let joined = tokio::time::timeout(std::time::Duration::from_secs(10), caller)
            .await
            .expect("the caller does not wait for an answer that will not come");
        assert!(joined.unwrap_err().is_panic());
    }
}
