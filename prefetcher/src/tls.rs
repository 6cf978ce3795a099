//! TLS with rustls (the ring provider): the client listener's server configuration
//! (certificate and key files, HTTP/2 and HTTP/1.1 by ALPN) and the origin client's
//! configuration (the system's roots or `origin.ca_file`, the server name per
//! origin). Files are read when the node starts, and the listener's again on a reload
//! (a new certificate for new handshakes); a bad one fails the start, or refuses the
//! reload, naming its field.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::{ConfigError, TlsListenConfig};

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            invalid(
                field,
                format!("{}: not PEM certificates: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(invalid(
            field,
            format!("{}: no PEM certificate in the file", path.display()),
        ));
    }
    Ok(certs)
}

/// The certificate and key of the TLS listener, read from `config`'s files and
/// checked against each other: what a handshake presents.
pub(crate) fn listener_key(config: &TlsListenConfig) -> Result<Arc<CertifiedKey>, ConfigError> {
    let certs = read_certs(&config.cert_file, "tls.cert_file")?;
    let key_bytes = std::fs::read(&config.key_file).map_err(|e| {
        invalid(
            "tls.key_file",
            format!("cannot read {}: {e}", config.key_file.display()),
        )
    })?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        invalid(
            "tls.key_file",
            format!(
                "{}: no usable PEM private key: {e}",
                config.key_file.display()
            ),
        )
    })?;
    let key = CertifiedKey::from_der(certs, key, &provider()).map_err(|e| {
        invalid(
            "tls.key_file",
            format!("does not fit tls.cert_file's certificate: {e}"),
        )
    })?;
    Ok(Arc::new(key))
}

/// The TLS listener's certificate as handshakes see it: one swap away from a new one
/// ([`ListenerCert::replace`], on a reload), so new handshakes present the new
/// certificate while connections already up keep theirs.
#[derive(Debug, Clone)]
pub(crate) struct ListenerCert(Arc<ArcSwap<CertifiedKey>>);

impl ListenerCert {
    /// Puts `key` in force for the handshakes from now on.
    pub(crate) fn replace(&self, key: Arc<CertifiedKey>) {
        self.0.store(key);
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// The server configuration of the TLS listener: the certificate chain and key from
/// `config`'s files ([`listener_key`]), ALPN `h2` then `http/1.1`; and the handle
/// that replaces the certificate later.
pub(crate) fn server_config(
    config: &TlsListenConfig,
) -> Result<(Arc<ServerConfig>, ListenerCert), ConfigError> {
    let cert = ListenerCert(Arc::new(ArcSwap::new(listener_key(config)?)));
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("tls", e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(cert.clone()));
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(server), cert))
}

/// The roots `https://` origins are verified against: `ca_file`'s certificates when
/// set, else the system's (read only when `system` says some origin needs them).
fn origin_roots(ca_file: Option<&Path>, system: bool) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in read_certs(path, "origin.ca_file")? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        "origin.ca_file",
                        format!("{}: not a CA certificate: {e}", path.display()),
                    )
                })?;
            }
        }
        None if !system => {}
        None => {
            // A system without a CA bundle still starts: plain-HTTP origins work, and
            // every TLS origin fails verification (502, counted) until one is given.
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!(%error, "reading the system's CA certificates");
            }
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    ignored,
                    "no system CA certificates: https origins will fail verification \
                     unless origin.ca_file is set"
                );
            }
        }
    }
    Ok(roots)
}

