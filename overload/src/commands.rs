//! Which commands continue or end work the server already admitted: the list the controller
//! leaves outside `timeoutMS` and the throttle leaves outside its decisions
//! ([`crate::control`], [`crate::admission`]). It lives below both, so that neither imports
//! the other for it.

/// Commands outside `timeoutMS` and outside the throttle: a cursor's later batches and
/// cleanup, a transaction's outcome, and the end of sessions. They continue or end work the
/// server already admitted; rejecting or cutting one would not spare the server that work, and
/// could strand it (an open cursor, a transaction holding its locks until it times out).
pub const EXEMPT_COMMANDS: [&str; 5] = [
    "getMore",
    "killCursors",
    "commitTransaction",
    "abortTransaction",
    "endSessions",
];

/// Whether the command `name` continues or ends admitted work ([`EXEMPT_COMMANDS`]).
pub fn is_exempt(name: &str) -> bool {
    EXEMPT_COMMANDS.contains(&name)
}
