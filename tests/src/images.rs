//! Container images for the tests, built locally (no registry is reachable): a `FROM scratch`
//! image holding Debian's `nats-server` or `redis-server` binary and the libraries `ldd`
//! lists. Built once per machine; a file lock keeps parallel test processes from building
//! the same image twice.

use std::fs;
use std::path::Path;
use std::process::Command;

pub struct LocalImage {
    pub name: &'static str,
    pub tag: &'static str,
    binary: &'static str,
}

pub const NATS: LocalImage = LocalImage {
    name: "countersign-test/nats",
    tag: "2.9.10",
    binary: "/usr/sbin/nats-server",
};

pub const REDIS: LocalImage = LocalImage {
    name: "countersign-test/redis",
    tag: "7.0.15",
    binary: "/usr/bin/redis-server",
};

impl LocalImage {
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }

    /// Builds the image unless the Docker engine has it already.
    pub fn ensure(&self) {
        let lock = fs::File::create(std::env::temp_dir().join("countersign-images.lock"))
            .expect("create the image lock file");
        lock.lock().expect("take the image lock");
        if !self.exists() {
            self.build();
        }
    }

    fn exists(&self) -> bool {
        Command::new("docker")
            .args(["image", "inspect", &self.reference()])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn build(&self) {
        assert!(
            Path::new(self.binary).exists(),
            "{} is missing: apt-get install nats-server redis-server (scripts/test does)",
            self.binary
        );
        let dir = std::env::temp_dir().join(format!("countersign-image-{}", uuid::Uuid::new_v4()));
        let root = dir.join("root");
        for sub in ["tmp", "data", "etc"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        run("chmod", &["1777", root.join("tmp").to_str().unwrap()]);
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/data:/sbin/nologin\n",
        )
        .unwrap();
        let mut files = vec![self.binary.to_string()];
        let ldd = Command::new("ldd")
            .arg(self.binary)
            .output()
            .expect("run ldd");
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            // "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x…)" or "/lib64/ld-linux….so.2 (0x…)"
            let path = line.split("=>").last().unwrap_or("").trim();
            let path = path.split(" (").next().unwrap_or("").trim();
            if path.starts_with('/') {
                files.push(path.to_string());
            }
        }
        for file in &files {
            let target = root.join(file.trim_start_matches('/'));
            fs::create_dir_all(target.parent().unwrap()).unwrap();
            run("cp", &["-L", file, target.to_str().unwrap()]);
        }
        fs::write(
            dir.join("Dockerfile"),
            format!(
                "FROM scratch\nCOPY root/ /\nWORKDIR /data\nENTRYPOINT [\"{}\"]\n",
                self.binary
            ),
        )
        .unwrap();
        run(
            "docker",
            &[
                "build",
                "-q",
                "-t",
                &self.reference(),
                dir.to_str().unwrap(),
            ],
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

fn run(program: &str, args: &[&str]) {
    crate::output_of(Command::new(program).args(args));
}
