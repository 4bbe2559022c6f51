//! Certificates for the local control plane: one CA, the apiserver's serving certificate,
//! client certificates (CN = user, O = groups, as the apiserver's x509 authenticator reads
//! them) and the service-account signing key.
//!
//! Counterpart: what controller-runtime's envtest and kwokctl generate with Go's crypto/x509.
//! ECDSA P-256 everywhere: quick to generate, and accepted by every component that reads them.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::{TestEnvError, write_file as write};

/// The certificate authority every component trusts, kept so that more client certificates
/// can be issued after start (for RBAC tests that need a non-admin user).
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// Where `ca.crt` was written.
    pub cert_path: PathBuf,
    /// The CA certificate in DER, as kube-client's `Config::root_cert` wants it.
    pub cert_der: Vec<u8>,
}

/// A certificate and its key written to disk as `<name>.crt` and `<name>.key`.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn cert_error(what: &str, e: rcgen::Error) -> TestEnvError {
    TestEnvError::Certificates(format!("{what}: {e}"))
}

impl Authority {
    /// Creates a self-signed CA and writes `ca.crt` (and `ca.key`, which kube-controller-manager
    /// would need to sign CSRs) into `dir`.
    pub fn create(dir: &Path) -> Result<Self, TestEnvError> {
        let key = KeyPair::generate().map_err(|e| cert_error("generating the CA key", e))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kubeloop-testenv-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|e| cert_error("self-signing the CA", e))?;
        let cert_path = dir.join("ca.crt");
        write(&cert_path, &cert.pem())?;
        write(&dir.join("ca.key"), &key.serialize_pem())?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_path,
            cert_der: cert.der().to_vec(),
        })
    }

    /// Issues the apiserver's serving certificate for 127.0.0.1, localhost, the `kubernetes`
    /// Service and `extra_ips` (the node address it listens on in node mode).
    pub fn serving_cert(
        &self,
        dir: &Path,
        name: &str,
        extra_ips: &[IpAddr],
    ) -> Result<CertFiles, TestEnvError> {
        let mut params = serving_params(name)?;
        for ip in extra_ips {
            if !params.subject_alt_names.contains(&SanType::IpAddress(*ip)) {
                params.subject_alt_names.push(SanType::IpAddress(*ip));
            }
        }
        self.issue(dir, name, params)
    }

    /// A serving certificate like the apiserver's, kept in memory: the certificate and its
    /// PKCS#8 key, both DER, as rustls takes them (for the HTTP fault proxy).
    pub fn serving_identity(&self, name: &str) -> Result<(Vec<u8>, Vec<u8>), TestEnvError> {
        let (cert, key) = self.sign(name, serving_params(name)?)?;
        Ok((cert.der().to_vec(), key.serialize_der()))
    }

    /// Issues a client certificate: the apiserver takes CN as the user name and each O as a group.
    pub fn client_cert(
        &self,
        dir: &Path,
        file_name: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<CertFiles, TestEnvError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(dir, file_name, params)
    }

    fn sign(
        &self,
        name: &str,
        mut params: CertificateParams,
    ) -> Result<(rcgen::Certificate, KeyPair), TestEnvError> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()
            .map_err(|e| cert_error(&format!("generating the key for {name}"), e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| cert_error(&format!("signing {name}"), e))?;
        Ok((cert, key))
    }

    fn issue(
        &self,
        dir: &Path,
        name: &str,
        params: CertificateParams,
    ) -> Result<CertFiles, TestEnvError> {
        let (cert, key) = self.sign(name, params)?;
        let files = CertFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

/// A server certificate's parameters: 127.0.0.1, localhost and the in-cluster names of the
/// `kubernetes` Service.
fn serving_params(name: &str) -> Result<CertificateParams, TestEnvError> {
    let mut params = CertificateParams::new(vec![
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])
    .map_err(|e| cert_error("serving certificate names", e))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    // 10.0.0.1 is the first address of --service-cluster-ip-range: the `kubernetes` Service.
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// Writes the service-account signing key (`sa.key`, PKCS#8 PEM) and its public half (`sa.pub`).
/// kube-apiserver signs tokens with the private key; it and kube-controller-manager verify with
/// the public one.
pub fn service_account_key(dir: &Path) -> Result<CertFiles, TestEnvError> {
    let key =
        KeyPair::generate().map_err(|e| cert_error("generating the service-account key", e))?;
    let files = CertFiles {
        cert: dir.join("sa.pub"),
        key: dir.join("sa.key"),
    };
    write(&files.key, &key.serialize_pem())?;
    write(&files.cert, &key.public_key_pem())?;
    Ok(files)
}
