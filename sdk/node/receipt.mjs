// Checks countersign's countersignature receipts in a tool written for Node, with nothing but
// `node:crypto`: the receipt is a JWT signed with Ed25519 (`alg: EdDSA`) by a key of the
// gateway's JWK Set (`GET /.well-known/jwks.json`); its claims bind the issuer, the tool, the
// call (sent under the `Idempotency-Key` `RUN:TURN:CALL`), the SHA-256 of the RFC 8785 form of
// the exact input, and an expiry; a tool runs each receipt once. The checks, their order and
// the refusal codes are those of the Rust crate `countersign-receipt` (docs/security.md).

import { createHash, createPublicKey, verify } from "node:crypto";

/** How far clocks may disagree, in seconds. */
export const LEEWAY_SECS = 30;

/** The largest integer a double, and so the RFC 8785 digest, holds exactly. */
const MAX_EXACT_INTEGER = 2n ** 53n - 1n;

/** Why a receipt does not let its call run: `code` is the stable name, as the Rust crate's. */
export class Refusal extends Error {
  constructor(code, message) {
    super(message);
    this.name = "Refusal";
    this.code = code;
  }
}

const refused = (code, message) => new Refusal(code, message);

/**
 * The RFC 8785 (JSON Canonicalization Scheme) form of a JSON value: object members sorted by
 * their names' UTF-16 code units, no whitespace, and strings and numbers written as
 * ECMAScript's JSON.stringify writes them, which is what the scheme is defined by.
 */
export function canonicalize(value) {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) {
      throw new TypeError("RFC 8785 has no form for NaN or infinities");
    }
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) {
    return `[${value.map(canonicalize).join(",")}]`;
  }
  // The default sort compares UTF-16 code units, as the scheme asks.
  const names = Object.keys(value).sort();
  return `{${names.map((n) => `${JSON.stringify(n)}:${canonicalize(value[n])}`).join(",")}}`;
}

/** `sha256:` and the hex SHA-256 of the RFC 8785 form of `input`: a receipt's `input_digest`. */
export function inputDigest(input) {
  return `sha256:${createHash("sha256").update(canonicalize(input), "utf8").digest("hex")}`;
}

/**
 * Whether the JSON text writes an integer (no fraction, no exponent) past ±(2^53 − 1). Read
 * from the text: JSON.parse has already rounded such an integer to a double, so the digest
 * cannot tell it from its neighbour.
 */
export function hasInexactInteger(text) {
  let inString = false;
  for (let i = 0; i < text.length; ) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i += 1;
      else if (c === '"') inString = false;
      i += 1;
      continue;
    }
    if (c === '"') {
      inString = true;
      i += 1;
      continue;
    }
    if (c === "-" || (c >= "0" && c <= "9")) {
      const start = c === "-" ? i + 1 : i;
      let end = start;
      while (end < text.length && text[end] >= "0" && text[end] <= "9") end += 1;
      const integer = ![".", "e", "E"].includes(text[end]);
      const digits = text.slice(start, end);
      if (integer && digits.length >= 16 && BigInt(digits) > MAX_EXACT_INTEGER) return true;
      // The rest of the number (fraction, exponent) is skipped as it comes.
      i = Math.max(end, i + 1);
      continue;
    }
    i += 1;
  }
  return false;
}

/** The `Idempotency-Key` the call a receipt was signed for is sent with: `RUN:TURN:CALL`. */
export function idempotencyKey(claims) {
  return `${claims.run_id}:${claims.turn}:${claims.call_id}`;
}

/**
 * Remembers the receipts a tool ran, in this process only: a receipt sent again after a
 * restart would run again, so a tool that restarts needs a store that outlives it (anything
 * with the same `firstUse`: a file, Redis).
 */
export class MemoryJtis {
  #seen = new Map();

  /**
   * Records `jti` as used by the request with `key` unless it was used before: `first`, or
   * `again` (the same non-empty key: a retry, answered as before), or `reused`. `until` is
   * when the receipt stops verifying (seconds), after which it is forgotten.
   */
  async firstUse(jti, key, until, now = Date.now() / 1000) {
    for (const [seen, entry] of this.#seen) {
      if (entry.until < now) this.#seen.delete(seen);
    }
    const entry = this.#seen.get(jti);
    if (!entry) {
      this.#seen.set(jti, { key, until });
      return "first";
    }
    return key !== "" && entry.key === key ? "again" : "reused";
  }
}

/**
 * The gateway's published keys: a fixed JWK Set, or one fetched from its URL, fetched again
 * when a receipt names a key the copy lacks (at most once per `minIntervalMs`, so forged
 * tokens cannot make the tool hammer the gateway) and when the copy is older than `maxAgeMs`
 * (a copy that old which cannot be refreshed is not used: receipts are uncheckable until a
 * fetch succeeds, rather than checked against keys that may have been withdrawn).
 */
export class Jwks {
  #url;
  #keys;
  #fetchedAt = -Infinity;
  #triedAt = -Infinity;
  #minIntervalMs;
  #maxAgeMs;

  constructor({ url, keys, minIntervalMs = 10_000, maxAgeMs = 300_000 }) {
    this.#url = url;
    this.#keys = keys ? keys.keys : undefined;
    this.#minIntervalMs = minIntervalMs;
    this.#maxAgeMs = maxAgeMs;
  }

