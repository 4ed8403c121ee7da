//! The web inbox's records, each one key outside any run's slot: reviewers' sessions, one-time
//! sign-in links and the mark that throttles mailing them; and whose each MCP proxy session
//! is. Each is stored under the SHA-256 of its secret, so a copy of Redis signs nobody in, and
//! each expires on its own.

use super::{GatewayStore, StoreError};
use std::time::Duration;

impl GatewayStore {
    /// Stores a session of `principal` (`value`, JSON) under its cookie's hash for `ttl`,
    /// and lists it among theirs (the list lasts as long as their newest session).
    pub async fn put_session(
        &self,
        principal: &str,
        cookie_hash: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ms = ttl.as_millis().max(1) as u64;
        let list = self.keys.sessions_of_key(principal);
        // Not a transaction: the two keys live in different Cluster slots. A session stored
        // but not listed could not be ended by an admin, so it is listed first.
        let _: () = redis::pipe()
            .cmd("SADD")
            .arg(&list)
            .arg(cookie_hash)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&list)
            .arg(ms)
            .ignore()
            .cmd("SET")
            .arg(self.keys.session_key(cookie_hash))
            .arg(value)
            .arg("PX")
            .arg(ms)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The session a cookie's hash names, while it lasts.
    pub async fn session(&self, cookie_hash: &str) -> Result<Option<String>, StoreError> {
        self.get_string(&self.keys.session_key(cookie_hash)).await
    }

    /// Ends a session (signing out), and takes it off `principal`'s list when that is
    /// known; ending one that is gone is no error.
    pub async fn end_session(
        &self,
        principal: Option<&str>,
        cookie_hash: &str,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg(self.keys.session_key(cookie_hash))
            .ignore();
        if let Some(principal) = principal {
            pipe.cmd("SREM")
                .arg(self.keys.sessions_of_key(principal))
                .arg(cookie_hash)
                .ignore();
        }
        let _: () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Ends every session of `principal`; how many there were.
    pub async fn end_sessions_of(&self, principal: &str) -> Result<usize, StoreError> {
        let list = self.keys.sessions_of_key(principal);
        let hashes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&list)
            .query_async(&mut self.conn.clone())
            .await?;
        let mut pipe = redis::pipe();
        for hash in &hashes {
            pipe.cmd("DEL").arg(self.keys.session_key(hash)).ignore();
        }
        pipe.cmd("DEL").arg(&list).ignore();
        let _: () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(hashes.len())
    }

    /// Binds the MCP proxy session whose id hashes to `session_hash` to `principal`, who
    /// opened it, for `ttl` (each use makes it last `ttl` again).
    pub async fn bind_mcp_session(
        &self,
        session_hash: &str,
        principal: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.put_expiring(&self.keys.mcp_session_key(session_hash), principal, ttl)
            .await
    }

    /// The principal an MCP proxy session was opened by, if it is bound; being asked, the
    /// binding lasts `ttl` again (one `GETEX`).
    pub async fn mcp_session_owner(
        &self,
        session_hash: &str,
        ttl: Duration,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("GETEX")
            .arg(self.keys.mcp_session_key(session_hash))
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Forgets whose an MCP proxy session was, once its owner ended it.
    pub async fn unbind_mcp_session(&self, session_hash: &str) -> Result<(), StoreError> {
        let _: () = redis::cmd("DEL")
            .arg(self.keys.mcp_session_key(session_hash))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Whether the MCP client of task `run` answered the elicitation about call `call`.
    pub async fn mcp_elicited(&self, run: &str, call: &str) -> Result<bool, StoreError> {
        Ok(redis::cmd("EXISTS")
            .arg(self.keys.mcp_elicited_key(run, call))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Records that the MCP client of task `run` answered the elicitation about call `call`,
    /// for `ttl`.
    pub async fn mark_mcp_elicited(
        &self,
        run: &str,
        call: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(self.keys.mcp_elicited_key(run, call))
            .arg("1")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Stores whom a sign-in link's token signs in (`value`), for `ttl`.
    pub async fn put_sign_in_token(
        &self,
        token_hash: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.put_expiring(&self.keys.sign_in_token_key(token_hash), value, ttl)
            .await
    }

    /// Whom a sign-in link's token signs in, without using it (the page that shows it).
    pub async fn peek_sign_in_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        self.get_string(&self.keys.sign_in_token_key(token_hash))
            .await
    }

    /// Uses a sign-in link's token up: one `GETDEL`, so of two uses at once only one gets
    /// its value.
    pub async fn spend_sign_in_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("GETDEL")
            .arg(self.keys.sign_in_token_key(token_hash))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Marks an address as mailed a sign-in link for `ttl`; false if it already was, so no
    /// second mail goes out within that time.
    pub async fn throttle_sign_in_mail(
        &self,
        address_hash: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys.sign_in_throttle_key(address_hash))
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.is_some())
    }

    async fn get_string(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("GET")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    async fn put_expiring(&self, key: &str, value: &str, ttl: Duration) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
