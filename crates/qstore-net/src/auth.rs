//! Cluster authentication: every process of a distributed cluster (servers and clients) holds
//! the same secret, and every connection between them opens with a challenge–response that
//! proves both ends hold it, without the secret ever crossing the wire.
//!
//! Each end sends a fresh random nonce; each then answers with a keyed MAC (BLAKE3 in keyed
//! mode) over a label naming its role and the transcript of the exchange, which contains both
//! nonces. A recorded proof is worthless later (the other end's nonce is new every time), a
//! proof for one role cannot be replayed as the other, and a peer that does not hold the
//! secret learns nothing it could use.
//!
//! What this protects, and what it does not: it keeps anyone without the secret from joining a
//! cluster, impersonating a node, or submitting transactions. It does not encrypt traffic or
//! protect it after the handshake: someone who can read or rewrite packets on the network
//! between hosts can read data and hijack an established connection. Run clusters on a trusted
//! network (loopback, a private network or a tunnel).

use std::fmt;
use std::io;
use std::path::Path;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// A fresh random value that makes every handshake's proofs unique.
pub type Nonce = [u8; NONCE_LEN];
/// A proof: the keyed MAC of a role label and a handshake transcript.
pub type Proof = [u8; 32];

/// Fewest bytes of secret material accepted (after trimming white space).
pub const MIN_SECRET_LEN: usize = 16;
/// Largest secret file read, so that naming a huge file by mistake is refused quickly.
const MAX_SECRET_FILE: u64 = 4096;
/// Separates qstore's key from any other use of the same secret material.
const KEY_CONTEXT: &str = "qstore 2026-11 cluster secret v1";

/// The shared secret of a cluster. Never printed, never sent.
#[derive(Clone)]
pub struct ClusterSecret {
    key: [u8; 32],
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret from `material` (e.g. a file's contents); white space around it is ignored.
    pub fn from_material(material: &[u8]) -> Result<Self, String> {
        let material = material.trim_ascii();
        if material.len() < MIN_SECRET_LEN {
            return Err(format!(
                "a cluster secret needs at least {MIN_SECRET_LEN} bytes, this one has {}",
                material.len()
            ));
        }
        Ok(ClusterSecret {
            key: blake3::derive_key(KEY_CONTEXT, material),
        })
    }

    /// New secret material: 32 random bytes as 64 hexadecimal digits.
    pub fn generate_text() -> io::Result<String> {
        let bytes: [u8; 32] = random_bytes()?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Reads the secret from `path`, which must be a regular file that only its owner can
    /// read or write (mode 600 or stricter): a secret others can read protects nothing.
    pub fn load(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the cluster secret file {shown}: {e}"))?;
        if !meta.is_file() {
            return Err(format!(
                "the cluster secret file {shown} is not a regular file"
            ));
        }
        check_private(path, &meta)?;
        if meta.len() > MAX_SECRET_FILE {
            return Err(format!(
                "the cluster secret file {shown} has {} bytes; a secret is at most \
                 {MAX_SECRET_FILE}",
                meta.len()
            ));
        }
        let material = std::fs::read(path)
            .map_err(|e| format!("cannot read the cluster secret file {shown}: {e}"))?;
        Self::from_material(&material).map_err(|e| format!("{shown}: {e}"))
    }

    /// Writes new secret material to a new file at `path`, readable only by its owner.
    /// Refuses to overwrite an existing file (another cluster's secret may be there).
    pub fn create_file(path: &Path) -> Result<(), String> {
        use std::io::Write;
        let shown = path.display();
        let text = Self::generate_text().map_err(|e| format!("no random source: {e}"))?;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut file = opts
            .open(path)
            .map_err(|e| format!("cannot create the cluster secret file {shown}: {e}"))?;
        writeln!(file, "{text}")
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("cannot write the cluster secret file {shown}: {e}"))
    }

    /// The proof that the holder of this secret plays `role` in the exchange `transcript`.
    pub fn prove(&self, role: &str, transcript: &[u8]) -> Proof {
        let mut mac = blake3::Hasher::new_keyed(&self.key);
        mac.update(&(role.len() as u64).to_le_bytes());
        mac.update(role.as_bytes());
        mac.update(transcript);
        *mac.finalize().as_bytes()
    }

    /// Whether `proof` is this secret's proof for `role` and `transcript`, compared in
    /// constant time (a timing difference would let a forger learn a proof byte by byte).
    pub fn verify(&self, role: &str, transcript: &[u8], proof: &Proof) -> bool {
        blake3::Hash::from(self.prove(role, transcript)) == blake3::Hash::from(*proof)
    }
}

#[cfg(unix)]
fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the cluster secret file {} can be read or written by others (mode {mode:03o}); \
             make it private with `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_: &Path, _: &std::fs::Metadata) -> Result<(), String> {
    Ok(())
}

/// Bytes from the operating system's random source.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

/// A fresh nonce.
pub fn nonce() -> io::Result<Nonce> {
    random_bytes()
}

/// A random 64-bit value (e.g. a process's incarnation).
pub fn random_u64() -> io::Result<u64> {
    random_bytes().map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::from_material(s.as_bytes()).unwrap()
    }

    #[test]
    fn proofs_depend_on_secret_role_and_transcript() {
        let a = secret("0123456789abcdef0123");
        let b = secret("0123456789abcdef0124");
        let p = a.prove("server", b"t1");
        assert!(a.verify("server", b"t1", &p));
        assert!(!b.verify("server", b"t1", &p), "another secret");
        assert!(!a.verify("client", b"t1", &p), "another role");
        assert!(!a.verify("server", b"t2", &p), "another transcript");
    }

    #[test]
    fn short_material_is_refused_and_white_space_ignored() {
        assert!(ClusterSecret::from_material(b"  short \n").is_err());
        let x = secret("0123456789abcdef");
        let y = secret("\n 0123456789abcdef \n");
        assert!(y.verify("r", b"", &x.prove("r", b"")));
    }

    #[test]
    fn secret_files_are_created_private_and_others_refused() {
        let dir = std::env::temp_dir().join(format!("qstore-auth-{}", random_u64().unwrap()));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("secret");
        ClusterSecret::create_file(&path).unwrap();
        let loaded = ClusterSecret::load(&path).unwrap();
        assert!(format!("{loaded:?}").contains(".."), "never printed");
        assert!(
            ClusterSecret::create_file(&path).is_err(),
            "an existing file is never overwritten"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let err = ClusterSecret::load(&path).unwrap_err();
            assert!(err.contains("chmod 600"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
