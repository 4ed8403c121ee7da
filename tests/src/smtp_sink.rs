//! A local SMTP server that accepts every message and keeps it: enough of RFC 5321 (EHLO,
//! MAIL, RCPT, DATA, RSET, NOOP, QUIT) for a real client such as lettre.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Clone, Debug)]
pub struct Mail {
    pub to: Vec<String>,
    /// Headers and body as sent, with quoted-printable soft breaks undone.
    pub data: String,
}

impl Mail {
    /// The links of the message that point at `base`.
    pub fn links(&self, base: &str) -> Vec<String> {
        self.data
            .split_whitespace()
            .filter(|w| w.starts_with(base))
            .map(str::to_string)
            .collect()
    }
}

#[derive(Clone)]
pub struct SmtpSink {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let kept = mails.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(session(socket, kept.clone()));
            }
        });
        Self { port, mails }
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }

    /// A gateway's email settings for sending here, its links made with `public_base_url`.
    pub fn email_config(&self, public_base_url: &str) -> approval_gateway::config::EmailConfig {
        approval_gateway::config::EmailConfig {
            smtp_host: "127.0.0.1".into(),
            smtp_port: self.port,
            smtp_tls: approval_gateway::config::SmtpTls::None,
            smtp_username: None,
            smtp_password: None,
            from: "Countersign <approvals@example.com>".into(),
            public_base_url: public_base_url.into(),
            link_ttl_secs: 3600,
        }
    }
}

async fn session(
    socket: tokio::net::TcpStream,
    mails: Arc<Mutex<Vec<Mail>>>,
) -> std::io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    write.write_all(b"220 sink ESMTP\r\n").await?;
    let mut to = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let verb = line
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" | "HELO" => b"250-sink\r\n250 8BITMIME\r\n",
            "RCPT" => {
                to.push(
                    line.split_once(':')
                        .map_or("", |(_, address)| address)
                        .trim()
                        .trim_matches(['<', '>'])
                        .to_string(),
                );
                b"250 OK\r\n"
            }
            "DATA" => {
                write.write_all(b"354 go ahead\r\n").await?;
                let mut data = String::new();
                while let Some(line) = lines.next_line().await? {
                    if line == "." {
                        break;
                    }
                    data.push_str(&line);
                    data.push('\n');
                }
                let data = data.replace("=\n", "").replace("=3D", "=");
                mails.lock().unwrap().push(Mail {
                    to: std::mem::take(&mut to),
                    data,
                });
                b"250 queued\r\n"
            }
            "QUIT" => {
                write.write_all(b"221 bye\r\n").await?;
                return Ok(());
            }
            _ => b"250 OK\r\n",
        };
        write.write_all(reply).await?;
    }
    Ok(())
}