/// The origin client's TLS configuration: webpki verification of the chain against
/// [`origin_roots`] and of the server name ([`ServerNames`]); HTTP/1.1 only. The
/// system's roots are read only when `any_https` (some tenant's origin is TLS).
pub(crate) fn origin_client_config(
    ca_file: Option<&Path>,
    any_https: bool,
) -> Result<Arc<ClientConfig>, ConfigError> {
    let roots = origin_roots(ca_file, any_https)?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("origin", e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Maps an `https://` origin's authority to its TLS server name, for the connector.
/// A reload that changes the tenants puts the new names in force for the connections
/// made from then on ([`ServerNames::replace`]); the clones share them.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerNames {
    by_authority: Arc<ArcSwap<HashMap<String, ServerName<'static>>>>,
}

impl ServerNames {
    /// Whether no origin is `https://`.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_authority.load().is_empty()
    }

    /// From `(authority, server name)` pairs (validated by `Config::validate`).
    pub(crate) fn new(pairs: impl IntoIterator<Item = (String, String)>) -> ServerNames {
        let names = ServerNames::default();
        names.replace(pairs);
        names
    }

    /// Puts these `(authority, server name)` pairs in force instead.
    pub(crate) fn replace(&self, pairs: impl IntoIterator<Item = (String, String)>) {
        let by_authority = pairs
            .into_iter()
            .filter_map(|(authority, name)| {
                let name = ServerName::try_from(name).ok()?;
                Some((authority.to_ascii_lowercase(), name))
            })
            .collect();
        self.by_authority.store(Arc::new(by_authority));
    }

    /// The server name for a request to `uri`: the configured one for its
    /// authority, else its host.
    pub(crate) fn resolve(
        &self,
        uri: &http::Uri,
    ) -> Result<ServerName<'static>, Box<dyn std::error::Error + Sync + Send>> {
        if let Some(name) = uri.authority().and_then(|a| {
            self.by_authority
                .load()
                .get(&a.as_str().to_ascii_lowercase())
                .cloned()
        }) {
            return Ok(name);
        }
        let host = uri.host().ok_or("origin URL without a host")?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Ok(ServerName::try_from(host.to_string())?)
    }
}

impl hyper_rustls::ResolveServerName for ServerNames {
    fn resolve(
        &self,
        uri: &http::Uri,
    ) -> Result<ServerName<'static>, Box<dyn std::error::Error + Sync + Send>> {
        ServerNames::resolve(self, uri)
    }
}

/// The TLS error in an origin client error's source chain, if that is what failed
/// (an untrusted or mismatched certificate, a handshake failure).
pub(crate) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // The connector wraps rustls' error in `io::Error`s (twice), and an
        // `io::Error`'s `source()` skips the error it wraps: step into it instead.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn listen_config(cert: &Path, key: &Path) -> TlsListenConfig {
        TlsListenConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
        }
    }

    #[test]
    fn bad_listener_files_fail_naming_their_field() {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = file(&generated.cert.pem());
        let key = file(&generated.key_pair.serialize_pem());
        let (config, _) = server_config(&listen_config(cert.path(), key.path())).unwrap();
        assert_eq!(
            config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );

        let missing = Path::new("/nonexistent/cert.pem");
        let e = server_config(&listen_config(missing, key.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tls.cert_file") && e.contains("cannot read"),
            "{e}"
        );
        let garbage = file("not a certificate\n");
        let e = server_config(&listen_config(garbage.path(), key.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.cert_file"), "{e}");
        let e = server_config(&listen_config(cert.path(), garbage.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.key_file"), "{e}");
        // A key that belongs to another certificate.
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other_key = file(&other.key_pair.serialize_pem());
        let e = server_config(&listen_config(cert.path(), other_key.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.key_file"), "{e}");
    }

    #[test]
    fn a_bad_origin_ca_file_fails_naming_its_field() {
        let e = origin_client_config(Some(Path::new("/nonexistent/ca.pem")), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("origin.ca_file"), "{e}");
        let empty = file("");
        let e = origin_client_config(Some(empty.path()), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("origin.ca_file") && e.contains("no PEM"), "{e}");
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca = file(&generated.cert.pem());
        origin_client_config(Some(ca.path()), true).unwrap();
    }

    #[test]
    fn server_names_come_from_configuration_before_the_url() {
        let names = ServerNames::new([("10.0.0.5:8443".into(), "www.acme.example".into())]);
        let name = |u: &str| {
            names
                .resolve(&u.parse().unwrap())
                .unwrap()
                .to_str()
                .into_owned()
        };
        assert_eq!(name("https://10.0.0.5:8443/a"), "www.acme.example");
        assert_eq!(name("https://o.example/a"), "o.example");
        assert_eq!(name("https://[::1]:9/a"), "::1");
    }
}
