//! The driver's `timeoutMS` API, in one place. The fork has it (stage 1, `docs/timeouts.md`);
//! upstream 3.9.1 has none, so in upstream mode every case that sets `timeoutMS` anywhere is
//! skipped with [`UNSUPPORTED`] before anything here would be asked to set it.

use std::time::Duration;

use crate::mongodb::action::gridfs::{
    Delete as GridFsDelete, Drop as GridFsDrop, OpenDownloadStream, OpenDownloadStreamByName,
    Rename as GridFsRename,
};
#[cfg(not(feature = "upstream"))]
use crate::mongodb::action::Action as _;
use crate::mongodb::action::{AbortTransaction, CommitTransaction, RunCommand, StartTransaction};
use crate::mongodb::bson::Document;
use crate::mongodb::error::{Error as DriverError, ErrorKind};
use crate::mongodb::gridfs::GridFsDownloadStream;
use crate::mongodb::options::{
    ClientOptions, CollectionOptions, CreateIndexOptions, DatabaseOptions, GridFsBucketOptions,
    GridFsFindOptions, GridFsUploadOptions, SessionOptions,
};
use crate::mongodb::Cursor;

/// Why `timeoutMS` cannot be honoured by the driver under test, if it cannot.
#[cfg(not(feature = "upstream"))]
pub const UNSUPPORTED: Option<&str> = None;
#[cfg(feature = "upstream")]
pub const UNSUPPORTED: Option<&str> = Some("upstream 3.9.1 has no timeoutMS");

#[cfg(not(feature = "upstream"))]
mod driver {
    use super::*;

    pub fn set_database(
        options: &mut DatabaseOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub fn set_collection(
        options: &mut CollectionOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub fn run_command(
        action: RunCommand<'_>,
        timeout: Duration,
    ) -> Result<RunCommand<'_>, String> {
        Ok(action.timeout(timeout))
    }

    pub fn set_create_index(
        options: &mut CreateIndexOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub fn is_timeout(kind: &ErrorKind) -> bool {
        matches!(kind, ErrorKind::Timeout { .. })
    }

    pub fn client_timeout(options: &ClientOptions) -> Option<Duration> {
        options.timeout
    }

    pub async fn close_cursor(
        cursor: Cursor<Document>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        let close = cursor.close();
        Ok(match timeout {
            Some(timeout) => close.timeout(timeout).await,
            None => close.await,
        })
    }

    pub fn set_session(
        options: &mut SessionOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.default_timeout = timeout;
        Ok(())
    }

    pub async fn commit_transaction(
        action: CommitTransaction<'_>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        Ok(match timeout {
            Some(timeout) => action.timeout(timeout).await,
            None => action.await,
        })
    }

