//! The error labels through which servers and the driver signal overload, and the decisions
//! taken from them.
//!
//! A server that sheds load answers with an error labelled `SystemOverloadedError`; when the
//! command is safe to send again it adds `RetryableError`. The Client Backpressure
//! specification retries every command on an error carrying both labels, and backs off after
//! any error carrying the first. The predicates here take the labels as plain strings, so the
//! driver can feed them the labels of a whole error chain.
//!
//! ```
//! use overload::labels::{is_retryable_overload, Overload};
//!
//! let labels = ["RetryableError", "SystemOverloadedError"];
//! assert!(is_retryable_overload(labels));
//! assert_eq!(Overload::of(["SystemOverloadedError"]), Overload::NotRetryable);
//! ```

/// The label of an error a server returned because it is overloaded.
pub const SYSTEM_OVERLOADED_ERROR: &str = "SystemOverloadedError";

/// The label saying the failed command may be sent again whatever kind of command it is.
pub const RETRYABLE_ERROR: &str = "RetryableError";

/// The label saying a failed write may be sent again under the retryable-writes rules.
pub const RETRYABLE_WRITE_ERROR: &str = "RetryableWriteError";

/// What an error's labels say about server overload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Overload {
    /// No `SystemOverloadedError`: the ordinary retry rules alone apply.
    #[default]
    None,
    /// `SystemOverloadedError` without `RetryableError`: a retry, if the ordinary rules allow
    /// one, backs off and is counted against `maxAdaptiveRetries`, but the overload rules do not
    /// make the command retryable.
    NotRetryable,
    /// Both labels: every command may be retried, with backoff, up to `maxAdaptiveRetries`.
    Retryable,
}

impl Overload {
    /// Classifies an error by its labels. Order and duplicates do not matter; the iterator is
    /// read to its end, so it must be finite (an error's label set always is).
    pub fn of<'a>(labels: impl IntoIterator<Item = &'a str>) -> Self {
        let (mut overloaded, mut retryable) = (false, false);
        for label in labels {
            overloaded |= label == SYSTEM_OVERLOADED_ERROR;
            retryable |= label == RETRYABLE_ERROR;
        }
        match (overloaded, retryable) {
            (false, _) => Self::None,
            (true, false) => Self::NotRetryable,
            (true, true) => Self::Retryable,
        }
    }

    /// The server said it is overloaded (`SystemOverloadedError`).
    pub fn is_overload(self) -> bool {
        self != Self::None
    }

    /// The server said it is overloaded and the command may be sent again (both labels).
    pub fn is_retryable(self) -> bool {
        self == Self::Retryable
    }
}

/// Whether labels include `SystemOverloadedError`.
pub fn is_overload<'a>(labels: impl IntoIterator<Item = &'a str>) -> bool {
    Overload::of(labels).is_overload()
}

/// Whether labels include both `SystemOverloadedError` and `RetryableError`.
pub fn is_retryable_overload<'a>(labels: impl IntoIterator<Item = &'a str>) -> bool {
    Overload::of(labels).is_retryable()
}

/// The labels that make a failed command eligible to be sent again.
///
/// An error that becomes the cause of another operation's error must lose these labels when
/// that other operation may not be repeated: retry decisions look at a whole error chain, so
/// the cause's labels would otherwise make the outer operation look retryable.
pub const RESEND_LABELS: [&str; 3] = [
    RETRYABLE_ERROR,
    RETRYABLE_WRITE_ERROR,
    SYSTEM_OVERLOADED_ERROR,
];

/// Whether `label` is one of [`RESEND_LABELS`].
pub fn permits_resend(label: &str) -> bool {
    RESEND_LABELS.contains(&label)
}

/// How a TLS handshake failed, as far as overload labelling cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// The connection was reset, timed out or closed: what a server shedding connections does.
    Io,
    /// The TLS library rejected the peer (certificate, hostname, protocol): permanent.
    Protocol,
}

impl TlsFailure {
    /// Whether the failure gets the labels of a connection-establishment network error
    /// (`SystemOverloadedError`, `RetryableError`): no pool clear, a retry after backoff.
    ///
    /// The CMAP specification says non-I/O TLS errors must not be labelled: retrying a server
    /// whose certificate does not validate only repeats the failure, and unlabelled, the
    /// server is marked Unknown.
    pub fn gets_backpressure_labels(self) -> bool {
        self == Self::Io
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn classification_needs_the_overload_label() {
        assert_eq!(Overload::of([]), Overload::None);
        assert_eq!(Overload::of([RETRYABLE_ERROR]), Overload::None);
        assert_eq!(
            Overload::of([RETRYABLE_WRITE_ERROR, SYSTEM_OVERLOADED_ERROR]),
            Overload::NotRetryable
        );
        assert_eq!(
            Overload::of([
                SYSTEM_OVERLOADED_ERROR,
                "TransientTransactionError",
                RETRYABLE_ERROR
            ]),
            Overload::Retryable
        );
    }

    #[test]
    fn labels_compare_exactly() {
        // Labels are case-sensitive identifiers; a near miss is a different label.
        assert_eq!(
            Overload::of(["systemoverloadederror", "RetryableError "]),
            Overload::None
        );
        assert!(!is_retryable_overload([
            SYSTEM_OVERLOADED_ERROR,
            "Retryable"
        ]));
    }

    #[test]
    fn only_io_tls_failures_look_like_overload() {
        assert!(TlsFailure::Io.gets_backpressure_labels());
        assert!(!TlsFailure::Protocol.gets_backpressure_labels());
    }

    #[test]
    fn resend_labels_are_exactly_the_three() {
        for label in [
            RETRYABLE_ERROR,
            RETRYABLE_WRITE_ERROR,
            SYSTEM_OVERLOADED_ERROR,
        ] {
            assert!(permits_resend(label), "{label}");
        }
        for label in ["TransientTransactionError", "NoWritesPerformed", ""] {
            assert!(!permits_resend(label), "{label}");
        }
    }

    /// Any mix of the interesting labels and noise.
    fn labels() -> impl Strategy<Value = Vec<String>> {
        let label = prop_oneof![
            Just(SYSTEM_OVERLOADED_ERROR.to_owned()),
            Just(RETRYABLE_ERROR.to_owned()),
            Just(RETRYABLE_WRITE_ERROR.to_owned()),
            proptest::collection::vec(proptest::char::range('A', 'z'), 0..24)
                .prop_map(String::from_iter),
        ];
        proptest::collection::vec(label, 0..8)
    }

    proptest! {
        #[test]
        fn predicates_agree_with_membership(labels in labels()) {
            let has = |wanted: &str| labels.iter().any(|l| l == wanted);
            let iter = || labels.iter().map(String::as_str);
            prop_assert_eq!(is_overload(iter()), has(SYSTEM_OVERLOADED_ERROR));
            prop_assert_eq!(
                is_retryable_overload(iter()),
                has(SYSTEM_OVERLOADED_ERROR) && has(RETRYABLE_ERROR)
            );
            // A retryable overload is always an overload.
            prop_assert!(!Overload::of(iter()).is_retryable() || Overload::of(iter()).is_overload());
        }

        #[test]
        fn order_does_not_matter(mut labels in labels()) {
            let before = Overload::of(labels.iter().map(String::as_str));
            labels.reverse();
            prop_assert_eq!(Overload::of(labels.iter().map(String::as_str)), before);
        }
    }
}
