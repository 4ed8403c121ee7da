// The Node receipt checker: its canonical form and digest against RFC 8785's own examples,
// every refusal on receipts signed here, and (when COUNTERSIGN_RECEIPT_CASE names a file, as
// the Rust suite's `receipts_node` test writes it) a receipt the gateway signed.

import assert from "node:assert/strict";
import { generateKeyPairSync, sign } from "node:crypto";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  Jwks,
  MemoryJtis,
  Verifier,
  canonicalize,
  hasInexactInteger,
  idempotencyKey,
  inputDigest,
} from "../receipt.mjs";

test("the canonical form sorts members by UTF-16 code units and writes numbers as ECMAScript does", () => {
  // RFC 8785, section 3.2.3's sorting example, and numbers of its appendix B.
  const sorting = JSON.parse(
    '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control","\\u00f6":"Latin Small Letter O With Diaeresis"}',
  );
  assert.equal(
    canonicalize(sorting),
    '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
  );
  assert.equal(
    canonicalize({ numbers: [333333333.33333329, 1e30, 4.5, 2e-3, 0.000000000000000000000000001, -0] }),
    '{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27,0]}',
  );
  assert.equal(canonicalize({ b: [true, null, "\u2028\n"], a: {} }), '{"a":{},"b":[true,null,"\u2028\\n"]}');
  assert.throws(() => canonicalize({ a: Number.NaN }));
});

test("integers past 2^53 - 1 are found in the text, not in strings, fractions or exponents", () => {
  for (const body of [
    '{"a": 9007199254740992}',
    '{"a": -9007199254740993}',
    '[1, {"b": 18446744073709551616}]',
  ]) {
    assert.ok(hasInexactInteger(body), body);
  }
  for (const body of [
    '{"a": 9007199254740991, "b": -9007199254740991}',
    '{"a": 1e300, "b": 90071992547409930.5, "c": 9007199254740993e0}',
    '{"a": "9007199254740993", "b\\"": "x\\"9007199254740993"}',
  ]) {
    assert.ok(!hasInexactInteger(body), body);
  }
});

/** A gateway of this test: an Ed25519 key published under `kid`, and receipts it signs. */
function gateway(kid = "k1") {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const jwk = { ...publicKey.export({ format: "jwk" }), kid, alg: "EdDSA", use: "sig" };
  const signWith = (claims, header = { alg: "EdDSA", kid, typ: "JWT" }) => {
    const part = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
    const signing = `${part(header)}.${part(claims)}`;
    return `${signing}.${sign(null, Buffer.from(signing), privateKey).toString("base64url")}`;
  };
  return { jwks: { keys: [jwk] }, sign: signWith };
}

const INPUT = { to: "ana@example.com", body: "Hello", amount: 40 };
const BODY = JSON.stringify(INPUT);
const NOW = Date.UTC(2026, 11, 4);

function claims(overrides = {}) {
  return {
    iss: "https://gateway.example",
    aud: "send_email",
    iat: NOW / 1000,
    exp: NOW / 1000 + 600,
    jti: "rcpt_1",
    run_id: "run_1",
    turn: 1,
    call_id: "door_send_email",
    tool: "send_email",
    input_digest: inputDigest(INPUT),
    action: "approve",
    decided_by: ["you"],
    policy_version: "v1",
    ...overrides,
  };
}

function verifier(jwks) {
  return new Verifier({
    jwks: new Jwks({ keys: jwks }),
    issuer: "https://gateway.example",
    audience: "send_email",
  });
}

test("a receipt runs once: the same request again is a retry, another request is refused", async () => {
  const gw = gateway();
  const check = verifier(gw.jwks);
  const token = gw.sign(claims());
  const request = { token, tool: "send_email", idempotencyKey: "run_1:1:door_send_email", body: BODY, now: NOW };
  const first = await check.check(request);
  assert.equal(first.again, false);
  assert.equal(first.claims.jti, "rcpt_1");
  assert.equal((await check.check(request)).again, true);
  await assert.rejects(check.check({ ...request, idempotencyKey: "" }), { code: "other_call" });
  // A store shared by another request under the same key's receipt: reused.
  const jtis = new MemoryJtis();
  assert.equal(await jtis.firstUse("j", "a", NOW / 1000 + 60, NOW / 1000), "first");
  assert.equal(await jtis.firstUse("j", "b", NOW / 1000 + 60, NOW / 1000), "reused");
  assert.equal(await jtis.firstUse("j", "", NOW / 1000 + 60, NOW / 1000), "reused");
});

