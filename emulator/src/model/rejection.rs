//! [`Rejection`]: why the model refused or abandoned a request, and its error reply.

use std::time::Duration;

use bson::{doc, Bson, Document};

/// The overload label mongod puts on 462 and 433.
pub const SYSTEM_OVERLOADED: &str = "SystemOverloadedError";
/// The label that tells a driver an overload error may be retried.
pub const RETRYABLE: &str = "RetryableError";

/// What stopped a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// 462 IngressRequestRateLimitExceeded: no token and no room in the ingress queue.
    RateLimited,
    /// 433 AdmissionQueueOverflow: the ticket waiter queue was full.
    QueueOverflow,
    /// A transient overload error drawn at random (`randomRejectShare`): the 462 reply with
    /// both overload labels, whatever `limiter.allowRetries` says.
    Random,
    /// 50 MaxTimeMSExpired: the deadline passed while waiting or working.
    MaxTimeExpired,
    /// 279 ClientDisconnect: the client went away and `killOnClientDisconnect` is on.
    ClientDisconnected,
}

/// A request the model did not run to the end. Render it with [`Rejection::to_document`], or
/// take the parts ([`Rejection::code`], [`Rejection::labels`], ...) into the server's own error
/// type; the labels are final (do not recompute them from the code).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{errmsg} ({code_name}, code {code})")]
pub struct Rejection {
    /// Why.
    pub kind: RejectionKind,
    /// mongod's error code.
    pub code: i32,
    /// mongod's code name.
    pub code_name: &'static str,
    /// mongod's message.
    pub errmsg: String,
    /// `errorLabels`, in order.
    pub labels: Vec<&'static str>,
    /// `baseBackoffMS`, on overload rejections when configured.
    pub base_backoff_ms: Option<i64>,
    /// Core time the request had used before it was stopped (wasted work).
    pub work: Duration,
}

impl Rejection {
    pub(crate) fn rate_limited(allow_retries: bool, base_backoff_ms: u64) -> Rejection {
        let mut labels = vec![SYSTEM_OVERLOADED];
        if allow_retries {
            labels.push(RETRYABLE);
        }
        Rejection {
            kind: RejectionKind::RateLimited,
            code: 462,
            code_name: "IngressRequestRateLimitExceeded",
            errmsg: "Rate limiter 'ingressRequestRateLimiter' rate exceeded".to_string(),
            labels,
            base_backoff_ms: backoff(base_backoff_ms),
            work: Duration::ZERO,
        }
    }

    /// A random rejection (`randomRejectShare`): mongod's 462 reply shape, always labelled
    /// `SystemOverloadedError` and `RetryableError`, so a driver cannot tell it from an ingress
    /// limiter rejection with retries allowed (what a transient overload looks like to it).
    pub(crate) fn random(base_backoff_ms: u64) -> Rejection {
        Rejection {
            kind: RejectionKind::Random,
            ..Rejection::rate_limited(true, base_backoff_ms)
        }
    }

    pub(crate) fn queue_overflow(base_backoff_ms: u64) -> Rejection {
        Rejection {
            kind: RejectionKind::QueueOverflow,
            code: 433,
            code_name: "AdmissionQueueOverflow",
            errmsg: "MongoDB is overloaded and cannot accept new operations. Try again later."
                .to_string(),
            labels: vec![SYSTEM_OVERLOADED, RETRYABLE],
            base_backoff_ms: backoff(base_backoff_ms),
            work: Duration::ZERO,
        }
    }

    pub(crate) fn expired(work: Duration) -> Rejection {
        Rejection {
            kind: RejectionKind::MaxTimeExpired,
            code: 50,
            code_name: "MaxTimeMSExpired",
            errmsg: "operation exceeded time limit".to_string(),
            labels: Vec::new(),
            base_backoff_ms: None,
            work,
        }
    }

