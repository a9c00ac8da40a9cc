//! The TLS configuration of every HTTPS request.
//!
//! Trusts Mozilla's root certificates (compiled in, so a machine without a CA bundle still works)
//! and the system's trust store (`/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR`), so that a
//! proxy whose certificate authority the administrator installed is trusted too.

use std::sync::{Arc, OnceLock};

use rustls::{ClientConfig, RootCertStore};

/// The shared client configuration, built once per process. `None` only if rustls refuses the
/// protocol defaults of its own provider, in which case ureq's built-in configuration is used.
pub(crate) fn client_config() -> Option<Arc<ClientConfig>> {
    static CONFIG: OnceLock<Option<Arc<ClientConfig>>> = OnceLock::new();
    CONFIG.get_or_init(build).clone()
}

fn build() -> Option<Arc<ClientConfig>> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!("loading system certificates: {error}");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(
        "TLS roots: {} built in, {added} from the system ({ignored} unusable)",
        webpki_roots::TLS_SERVER_ROOTS.len()
    );
    // An explicit provider: rustls cannot pick a process default when another crate in the
    // build enables a second one.
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| tracing::warn!("TLS configuration: {e}"))
            .ok()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Some(Arc::new(config))
}
