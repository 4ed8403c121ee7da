//! Certificates for TLS tests, made with the `openssl` command as an operator would.

/// A certificate authority, a server certificate for 127.0.0.1 and a client certificate, in
/// a folder of their own (`ca.pem`, `server.pem`/`.key`, `client.pem`/`.key`).
pub struct TestPki {
    dir: std::path::PathBuf,
}

impl TestPki {
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!("cs-pki-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self { dir };
        std::fs::write(pki.path("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        std::fs::write(pki.path("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        pki.openssl(
            &[
                &["req", "-x509"],
                &ec[..],
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=countersign test CA",
                ],
            ]
            .concat(),
        );
        for (name, cn) in [("server", "/CN=nats"), ("client", "/CN=countersign")] {
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            pki.openssl(
                &[
                    &["req"],
                    &ec[..],
                    &["-keyout", &key, "-out", &csr, "-subj", cn],
                ]
                .concat(),
            );
            pki.openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "1",
                "-extfile",
                &ext,
            ]);
        }
        pki
    }

    fn openssl(&self, args: &[&str]) {
        crate::output_of(
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(&self.dir),
        );
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
