//! Writing a reply to a client, for the OP_MSG loop (`conn`) and the legacy opcodes (`legacy`)
//! alike.
//!
//! Both write with the same deadline and close the connection for the same reasons. `conn`
//! hands legacy requests to `legacy`, so the write lives here, below both, rather than in
//! `conn` where `legacy` would have to reach back for it.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Longest time a reply may take to be written before the connection is closed.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes one encoded reply. `Err` carries the reason to close the connection: the write
/// failed, or it did not finish within [`WRITE_TIMEOUT`] (a client that stops reading must not
/// hold its connection's task forever).
pub(crate) async fn write_reply<W: AsyncWrite + Unpin>(
    wr: &mut W,
    bytes: &[u8],
) -> Result<(), String> {
    match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("write failed: {e}")),
        Err(_) => Err("write timed out (client not reading)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_reply_the_client_reads_is_written_whole() {
        let (mut server, mut client) = tokio::io::duplex(64);
        write_reply(&mut server, b"reply").await.unwrap();
        let mut got = [0u8; 5];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"reply");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_cut_off_at_the_deadline() {
        // The pipe holds 4 bytes and nobody reads the other end, so the write can never finish.
        let (mut server, _client) = tokio::io::duplex(4);
        let start = tokio::time::Instant::now();
        let reason = write_reply(&mut server, b"more than four bytes")
            .await
            .unwrap_err();
        assert_eq!(reason, "write timed out (client not reading)");
        assert_eq!(start.elapsed(), WRITE_TIMEOUT);
    }

    #[tokio::test]
    async fn a_closed_connection_fails_the_write() {
        let (mut server, client) = tokio::io::duplex(4);
        drop(client);
        let reason = write_reply(&mut server, b"reply").await.unwrap_err();
        assert!(reason.starts_with("write failed: "), "{reason}");
    }
}
