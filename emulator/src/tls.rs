//! The TLS persona: a TLS front for an emulator member, with a certificate authority and server
//! certificates generated at start, so tests can connect with `tls=true&tlsCAFile=<file>` and
//! provoke certificate validation failures without any key material in the repository.
//!
//! [`TlsFront`] listens on its own loopback port, completes the TLS handshake, and relays the
//! plaintext to the member it fronts. Two identities are made for the same host names: one
//! signed by the CA the front hands out ([`TlsFront::ca_pem`]), one signed by a CA nobody
//! trusts. [`TlsFront::serve_untrusted`] switches new connections to the second; established
//! connections keep their session. That is how a test lets a driver's monitor connect and then
//! makes its next pool connection fail validation.
//!
//! A front suits the standalone persona (a driver talks to the seed address it was given); for
//! a replica set the members would advertise their own plaintext ports.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

fn other(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("cannot set up the TLS persona: {error}"))
}

struct Authority {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> io::Result<Self> {
        let key = KeyPair::generate().map_err(other)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        let certificate = params.self_signed(&key).map_err(other)?;
        Ok(Self { certificate, key })
    }

    /// A server certificate for `hosts` (names or IP addresses) and the acceptor serving it.
    fn acceptor(&self, hosts: &[String]) -> io::Result<TlsAcceptor> {
        let key = KeyPair::generate().map_err(other)?;
        let params = CertificateParams::new(hosts.to_vec()).map_err(other)?;
        let leaf = params
            .signed_by(&key, &self.certificate, &self.key)
            .map_err(other)?;
        let chain = vec![
            CertificateDer::from(leaf.der().to_vec()),
            CertificateDer::from(self.certificate.der().to_vec()),
        ];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(other)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(other)?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// A TLS listener in front of one emulator member.
pub struct TlsFront {
    address: SocketAddr,
    ca_pem: String,
    serve_untrusted: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Starts a front on an ephemeral loopback port relaying to `backend`, with certificates
    /// valid for `localhost` and `127.0.0.1`.
    ///
    /// # Errors
    ///
    /// When key generation, certificate signing or binding the port fails.
    pub async fn start(backend: SocketAddr) -> io::Result<Self> {
        let hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let trusted_ca = Authority::new("mongodb-overload lab CA")?;
        let untrusted_ca = Authority::new("untrusted lab CA")?;
        let trusted = trusted_ca.acceptor(&hosts)?;
        let untrusted = untrusted_ca.acceptor(&hosts)?;
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let serve_untrusted = Arc::new(AtomicBool::new(false));
        let switch = serve_untrusted.clone();
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "TLS front: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let acceptor = if switch.load(Ordering::SeqCst) {
                    untrusted.clone()
                } else {
                    trusted.clone()
                };
                tokio::spawn(async move {
                    if let Err(error) = relay(acceptor, stream, backend).await {
                        tracing::debug!(%peer, %error, "TLS front connection ended");
                    }
                });
            }
        });
        Ok(Self {
            address,
            ca_pem: trusted_ca.certificate.pem(),
            serve_untrusted,
            task,
        })
    }

    /// The front's address (`127.0.0.1:<port>`), to put in a connection string.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The PEM of the CA that signed the trusted identity, for a client's `tlsCAFile`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// From now on, new connections get (or no longer get) the certificate nobody trusts.
    pub fn serve_untrusted(&self, on: bool) {
        self.serve_untrusted.store(on, Ordering::SeqCst);
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Completes the handshake (bounded by a deadline) and copies bytes both ways until either side
/// closes.
async fn relay(acceptor: TlsAcceptor, stream: TcpStream, backend: SocketAddr) -> io::Result<()> {
    let mut tls = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    let mut plain = TcpStream::connect(backend).await?;
    plain.set_nodelay(true)?;
    tokio::io::copy_bidirectional(&mut tls, &mut plain).await?;
    Ok(())
}
