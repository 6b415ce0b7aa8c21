//! The server side of SCRAM (RFC 5802) with SHA-1 and SHA-256 (RFC 7677), as mongod runs it:
//! stored credentials, the two-message exchange, and mongod's password preparation.
//!
//! Written from the RFCs; the cryptography is RustCrypto's (`sha1`, `sha2`, `hmac`, `pbkdf2`,
//! `md-5`) and SASLprep is the `stringprep` crate's.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use md5::Md5;
use rand::Rng;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// A SCRAM mechanism mongod offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mechanism {
    /// `SCRAM-SHA-1`: the password is first digested as `hex(MD5("<user>:mongo:<password>"))`.
    Sha1,
    /// `SCRAM-SHA-256`: the password is prepared with SASLprep.
    Sha256,
}

impl Mechanism {
    /// Both, in the order mongod lists them.
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha1, Mechanism::Sha256];

    /// The SASL name (`SCRAM-SHA-1`, `SCRAM-SHA-256`).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha1 => "SCRAM-SHA-1",
            Mechanism::Sha256 => "SCRAM-SHA-256",
        }
    }

    /// The mechanism with SASL name `name`, if it is one of these.
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// mongod's default iteration counts: `scramIterationCount` 10,000 and
    /// `scramSHA256IterationCount` 15,000.
    pub fn default_iterations(self) -> u32 {
        match self {
            Mechanism::Sha1 => 10_000,
            Mechanism::Sha256 => 15_000,
        }
    }

    /// The server parameter holding the iteration count for new credentials.
    pub fn iteration_parameter(self) -> &'static str {
        match self {
            Mechanism::Sha1 => "scramIterationCount",
            Mechanism::Sha256 => "scramSHA256IterationCount",
        }
    }

    /// mongod's salt length: the hash length minus the four bytes of PBKDF2's block counter.
    fn salt_len(self) -> usize {
        match self {
            Mechanism::Sha1 => 16,
            Mechanism::Sha256 => 28,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => Sha1::digest(data).to_vec(),
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length, so `new_from_slice` cannot fail here.
        match self {
            Mechanism::Sha1 => match Hmac::<Sha1>::new_from_slice(key) {
                Ok(mut mac) => {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            Mechanism::Sha256 => match Hmac::<Sha256>::new_from_slice(key) {
                Ok(mut mac) => {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    fn salted_password(self, prepared: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => {
                let mut out = [0u8; 20];
                pbkdf2::pbkdf2_hmac::<Sha1>(prepared, salt, iterations, &mut out);
                out.to_vec()
            }
            Mechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(prepared, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }

    /// The bytes PBKDF2 runs over: mongod's MD5 digest for SHA-1, SASLprep for SHA-256.
    fn prepare_password(self, user: &str, password: &str) -> Result<Vec<u8>, String> {
        match self {
            Mechanism::Sha1 => {
                let digest = Md5::digest(format!("{user}:mongo:{password}").as_bytes());
                Ok(digest
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
                    .into_bytes())
            }
            Mechanism::Sha256 => stringprep::saslprep(password)
                .map(|p| p.into_owned().into_bytes())
                .map_err(|e| format!("Error preparing password with SASLprep: {e}")),
        }
    }
}

/// A user's stored SCRAM credential for one mechanism: never the password itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// Random salt.
    pub salt: Vec<u8>,
    /// `H(ClientKey)`: what a client proof is checked against.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`: signs the server's final message.
    pub server_key: Vec<u8>,
}

impl Credential {
    /// Derives a credential for `user` with a fresh random salt.
    pub fn new(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        iterations: u32,
    ) -> Result<Credential, String> {
        let mut salt = vec![0u8; mechanism.salt_len()];
        rand::rng().fill(salt.as_mut_slice());
        Credential::with_salt(mechanism, user, password, salt, iterations)
    }

    /// Derives a credential with a given salt (tests compare against known vectors).
    pub fn with_salt(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        salt: Vec<u8>,
        iterations: u32,
    ) -> Result<Credential, String> {
        let prepared = mechanism.prepare_password(user, password)?;
        let salted = mechanism.salted_password(&prepared, &salt, iterations.max(1));
        let client_key = mechanism.hmac(&salted, b"Client Key");
        Ok(Credential {
            iterations: iterations.max(1),
            salt,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        })
    }

    /// `{iterationCount, salt, storedKey, serverKey}` as `usersInfo` shows it with
    /// `showCredentials` (base64 strings, as mongod stores them).
    pub fn to_document(&self) -> bson::Document {
        bson::doc! {
            "iterationCount": i64::from(self.iterations).min(i64::from(i32::MAX)) as i32,
            "salt": B64.encode(&self.salt),
            "storedKey": B64.encode(&self.stored_key),
            "serverKey": B64.encode(&self.server_key),
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// The message does not follow the SCRAM grammar (mongod: 17 ProtocolError or 2 BadValue).
    Malformed(String),
    /// Wrong proof, nonce or channel-binding echo: 18 AuthenticationFailed.
    Failed,
}

/// What the client's first message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The GS2 header (`n,,` or `y,,`), echoed base64-encoded in the final message.
    pub gs2_header: String,
    /// The message without the header: part of the AuthMessage.
    pub bare: String,
    /// The user name, with `=2C` and `=3D` decoded.
    pub user: String,
    /// The client's nonce.
    pub nonce: String,
}

/// Decodes a SCRAM user name (`=2C` is `,`, `=3D` is `=`, any other `=` is invalid).
fn decode_name(raw: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3);
        match escape {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => {
                return Err(ScramError::Malformed(
                    "Invalid SCRAM user name: '=' must be escaped as =2C or =3D".into(),
                ))
            }
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses `gs2-header client-first-message-bare`.
pub fn parse_client_first(message: &str) -> Result<ClientFirst, ScramError> {
    let malformed =
        |what: &str| ScramError::Malformed(format!("Invalid SCRAM client-first message: {what}"));
    // gs2-header = gs2-cbind-flag "," [ authzid ] ","
    let mut parts = message.splitn(3, ',');
    let flag = parts.next().unwrap_or("");
    let authzid = parts.next().ok_or_else(|| malformed("no GS2 header"))?;
    let bare = parts.next().ok_or_else(|| malformed("no GS2 header"))?;
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => {
            return Err(ScramError::Malformed(
                "Server does not support channel binding".into(),
            ))
        }
        _ => return Err(malformed("bad channel-binding flag")),
    }
    if !authzid.is_empty() {
        return Err(ScramError::Malformed(
            "SCRAM authorization identities (authzid) are not supported".into(),
        ));
    }
    let mut attrs = bare.split(',');
    let user = match attrs.next() {
        Some(a) if a.starts_with("m=") => {
            return Err(malformed("mandatory extensions are not supported"))
        }
        Some(a) => a
            .strip_prefix("n=")
            .ok_or_else(|| malformed("no user name"))?,
        None => return Err(malformed("empty")),
    };
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','))
        .ok_or_else(|| malformed("no client nonce"))?;
    let user = decode_name(user)?;
    if user.is_empty() {
        return Err(malformed("empty user name"));
    }
    Ok(ClientFirst {
        gs2_header: format!("{flag},{authzid},"),
        bare: bare.to_string(),
        user,
        nonce: nonce.to_string(),
    })
}

/// A conversation after the server's first message: waiting for the client's proof.
#[derive(Debug, Clone)]
pub struct ServerFirst {
    /// The mechanism in use.
    pub mechanism: Mechanism,
    /// The credential the proof is checked against.
    credential: Credential,
    client_first: ClientFirst,
    /// `r=<client nonce><server nonce>,s=<salt>,i=<iterations>`.
    pub message: String,
    combined_nonce: String,
}

impl ServerFirst {
    /// Answers a client-first message with a fresh random server nonce (24 random bytes,
    /// base64, as mongod does).
    pub fn new(mechanism: Mechanism, credential: Credential, client_first: ClientFirst) -> Self {
        let mut nonce = [0u8; 24];
        rand::rng().fill(&mut nonce);
        let combined_nonce = format!("{}{}", client_first.nonce, B64.encode(nonce));
        let message = format!(
            "r={combined_nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        ServerFirst {
            mechanism,
            credential,
            client_first,
            message,
            combined_nonce,
        }
    }

    /// Checks the client's final message (`c=…,r=…,p=…`) and returns the server's final message
    /// (`v=<ServerSignature>`).
    pub fn finish(&self, client_final: &str) -> Result<String, ScramError> {
        let malformed = |what: &str| {
            ScramError::Malformed(format!("Invalid SCRAM client-final message: {what}"))
        };
        let (without_proof, proof) = client_final
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("no proof"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| malformed("no channel binding"))?;
        let nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed("no nonce"))?;
        let proof = B64
            .decode(proof)
            .map_err(|_| malformed("the proof is not base64"))?;
        let binding = B64
            .decode(binding)
            .map_err(|_| malformed("the channel binding is not base64"))?;
        if binding != self.client_first.gs2_header.as_bytes() || nonce != self.combined_nonce {
            return Err(ScramError::Failed);
        }
        let auth_message = format!(
            "{},{},{}",
            self.client_first.bare, self.message, without_proof
        );
        let mech = self.mechanism;
        let client_signature = mech.hmac(&self.credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::Failed);
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        // Every byte is compared, so the time taken does not tell how much of the key matched.
        let computed = mech.hash(&client_key);
        let differing = computed
            .iter()
            .zip(&self.credential.stored_key)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differing != 0 || computed.len() != self.credential.stored_key.len() {
            return Err(ScramError::Failed);
        }
        let server_signature = mech.hmac(&self.credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client written from RFC 5802, to run conversations against the server side.
    fn client_final(
        mech: Mechanism,
        user: &str,
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> (String, Vec<u8>) {
        let mut salt = None;
        let mut iterations = None;
        let mut nonce = None;
        for attr in server_first.split(',') {
            match attr.split_at(2) {
                ("r=", v) => nonce = Some(v.to_string()),
                ("s=", v) => salt = B64.decode(v).ok(),
                ("i=", v) => iterations = v.parse::<u32>().ok(),
                _ => {}
            }
        }
        let (salt, iterations, nonce) = (salt.unwrap(), iterations.unwrap(), nonce.unwrap());
        let prepared = mech.prepare_password(user, password).unwrap();
        let salted = mech.salted_password(&prepared, &salt, iterations);
        let client_key = mech.hmac(&salted, b"Client Key");
        let stored_key = mech.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = mech.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = mech.hmac(&salted, b"Server Key");
        let expected_server_signature = mech.hmac(&server_key, auth_message.as_bytes());
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            expected_server_signature,
        )
    }

    fn conversation(
        mech: Mechanism,
        stored_password: &str,
        given_password: &str,
    ) -> Result<(), ScramError> {
        let credential = Credential::new(mech, "user", stored_password, 64).unwrap();
        let first = parse_client_first("n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL")?;
        let bare = first.bare.clone();
        let server_first = ServerFirst::new(mech, credential, first);
        assert!(server_first
            .message
            .starts_with("r=fyko+d2lbbFgONRv9qkxdawL"));
        let (final_message, expected) =
            client_final(mech, "user", given_password, &bare, &server_first.message);
        let server_final = server_first.finish(&final_message)?;
        assert_eq!(server_final, format!("v={}", B64.encode(expected)));
        Ok(())
    }

    #[test]
    fn a_right_password_authenticates_with_both_mechanisms() {
        for mech in Mechanism::ALL {
            assert_eq!(conversation(mech, "pencil", "pencil"), Ok(()), "{mech:?}");
            assert_eq!(
                conversation(mech, "pencil", "pencil2"),
                Err(ScramError::Failed),
                "{mech:?}"
            );
        }
    }

    #[test]
    fn rfc_5802_and_7677_test_vectors() {
        // The RFCs' examples derive keys from the raw password "pencil" (SASLprep leaves it
        // unchanged); SHA-1's MD5 pre-digest is mongod's own, so the SHA-1 vector is checked
        // with the digest skipped.
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = Credential::with_salt(Mechanism::Sha256, "user", "pencil", salt, 4096).unwrap();
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,\
            r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,\
            c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let signature = Mechanism::Sha256.hmac(&cred.server_key, auth_message.as_bytes());
        assert_eq!(
            B64.encode(signature),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        let salt = B64.decode("QSXCR+Q6sek8bf92").unwrap();
        let salted = Mechanism::Sha1.salted_password(b"pencil", &salt, 4096);
        let server_key = Mechanism::Sha1.hmac(&salted, b"Server Key");
        let auth_message = "n=user,r=fyko+d2lbbFgONRv9qkxdawL,\
            r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096,\
            c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j";
        let signature = Mechanism::Sha1.hmac(&server_key, auth_message.as_bytes());
        assert_eq!(B64.encode(signature), "rmF9pqV8S7suAoZWja4dJRkFsKQ=");
    }

    #[test]
    fn sha1_passwords_are_digested_as_mongod_does() {
        // hex(MD5("user:mongo:pencil")), the string mongod runs PBKDF2 over.
        let prepared = Mechanism::Sha1.prepare_password("user", "pencil").unwrap();
        assert_eq!(prepared, b"1c33006ec1ffd90f9cadcbcc0e118200".to_vec());
    }

    #[test]
    fn sasl_prep_maps_and_refuses_as_rfc_4013_says() {
        // U+00AD (soft hyphen) maps to nothing; U+2168 (roman numeral nine) to "IX" under NFKC.
        let a = Mechanism::Sha256
            .prepare_password("u", "I\u{00AD}X")
            .unwrap();
        let b = Mechanism::Sha256.prepare_password("u", "\u{2168}").unwrap();
        assert_eq!(a, b"IX".to_vec());
        assert_eq!(b, b"IX".to_vec());
        // A control character is prohibited.
        assert!(Mechanism::Sha256
            .prepare_password("u", "a\u{0007}")
            .is_err());
    }

    #[test]
    fn client_first_messages_are_parsed_strictly() {
        let f = parse_client_first("n,,n=a=2Cb=3Dc,r=abc").unwrap();
        assert_eq!((f.user.as_str(), f.nonce.as_str()), ("a,b=c", "abc"));
        assert_eq!(f.gs2_header, "n,,");
        for bad in [
            "",
            "n,,",
            "x,,n=u,r=abc",
            "p=tls-unique,,n=u,r=abc",
            "n,a=admin,n=u,r=abc",
            "n,,m=ext,n=u,r=abc",
            "n,,n=u",
            "n,,n=u,r=",
            "n,,n=a=2,r=abc",
            "n,,n=,r=abc",
        ] {
            assert!(parse_client_first(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_tampered_final_message_fails() {
        let mech = Mechanism::Sha256;
        let credential = Credential::new(mech, "user", "pw", 16).unwrap();
        let first = parse_client_first("n,,n=user,r=nonce").unwrap();
        let bare = first.bare.clone();
        let sf = ServerFirst::new(mech, credential, first);
        let (good, _) = client_final(mech, "user", "pw", &bare, &sf.message);
        // Another nonce, another channel-binding echo, a truncated proof, garbage.
        let other_nonce = good.replacen("r=nonce", "r=nonceX", 1);
        let other_binding = good.replacen("c=biws", "c=eSws", 1);
        let (head, _) = good.rsplit_once(",p=").unwrap();
        let short_proof = format!("{head},p=AAAA");
        assert_eq!(sf.finish(&other_nonce), Err(ScramError::Failed));
        assert_eq!(sf.finish(&other_binding), Err(ScramError::Failed));
        assert_eq!(sf.finish(&short_proof), Err(ScramError::Failed));
        assert!(matches!(sf.finish("p=%%%"), Err(ScramError::Malformed(_))));
        assert!(matches!(sf.finish(""), Err(ScramError::Malformed(_))));
        assert!(sf.finish(&good).is_ok());
    }
}
