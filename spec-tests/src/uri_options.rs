//! The URI options tests (`uri-options/tests/*.json`): not unified format, but
//! `{tests: [{description, uri, valid, warning, hosts, auth, options}]}`. Each URI goes through
//! `ClientOptions::parse`; valid URIs must parse and produce the listed options, invalid ones must
//! fail.
//!
//! Warnings: the Rust driver has no channel for parse warnings, and upstream returns an error for
//! an option value the spec says should only warn. The fork keeps that: a `warning: true` case
//! passes when parsing fails with an error (see docs/spec-tests.md, "URI options").

use std::path::Path;
use std::time::Duration;

use bson::{Bson, Document};
use serde::Deserialize;

use crate::matching::numbers_equal;
use crate::mongodb::options::{
    Acknowledgment, ClientOptions, ReadPreference, SelectionCriteria, ServerMonitoringMode, Tls,
};
use crate::skips;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UriFile {
    tests: Vec<UriCase>,
}

/// One URI options test case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UriCase {
    pub description: String,
    pub uri: String,
    pub valid: bool,
    pub warning: bool,
    pub hosts: Option<Vec<Document>>,
    pub auth: Option<Document>,
    pub options: Option<Document>,
}

/// Loads a URI options file strictly; errors name the file and the JSON path.
pub fn load(path: &Path) -> Result<Vec<UriCase>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let mut de = serde_json::Deserializer::from_str(&text);
    let file: UriFile = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| format!("{}: at `{}`: {}", path.display(), e.path(), e.inner()))?;
    Ok(file.tests)
}

/// Why a case cannot run, or `None`.
pub fn skip_reason(case: &UriCase, name: &str) -> Option<String> {
    if case.uri.starts_with("mongodb+srv://") {
        return Some(skips::URI_SRV_NEEDS_DNS.to_string());
    }
    if let Some(reason) = skips::uri_feature(&case.uri) {
        return Some(reason.to_string());
    }
    if let Some(reason) = skips::known_failure(name) {
        return Some(format!("known failure: {reason}"));
    }
    if let Some(reason) = crate::timeouts::UNSUPPORTED {
        let query = case.uri.split_once('?').map_or("", |(_, q)| q);
        let sets_timeout = query.split('&').any(|pair| {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            key.eq_ignore_ascii_case("timeoutMS")
        });
        if sets_timeout {
            return Some(format!("option timeoutMS: {reason}"));
        }
    }
    let options = case.options.as_ref()?;
    for key in options.keys() {
        if let Some(reason) = skips::uri_option_without_field(key) {
            return Some(format!("option {key}: {reason}"));
        }
    }
    None
}

/// Parses the case's URI and checks the outcome.
pub async fn run(case: &UriCase) -> Result<(), String> {
    let parsed = ClientOptions::parse(&case.uri).await;
    match (case.valid, case.warning, parsed) {
        (false, _, Ok(_)) => Err("expected the URI to be rejected, but it parsed".into()),
        (false, _, Err(_)) => Ok(()),
        // Fork policy: a value the spec only warns about is an error.
        (true, true, Err(_)) => Ok(()),
        (true, true, Ok(_)) => Err(
            "expected an error (the fork's policy for spec warnings), but the URI parsed".into(),
        ),
        (true, false, Err(e)) => Err(format!("expected the URI to parse, got: {e}")),
        (true, false, Ok(opts)) => check_options(case, &opts),
    }
}

