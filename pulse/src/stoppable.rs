//! A named background thread that runs until told to stop, and is stopped and joined
//! when dropped: the shape of the ingest and retrain threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

pub(crate) struct StoppableThread {
    name: &'static str,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StoppableThread {
    /// Spawns `run`, which should return soon after its flag turns true.
    pub(crate) fn spawn(
        name: &'static str,
        run: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(&flag))
            .expect("spawning a thread");
        StoppableThread {
            name,
            stop,
            thread: Some(thread),
        }
    }

    /// Raises the flag and waits for the thread.
    pub(crate) fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(thread = self.name, "thread panicked");
            }
        }
    }
}

impl Drop for StoppableThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}