    pub async fn abort_transaction(
        action: AbortTransaction<'_>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        Ok(match timeout {
            Some(timeout) => action.timeout(timeout).await,
            None => action.await,
        })
    }

    pub fn start_transaction<S>(
        action: StartTransaction<S>,
        timeout: Option<Duration>,
    ) -> Result<StartTransaction<S>, String> {
        Ok(match timeout {
            Some(timeout) => action.timeout(timeout),
            None => action,
        })
    }

    pub fn set_bucket(
        options: &mut GridFsBucketOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub fn set_upload(
        options: &mut GridFsUploadOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub fn set_gridfs_find(
        options: &mut GridFsFindOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        options.timeout = timeout;
        Ok(())
    }

    pub async fn download(
        action: OpenDownloadStream<'_>,
        timeout: Option<Duration>,
    ) -> Result<GridFsDownloadStream, DriverError> {
        action.optional(timeout, |a, t| a.timeout(t)).await
    }

    pub async fn download_by_name(
        action: OpenDownloadStreamByName<'_>,
        timeout: Option<Duration>,
    ) -> Result<GridFsDownloadStream, DriverError> {
        action.optional(timeout, |a, t| a.timeout(t)).await
    }

    pub async fn gridfs_delete(
        action: GridFsDelete<'_>,
        timeout: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.optional(timeout, |a, t| a.timeout(t)).await
    }

    pub async fn gridfs_rename(
        action: GridFsRename<'_>,
        timeout: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.optional(timeout, |a, t| a.timeout(t)).await
    }

    pub async fn gridfs_drop(
        action: GridFsDrop<'_>,
        timeout: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.optional(timeout, |a, t| a.timeout(t)).await
    }
}

/// Upstream: nothing can be set. Reaching a setter with a value is a runner bug (the case
/// should have been skipped), reported as an error rather than dropping the value.
#[cfg(feature = "upstream")]
mod driver {
    use super::*;

    fn refuse() -> String {
        format!("timeoutMS: {}", UNSUPPORTED.unwrap_or_default())
    }

    pub fn set_database(_: &mut DatabaseOptions, timeout: Option<Duration>) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub fn set_collection(
        _: &mut CollectionOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub fn run_command(_: RunCommand<'_>, _: Duration) -> Result<RunCommand<'_>, String> {
        Err(refuse())
    }

    pub fn set_create_index(
        _: &mut CreateIndexOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub fn is_timeout(_: &ErrorKind) -> bool {
        false
    }

    pub fn client_timeout(_: &ClientOptions) -> Option<Duration> {
        None
    }

    pub fn set_session(_: &mut SessionOptions, timeout: Option<Duration>) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub async fn commit_transaction(
        action: CommitTransaction<'_>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        match timeout {
            Some(_) => Err(refuse()),
            None => Ok(action.await),
        }
    }

    pub async fn abort_transaction(
        action: AbortTransaction<'_>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        match timeout {
            Some(_) => Err(refuse()),
            None => Ok(action.await),
        }
    }

    pub fn start_transaction<S>(
        action: StartTransaction<S>,
        timeout: Option<Duration>,
    ) -> Result<StartTransaction<S>, String> {
        timeout.map_or(Ok(action), |_| Err(refuse()))
    }

    /// Upstream has no close: the cursor's drop kills it in the background.
    pub async fn close_cursor(
        cursor: Cursor<Document>,
        timeout: Option<Duration>,
    ) -> Result<Result<(), DriverError>, String> {
        match timeout {
            Some(_) => Err(refuse()),
            None => {
                drop(cursor);
                Ok(Ok(()))
            }
        }
    }

    pub fn set_bucket(
        _: &mut GridFsBucketOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub fn set_upload(
        _: &mut GridFsUploadOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    pub fn set_gridfs_find(
        _: &mut GridFsFindOptions,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        timeout.map_or(Ok(()), |_| Err(refuse()))
    }

    /// Upstream: a case with timeoutMS was skipped before it ran, so `timeout` is `None` here.
    pub async fn download(
        action: OpenDownloadStream<'_>,
        _: Option<Duration>,
    ) -> Result<GridFsDownloadStream, DriverError> {
        action.await
    }

    pub async fn download_by_name(
        action: OpenDownloadStreamByName<'_>,
        _: Option<Duration>,
    ) -> Result<GridFsDownloadStream, DriverError> {
        action.await
    }

    pub async fn gridfs_delete(
        action: GridFsDelete<'_>,
        _: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.await
    }

    pub async fn gridfs_rename(
        action: GridFsRename<'_>,
        _: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.await
    }

    pub async fn gridfs_drop(
        action: GridFsDrop<'_>,
        _: Option<Duration>,
    ) -> Result<(), DriverError> {
        action.await
    }
}

/// The client's `timeoutMS` as parsed from a connection string.
pub use driver::client_timeout;
/// Closes a cursor, with the close's own `timeoutMS` if given (`Cursor::close`).
pub use driver::close_cursor;
/// Whether an error kind is the driver's `timeoutMS` expiry (`ErrorKind::Timeout`).
pub use driver::is_timeout;
/// Gives a `runCommand` its per-call `timeoutMS` (`RunCommandOptions` cannot be deserialized).
pub use driver::run_command;
/// Sets a collection's own `timeoutMS`.
pub use driver::set_collection;
/// Sets a `createIndex`'s per-call `timeoutMS` (`CreateIndexOptions` cannot be deserialized).
pub use driver::set_create_index;
/// Sets a database's own `timeoutMS`.
pub use driver::set_database;
/// Sets a session's `defaultTimeoutMS`.
pub use driver::set_session;
/// Gives a convenient transaction (`withTransaction`) its own `timeoutMS`.
pub use driver::start_transaction;
/// Commits or aborts a transaction, with the call's own `timeoutMS` if given.
pub use driver::{abort_transaction, commit_transaction};
/// GridFS: a bucket's, an upload's and a find's `timeoutMS`, and the per-call `.timeout()` of
/// the other bucket actions.
pub use driver::{
    download, download_by_name, gridfs_delete, gridfs_drop, gridfs_rename, set_bucket,
    set_gridfs_find, set_upload,
};
