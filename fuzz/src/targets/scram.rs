//! Targets for refract-pg's authentication messages: SCRAM-SHA-256's client-first, client-final,
//! server-first and server-final parsing on both sides, the SASLInitialResponse and
//! PasswordMessage bodies, and a verifier's text form.

use refract_pg::auth::{decode_password, password_message, SaslInitialResponse};
use refract_pg::auth::{ScramClient, ScramServer, ScramVerifier};
use refract_pg::FrontendMessage;

/// One PBKDF2 round: the fuzzer's verifiers and honest exchanges stay cheap per execution.
const ITERATIONS: u32 = 1;
/// The largest iteration count a fuzzed server-first may ask the client for: the client
/// accepts up to 10 million (PostgreSQL's own ceiling is far above the 4096 it uses), each one
/// a round of PBKDF2, which would read as a hang here and tells nothing about parsing.
const MAX_FUZZ_ITERATIONS: u64 = 64;

/// The input, split at NUL bytes (no SCRAM message holds one), as four messages: client-first
/// and client-final for the server, server-first and server-final for the client. The whole
/// input is also a SASLInitialResponse body, a PasswordMessage body and a verifier, and two of
/// its parts are the passwords of an honest exchange.
pub fn pg_scram(data: &[u8]) {
    let mut parts = data.splitn(4, |b| *b == 0);
    let (a, b, c, d) = (parts.next(), parts.next(), parts.next(), parts.next());
    let (a, b, c, d) = (a.unwrap_or(&[]), b.unwrap_or(&[]), c.unwrap_or(&[]), d.unwrap_or(&[]));
    server_side(a, b);
    client_side(c, d);
    sasl_initial_response(data);
    password(data);
    verifier(data);
    honest_exchange(a, b);
}

/// The server reads a client-first and a client-final; a proof nobody computed never passes,
/// and after the exchange the server takes no further message.
fn server_side(client_first: &[u8], client_final: &[u8]) {
    let verifier = ScramVerifier::from_password("pencil", b"salt", ITERATIONS);
    let mut s = ScramServer::with_nonce("u", verifier, "srvnonce".into());
    if let Ok(server_first) = s.first(client_first) {
        assert!(server_first.starts_with("r="), "server-first {server_first:?}");
        assert!(server_first.ends_with(&format!(",i={ITERATIONS}")), "server-first {server_first:?}");
        let _ = s.finish(client_final);
    }
    assert!(s.first(client_first).is_err(), "a second client-first is refused");
    assert!(s.finish(client_final).is_err(), "a client-final after the end is refused");
}

/// The client reads a server-first (unless it asks for more PBKDF2 rounds than a fuzz
/// execution affords) and a server-final, which never verifies unless it carries the
/// signature of a server that knew the password.
fn client_side(server_first: &[u8], server_final: &[u8]) {
    let mut c = ScramClient::with_nonce("pencil", "clinonce".into());
    assert!(c.server_final(server_final).is_err(), "a server-final before the server-first");
    if iterations(server_first).is_some_and(|i| i > MAX_FUZZ_ITERATIONS) {
        return;
    }
    if let Ok(client_final) = c.server_first(server_first) {
        assert!(client_final.starts_with("c=biws,r=clinonce"), "client-final {client_final:?}");
        assert!(client_final.contains(",p="), "client-final {client_final:?}");
        if !server_final.starts_with(b"v=") {
            assert!(c.server_final(server_final).is_err(), "{server_final:?} is not a signature");
        }
    }
}

/// The `i=` attribute of a server-first, when it is a number.
fn iterations(server_first: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(server_first).ok()?;
    let i = text.split(',').find_map(|a| a.strip_prefix("i="))?;
    Some(i.parse().unwrap_or(u64::MAX)).filter(|_| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

/// A decoded SASLInitialResponse encodes to the bytes it came from.
fn sasl_initial_response(body: &[u8]) {
    if let Ok(r) = SaslInitialResponse::decode(body) {
        let FrontendMessage::AuthResponse(out) = r.to_message() else { panic!("{r:?} is not a p message") };
        assert_eq!(&out[..], body, "{r:?} does not encode to the bytes it came from");
    }
}

/// A decoded PasswordMessage encodes to the bytes it came from.
fn password(body: &[u8]) {
    if let Ok(pw) = decode_password(body) {
        let FrontendMessage::AuthResponse(out) = password_message(&pw) else { panic!("{pw:?}") };
        assert_eq!(&out[..], body, "password {pw:?} does not encode to the bytes it came from");
    }
}

/// A verifier read from text reads back the same from its own text form.
fn verifier(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else { return };
    if let Ok(v) = ScramVerifier::parse(text) {
        let again = ScramVerifier::parse(&v.to_string());
        assert_eq!(again.as_ref(), Ok(&v), "{text:?} → {v} does not read back");
    }
}

/// Client and server with passwords from the input agree exactly when the passwords are equal.
fn honest_exchange(client_password: &[u8], server_password: &[u8]) {
    let (cp, sp) = (String::from_utf8_lossy(client_password), String::from_utf8_lossy(server_password));
    let mut server = ScramServer::with_nonce("u", ScramVerifier::from_password(&sp, b"salt", ITERATIONS), "s".into());
    let mut client = ScramClient::with_nonce(&cp, "c".into());
    let server_first = server.first(client.client_first().as_bytes()).expect("an honest client-first");
    let client_final = client.server_first(server_first.as_bytes()).expect("an honest server-first");
    match server.finish(client_final.as_bytes()) {
        Ok(server_final) => {
            assert_eq!(cp, sp, "different passwords passed");
            client.server_final(server_final.as_bytes()).expect("the server's signature");
        }
        Err(e) => assert_ne!(cp, sp, "equal passwords failed: {e}"),
    }
}
