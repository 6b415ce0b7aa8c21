//! [`RetryOrigin`]: who asks for a retry. The retry budget draws every origin's retries from one
//! budget and the statistics count them apart; the type lives below both
//! ([`crate::budget`], [`crate::stats`]), so that the statistics need not import the budget
//! that reports to them.

/// Who asks the budget for a retry: counted and logged separately, drawn from one budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryOrigin {
    /// The driver's retry loop, retrying one attempt of an operation.
    Driver,
    /// An application retry loop, running a failed operation again.
    Application,
}

impl RetryOrigin {
    /// The name in logs and metric labels: `driver` or `application`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Application => "application",
        }
    }
}
