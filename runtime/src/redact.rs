//! Outbound URLs may carry credentials (`https://user:pass@host/hook?token=…`), and
//! `reqwest` puts the URL in its errors' text. Whatever is logged or stored goes through here
//! first: the host and path stay, to say where a call went, the secrets do not.

use reqwest::Url;

const REDACTED: &str = "redacted";

/// Replaces the user info, every query value and the fragment of `url`.
pub fn redact_url(url: &mut Url) {
    if !url.username().is_empty() || url.password().is_some() {
        // Fails only for URLs that cannot have user info, which then have none to hide.
        let _ = url.set_username(REDACTED);
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let names: Vec<String> = url
            .query_pairs()
            .map(|(name, _)| name.into_owned())
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(names.iter().map(|name| (name, REDACTED)));
    }
    if url.fragment().is_some() {
        url.set_fragment(Some(REDACTED));
    }
}

/// `url` as text, redacted; text that is not a URL is not shown at all.
pub fn redacted_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut url) => {
            redact_url(&mut url);
            url.to_string()
        }
        Err(_) => format!("<{REDACTED} unparsable URL>"),
    }
}

/// The error with its URL redacted, ready to log.
pub fn redact_error(mut error: reqwest::Error) -> reqwest::Error {
    if let Some(url) = error.url_mut() {
        redact_url(url);
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET_URL: &str =
        "http://hookuser:hookpass@127.0.0.1:1/hooks/ops?token=s3cr3t&sig=abc#frag";

    fn assert_no_secret(text: &str) {
        for secret in ["hookuser", "hookpass", "s3cr3t", "abc", "frag"] {
            assert!(!text.contains(secret), "{secret:?} shown in {text}");
        }
    }

    #[test]
    fn a_url_keeps_its_host_path_and_parameter_names_only() {
        let shown = redacted_url(SECRET_URL);
        assert_no_secret(&shown);
        assert_eq!(
            shown,
            "http://redacted@127.0.0.1:1/hooks/ops?token=redacted&sig=redacted#redacted"
        );
        assert_eq!(
            redacted_url("https://example.com/hook"),
            "https://example.com/hook"
        );
        assert_no_secret(&redacted_url("not a url with s3cr3t"));
    }

    #[tokio::test]
    async fn a_failed_request_logs_its_url_redacted() {
        // Port 1 on the loopback refuses the connection, so reqwest fails with the URL.
        let error = reqwest::Client::new()
            .post(SECRET_URL)
            .send()
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("s3cr3t"),
            "the risk is real: {error}"
        );
        let logged = redact_error(error).to_string();
        assert_no_secret(&logged);
        assert!(
            logged.contains("127.0.0.1:1/hooks/ops?token=redacted"),
            "{logged}"
        );
    }
}