fn check_options(case: &UriCase, opts: &ClientOptions) -> Result<(), String> {
    if let Some(hosts) = &case.hosts {
        let actual: Vec<String> = opts.hosts.iter().map(ToString::to_string).collect();
        for host in hosts {
            let name = host.get_str("host").unwrap_or_default();
            let wanted = match host.get("port") {
                Some(Bson::Null) | None => name.to_string(),
                Some(port) => format!("{name}:{port}"),
            };
            if !actual
                .iter()
                .any(|a| a == &wanted || a == &format!("{wanted}:27017"))
            {
                return Err(format!("host {wanted} not in {actual:?}"));
            }
        }
    }
    if let Some(auth) = &case.auth {
        let cred = opts.credential.as_ref();
        for (key, want) in auth {
            let have = match key.as_str() {
                "username" => cred.and_then(|c| c.username.clone()),
                "password" => cred.and_then(|c| c.password.clone()),
                "db" => cred.and_then(|c| c.source.clone()),
                other => return Err(format!("unknown auth field {other}")),
            };
            let have = have.map(Bson::String).unwrap_or(Bson::Null);
            if &have != want {
                return Err(format!("auth.{key}: expected {want}, found {have}"));
            }
        }
    }
    let Some(expected) = &case.options else {
        return Ok(());
    };
    for (key, want) in expected {
        let have = option_value(opts, key)?;
        let same = match (&have, want) {
            (Some(h), w) => numbers_equal(w, h).unwrap_or_else(|| w == h),
            (None, Bson::Null) => true,
            (None, _) => false,
        };
        if !same {
            let shown = have.map_or("unset".to_string(), |h| h.to_string());
            return Err(format!("option {key}: expected {want}, found {shown}"));
        }
    }
    Ok(())
}

fn millis(d: Option<Duration>) -> Option<Bson> {
    d.map(|d| Bson::Int64(d.as_millis() as i64))
}

fn read_preference(opts: &ClientOptions) -> Option<&ReadPreference> {
    match &opts.selection_criteria {
        Some(SelectionCriteria::ReadPreference(rp)) => Some(rp),
        _ => None,
    }
}

fn read_preference_options(
    rp: &ReadPreference,
) -> Option<&crate::mongodb::options::ReadPreferenceOptions> {
    match rp {
        ReadPreference::Secondary { options }
        | ReadPreference::PrimaryPreferred { options }
        | ReadPreference::SecondaryPreferred { options }
        | ReadPreference::Nearest { options } => options.as_ref(),
        _ => None,
    }
}

