//! HTTPS for the emulator: a certificate and key from PEM files, so that clients can be tested against a
//! private CA (`--ca-bundle`) the way they meet one behind a corporate proxy or an on-premises S3.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM files: the certificate chain (leaf first) and its private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The acceptor for `files`; fails on unreadable or mismatched files.
pub fn acceptor(files: &TlsFiles) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", files.cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "TLS certificate {}: no certificate in it",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| anyhow::anyhow!("TLS key {}: {e}", files.key.display()))?;
    // The provider is named rather than taken from the process default, which is ambiguous when more than
    // one is compiled in.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("TLS certificate and key: {e}"))?;
    // The SDK speaks HTTP/1.1 to S3; so does this server.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