    pub(crate) fn disconnected(work: Duration) -> Rejection {
        Rejection {
            kind: RejectionKind::ClientDisconnected,
            code: 279,
            code_name: "ClientDisconnect",
            errmsg: "operation was interrupted because a client disconnected".to_string(),
            labels: Vec::new(),
            base_backoff_ms: None,
            work,
        }
    }

    /// mongod's error code.
    pub fn code(&self) -> i32 {
        self.code
    }

    /// The labels as owned strings (the shape the server's error type keeps).
    pub fn labels(&self) -> Vec<String> {
        self.labels.iter().map(|l| l.to_string()).collect()
    }

    /// The labels the server must use as they are (`Some` for 462, 433 and random rejections, whose labels do not
    /// follow from the code alone), or `None` when the server's usual label rules apply (50 and
    /// 279, e.g. `TransientTransactionError` inside a transaction).
    pub fn fixed_labels(&self) -> Option<Vec<String>> {
        match self.kind {
            RejectionKind::RateLimited | RejectionKind::QueueOverflow | RejectionKind::Random => {
                Some(self.labels())
            }
            RejectionKind::MaxTimeExpired | RejectionKind::ClientDisconnected => None,
        }
    }

    /// The error reply: `{ok: 0.0, errmsg, code, codeName, errorLabels, baseBackoffMS}`;
    /// `errorLabels` is omitted when empty and `baseBackoffMS` (an Int64) when not configured.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": self.errmsg.clone(),
            "code": self.code,
            "codeName": self.code_name,
        };
        if !self.labels.is_empty() {
            d.insert(
                "errorLabels",
                Bson::Array(self.labels.iter().map(|l| Bson::from(*l)).collect()),
            );
        }
        if let Some(ms) = self.base_backoff_ms {
            d.insert("baseBackoffMS", ms);
        }
        d
    }
}

impl From<Rejection> for Document {
    fn from(r: Rejection) -> Document {
        r.to_document()
    }
}

fn backoff(ms: u64) -> Option<i64> {
    (ms > 0).then(|| i64::try_from(ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingress_rejection_document() {
        let d = Rejection::rate_limited(true, 0).to_document();
        assert_eq!(
            d,
            doc! {
                "ok": 0.0,
                "errmsg": "Rate limiter 'ingressRequestRateLimiter' rate exceeded",
                "code": 462,
                "codeName": "IngressRequestRateLimitExceeded",
                "errorLabels": ["SystemOverloadedError", "RetryableError"],
            }
        );
        let d = Rejection::rate_limited(false, 250).to_document();
        assert_eq!(
            d.get_array("errorLabels").unwrap(),
            &vec![Bson::from("SystemOverloadedError")]
        );
        assert_eq!(d.get("baseBackoffMS"), Some(&Bson::Int64(250)));
    }

    #[test]
    fn random_rejection_is_a_retryable_462() {
        let r = Rejection::random(0);
        assert_eq!(r.kind, RejectionKind::Random);
        assert_eq!(
            r.to_document(),
            Rejection::rate_limited(true, 0).to_document()
        );
        assert_eq!(
            r.fixed_labels(),
            Some(vec![SYSTEM_OVERLOADED.to_string(), RETRYABLE.to_string()])
        );
        let d = Rejection::random(40).to_document();
        assert_eq!(d.get("baseBackoffMS"), Some(&Bson::Int64(40)));
    }

    #[test]
    fn shed_and_expired_documents() {
        let d = Rejection::queue_overflow(100).to_document();
        let keys: Vec<&str> = d.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "ok",
                "errmsg",
                "code",
                "codeName",
                "errorLabels",
                "baseBackoffMS"
            ]
        );
        assert_eq!(d.get_i32("code").unwrap(), 433);
        assert_eq!(d.get_str("codeName").unwrap(), "AdmissionQueueOverflow");
        let d = Rejection::expired(Duration::from_millis(3)).to_document();
        assert_eq!(
            d,
            doc! {
                "ok": 0.0,
                "errmsg": "operation exceeded time limit",
                "code": 50,
                "codeName": "MaxTimeMSExpired",
            }
        );
    }
}