  /** The published key named `kid`, or undefined. */
  async find(kid, now = Date.now()) {
    if (!this.#url) return this.#keys.find((k) => k.kid === kid);
    const stale = now - this.#fetchedAt > this.#maxAgeMs;
    const known = this.#keys?.find((k) => k.kid === kid);
    if (known && !stale) return known;
    if (now - this.#triedAt >= this.#minIntervalMs) {
      this.#triedAt = now;
      try {
        const response = await fetch(this.#url, { signal: AbortSignal.timeout(5000) });
        if (!response.ok) throw new Error(`${this.#url} answered ${response.status}`);
        this.#keys = (await response.json()).keys;
        this.#fetchedAt = now;
      } catch (e) {
        if (stale) throw refused("keys_unavailable", `the receipt's keys cannot be fetched now: ${e.message}`);
      }
    } else if (stale) {
      throw refused("keys_unavailable", "the key set is out of date and was fetched without success too recently");
    }
    return this.#keys?.find((k) => k.kid === kid);
  }
}

const base64url = (part) => Buffer.from(part, "base64url");

function decodePart(part, what) {
  try {
    return JSON.parse(base64url(part).toString("utf8"));
  } catch {
    throw refused("malformed", `the receipt is not a JWT this tool can read: its ${what} is not JSON`);
  }
}

/**
 * Checks receipts for one tool service: `jwks` the gateway's keys, `issuer` the gateway's
 * public base URL, `audience` the tool service's own name, `jtis` the receipts it ran.
 */
export class Verifier {
  constructor({ jwks, issuer, audience, jtis = new MemoryJtis() }) {
    Object.assign(this, { jwks, issuer, audience, jtis });
  }

  /**
   * Checks `token`, the receipt of a request for `tool` (its name in the agent file) whose body
   * is the JSON text `body`, sent with `idempotencyKey`. Resolves to `{claims, again}` (`again`:
   * a retry of a request already let through, to be answered as before, running nothing), or
   * rejects with a `Refusal`.
   */
  async check({ token, tool, idempotencyKey: key, body, now = Date.now() }) {
    if (!token) throw refused("missing", "the request carries no receipt");
    const parts = token.split(".");
    if (parts.length !== 3) throw refused("malformed", "the receipt is not a JWT this tool can read");
    const header = decodePart(parts[0], "header");
    if (header.alg !== "EdDSA") throw refused("malformed", `alg ${JSON.stringify(header.alg)} is not EdDSA`);
    if (!header.kid) throw refused("malformed", "the header names no kid");
    const jwk = await this.jwks.find(header.kid, now);
    if (!jwk) throw refused("unknown_key", `the receipt is signed with key ${JSON.stringify(header.kid)}, which is not published`);
    let publicKey;
    try {
      publicKey = createPublicKey({ key: { kty: jwk.kty, crv: jwk.crv, x: jwk.x }, format: "jwk" });
    } catch (e) {
      throw refused("malformed", `the published key ${header.kid} is not an Ed25519 key: ${e.message}`);
    }
    const signed = Buffer.from(`${parts[0]}.${parts[1]}`, "ascii");
    if (!verify(null, signed, publicKey, base64url(parts[2]))) {
      throw refused("bad_signature", "the receipt's signature does not verify");
    }
    const claims = decodePart(parts[1], "payload");
    const nowSecs = now / 1000;
    if (typeof claims.exp !== "number" || typeof claims.iss !== "string" || claims.aud === undefined) {
      throw refused("malformed", "the receipt lacks exp, iss or aud");
    }
    if (claims.exp + LEEWAY_SECS < nowSecs) throw refused("expired", "the receipt has expired");
    if (claims.iss !== this.issuer) throw refused("other_issuer", "the receipt was issued by another gateway");
    const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
    if (!audiences.includes(this.audience) || claims.tool !== tool) {
      throw refused("other_tool", "the receipt is for another tool");
    }
    // Byte for byte: a key naming the call in another form is another request.
    if (key !== idempotencyKey(claims)) {
      throw refused("other_call", "the receipt is for another call than the one this request makes");
    }
    let input;
    try {
      input = JSON.parse(body);
    } catch {
      throw refused("input_changed", "the input is not the one that was approved");
    }
    if (hasInexactInteger(body)) {
      throw refused("inexact_number", "the input holds an integer past 2^53 - 1, which the receipt's digest does not bind exactly");
    }
    if (claims.input_digest !== inputDigest(input)) {
      throw refused("input_changed", "the input is not the one that was approved");
    }
    // Last, so a receipt refused for anything else is not spent; remembered past the last
    // second any instance (with a clock behind this one's) still accepts it.
    let seen;
    try {
      seen = await this.jtis.firstUse(claims.jti, key, claims.exp + 2 * LEEWAY_SECS, nowSecs);
    } catch (e) {
      throw refused("jti_store_unavailable", `the receipt cannot be checked for earlier use now: ${e.message}`);
    }
    if (seen === "reused") throw refused("reused", "the receipt was used before, by another request");
    return { claims, again: seen === "again" };
  }
}
