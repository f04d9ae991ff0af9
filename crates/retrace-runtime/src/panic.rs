//! A tool function that panics: the panic is recorded as the step's failure, a message that
//! starts with [`PANICKED`], and then resumes, so the program goes on as it would have without
//! Retrace (a task's `JoinHandle` catches it, or the thread ends). Where the function doesn't run
//! (replay, a step a fork serves from its source), that failure panics again with the same
//! message, so the program takes the same path.
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use parking_lot::Mutex;

use crate::error::{RuntimeError, RuntimeResult};

/// How a recorded failure says the function panicked: `panicked: <the panic's message>`.
pub(crate) const PANICKED: &str = "panicked: ";

/// The payload of a panic caught while a step's function ran, resumed once the step is stored.
#[derive(Default)]
pub(crate) struct Caught(Mutex<Option<Box<dyn Any + Send>>>);

impl Caught {
    /// Runs `future`; a panic in it becomes `Err(the failure to record)`, its payload kept.
    pub(crate) async fn catch<T>(&self, future: impl Future<Output = T>) -> Result<T, String> {
        match AssertUnwindSafe(future).catch_unwind().await {
            Ok(value) => Ok(value),
            Err(payload) => {
                let message = format!("{PANICKED}{}", message(payload.as_ref()));
                *self.0.lock() = Some(payload);
                Err(message)
            }
        }
    }

    /// The step's result; the panic caught while it ran goes on now that it is stored, and a
    /// recorded panic (replay) panics again with its message.
    pub(crate) fn resume<T>(&self, result: RuntimeResult<T>) -> RuntimeResult<T> {
        if let Some(payload) = self.0.lock().take() {
            std::panic::resume_unwind(payload);
        }
        if let Err(RuntimeError::StepFailed { message, .. }) = &result {
            if let Some(said) = message.strip_prefix(PANICKED) {
                std::panic::panic_any(said.to_owned());
            }
        }
        result
    }
}

/// A panic's message: its `&str` or `String` payload, as the default hook prints it.
fn message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "Box<dyn Any>".to_owned(),
    }
}