/// The value a spec option name has in parsed options, as BSON for comparison.
fn option_value(opts: &ClientOptions, key: &str) -> Result<Option<Bson>, String> {
    let tls_options = match &opts.tls {
        Some(Tls::Enabled(o)) => Some(o),
        _ => None,
    };
    let value = match key {
        "appname" => opts.app_name.clone().map(Bson::String),
        "authMechanism" => opts
            .credential
            .as_ref()
            .and_then(|c| c.mechanism.as_ref())
            .map(|m| Bson::String(m.as_str().to_string())),
        "authMechanismProperties" => opts
            .credential
            .as_ref()
            .and_then(|c| c.mechanism_properties.clone())
            .map(Bson::Document),
        "authSource" => opts
            .credential
            .as_ref()
            .and_then(|c| c.source.clone())
            .map(Bson::String),
        "connectTimeoutMS" => millis(opts.connect_timeout),
        "directConnection" => opts.direct_connection.map(Bson::Boolean),
        "enableOverloadRetargeting" => opts.enable_overload_retargeting.map(Bson::Boolean),
        "heartbeatFrequencyMS" => millis(opts.heartbeat_freq),
        "journal" => opts
            .write_concern
            .as_ref()
            .and_then(|w| w.journal)
            .map(Bson::Boolean),
        "loadBalanced" => opts.load_balanced.map(Bson::Boolean),
        "localThresholdMS" => millis(opts.local_threshold),
        "maxAdaptiveRetries" => opts.max_adaptive_retries.map(|n| Bson::Int64(n.into())),
        "maxConnecting" => opts.max_connecting.map(|n| Bson::Int64(n.into())),
        "maxIdleTimeMS" => millis(opts.max_idle_time),
        "maxPoolSize" => opts.max_pool_size.map(|n| Bson::Int64(n.into())),
        "minPoolSize" => opts.min_pool_size.map(|n| Bson::Int64(n.into())),
        "maxStalenessSeconds" => read_preference(opts)
            .and_then(read_preference_options)
            .and_then(|o| o.max_staleness)
            .map(|d| Bson::Int64(d.as_secs() as i64)),
        "readConcernLevel" => match opts.read_concern.as_ref().map(bson::to_document) {
            Some(Ok(doc)) => doc.get("level").cloned(),
            Some(Err(e)) => return Err(format!("cannot serialize the read concern: {e}")),
            None => None,
        },
        "readPreference" => read_preference(opts).map(|rp| {
            Bson::String(
                match rp {
                    ReadPreference::Primary => "primary",
                    ReadPreference::Secondary { .. } => "secondary",
                    ReadPreference::PrimaryPreferred { .. } => "primaryPreferred",
                    ReadPreference::SecondaryPreferred { .. } => "secondaryPreferred",
                    ReadPreference::Nearest { .. } => "nearest",
                    _ => "unknown",
                }
                .to_string(),
            )
        }),
        "readPreferenceTags" => read_preference(opts)
            .and_then(read_preference_options)
            .and_then(|o| o.tag_sets.as_ref())
            .map(|sets| {
                Bson::Array(
                    sets.iter()
                        .map(|set| {
                            let mut doc = Document::new();
                            let mut keys: Vec<_> = set.keys().collect();
                            keys.sort();
                            for k in keys {
                                doc.insert(k.clone(), set[k].clone());
                            }
                            Bson::Document(doc)
                        })
                        .collect(),
                )
            }),
        "replicaSet" => opts.repl_set_name.clone().map(Bson::String),
        "retryWrites" => opts.retry_writes.map(Bson::Boolean),
        "retryReads" => opts.retry_reads.map(Bson::Boolean),
        "serverMonitoringMode" => opts.server_monitoring_mode.as_ref().map(|m| {
            Bson::String(
                match m {
                    ServerMonitoringMode::Stream => "stream",
                    ServerMonitoringMode::Poll => "poll",
                    ServerMonitoringMode::Auto => "auto",
                    _ => "unknown",
                }
                .to_string(),
            )
        }),
        "serverSelectionTimeoutMS" => millis(opts.server_selection_timeout),
        "srvMaxHosts" => opts.srv_max_hosts.map(|n| Bson::Int64(n.into())),
        "srvServiceName" => opts.srv_service_name.clone().map(Bson::String),
        "timeoutMS" => millis(crate::timeouts::client_timeout(opts)),
        "tls" => opts
            .tls
            .as_ref()
            .map(|t| Bson::Boolean(matches!(t, Tls::Enabled(_)))),
        "tlsAllowInvalidCertificates" => tls_options
            .and_then(|o| o.allow_invalid_certificates)
            .map(Bson::Boolean),
        "tlsCAFile" => tls_options
            .and_then(|o| o.ca_file_path.as_ref())
            .map(|p| Bson::String(p.display().to_string())),
        "tlsCertificateKeyFile" => tls_options
            .and_then(|o| o.cert_key_file_path.as_ref())
            .map(|p| Bson::String(p.display().to_string())),
        "w" => match opts.write_concern.as_ref().and_then(|w| w.w.as_ref()) {
            Some(Acknowledgment::Nodes(n)) => Some(Bson::Int64((*n).into())),
            Some(Acknowledgment::Majority) => Some(Bson::String("majority".into())),
            Some(Acknowledgment::Custom(s)) => Some(Bson::String(s.clone())),
            Some(_) => return Err("unknown write concern acknowledgment".into()),
            None => None,
        },
        "wTimeoutMS" => millis(opts.write_concern.as_ref().and_then(|w| w.w_timeout)),
        other => return Err(format!("no check for option {other}")),
    };
    Ok(value)
}