test("each reason a receipt may not run is refused with its code", async () => {
  const gw = gateway();
  const other = gateway();
  const check = verifier(gw.jwks);
  const request = (token, more = {}) => ({
    token,
    tool: "send_email",
    idempotencyKey: "run_1:1:door_send_email",
    body: BODY,
    now: NOW,
    ...more,
  });
  const cases = [
    ["missing", request(undefined)],
    ["malformed", request("not-a-jwt")],
    ["malformed", request(gw.sign(claims(), { alg: "HS256", kid: "k1" }))],
    ["unknown_key", request(gateway("k9").sign(claims()))],
    ["bad_signature", request(other.sign(claims()))],
    ["expired", request(gw.sign(claims({ exp: NOW / 1000 - 31 })))],
    ["other_issuer", request(gw.sign(claims({ iss: "https://elsewhere.example" })))],
    ["other_tool", request(gw.sign(claims({ aud: "issue_refund" })))],
    ["other_tool", request(gw.sign(claims()), { tool: "issue_refund" })],
    ["other_call", request(gw.sign(claims()), { idempotencyKey: "run_1:01:door_send_email" })],
    ["input_changed", request(gw.sign(claims()), { body: JSON.stringify({ ...INPUT, amount: 41 }) })],
    ["input_changed", request(gw.sign(claims()), { body: "not json" })],
    [
      "inexact_number",
      request(gw.sign(claims({ input_digest: inputDigest({ n: 9007199254740993 }) })), {
        body: '{"n": 9007199254740993}',
      }),
    ],
  ];
  for (const [code, req] of cases) {
    await assert.rejects(check.check(req), { code }, code);
  }
  // Within the clock leeway, an expiry has not passed yet.
  const late = await check.check(request(gw.sign(claims({ exp: NOW / 1000 - 29, jti: "late" }))));
  assert.equal(late.claims.jti, "late");
  // A store that cannot answer does not let the receipt through.
  const broken = new Verifier({
    jwks: new Jwks({ keys: gw.jwks }),
    issuer: "https://gateway.example",
    audience: "send_email",
    jtis: { firstUse: async () => { throw new Error("down"); } },
  });
  await assert.rejects(broken.check(request(gw.sign(claims()))), { code: "jti_store_unavailable" });
});

const gatewayCase = process.env.COUNTERSIGN_RECEIPT_CASE;

test("a receipt the gateway signed is accepted for its call and input, once", { skip: !gatewayCase && "COUNTERSIGN_RECEIPT_CASE is not set (the Rust suite's receipts_node test sets it)" }, async () => {
  const signed = JSON.parse(readFileSync(gatewayCase, "utf8"));
  const check = new Verifier({
    jwks: new Jwks({ url: signed.jwks_url }),
    issuer: signed.issuer,
    audience: signed.audience,
  });
  const body = JSON.stringify(signed.input);
  const key = signed.idempotency_key;
  const { claims: got, again } = await check.check({ token: signed.receipt, tool: signed.tool, idempotencyKey: key, body });
  assert.equal(again, false);
  assert.equal(idempotencyKey(got), key);
  assert.equal(got.input_digest, inputDigest(signed.input));
  await assert.rejects(
    check.check({ token: signed.receipt, tool: signed.tool, idempotencyKey: key, body: JSON.stringify({ ...signed.input, extra: 1 }) }),
    { code: "input_changed" },
  );
  await assert.rejects(
    check.check({ token: signed.receipt, tool: signed.tool, idempotencyKey: `${key}x`, body }),
    { code: "other_call" },
  );
  assert.equal((await check.check({ token: signed.receipt, tool: signed.tool, idempotencyKey: key, body })).again, true);
});
