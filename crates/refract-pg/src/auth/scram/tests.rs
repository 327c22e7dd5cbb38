//! SCRAM tests: RFC 7677's test vector, a verifier made by PostgreSQL, and both sides against
//! each other.

use super::*;

const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str =
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_verifier() -> ScramVerifier {
    ScramVerifier::from_password("pencil", &B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(), 4096)
}

#[test]
fn rfc7677_client() {
    let mut c = ScramClient::with_nonce("pencil", RFC_CLIENT_NONCE.into());
    assert_eq!(c.client_first_for("user"), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
    assert_eq!(c.server_first_for("user", RFC_SERVER_FIRST.as_bytes()).unwrap(), RFC_CLIENT_FINAL);
    c.server_final(RFC_SERVER_FINAL.as_bytes()).unwrap();
    assert!(c.server_final(b"v=AAAA").is_err());
}

#[test]
fn rfc7677_server() {
    let mut s = ScramServer::with_nonce("user", rfc_verifier(), RFC_SERVER_NONCE.into());
    assert_eq!(s.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap(), RFC_SERVER_FIRST);
    assert_eq!(s.finish(RFC_CLIENT_FINAL.as_bytes()).unwrap(), RFC_SERVER_FINAL);
}

/// `rolpassword` of user `refract`, password `refract`, as PostgreSQL 15.18's initdb stored it.
const PG15_VERIFIER: &str = "SCRAM-SHA-256$4096:mG6WxfVY2s59NGbwLr0NAA==$W895xJ7BaCpJdt6B9mFlEH7Le/VK7s8z5JhJNXWVNUY=:nyHtz0Xlabhuu7MT4ex1WfLjRej0K2i9xMbLRYp7rKM=";

#[test]
fn verifier_made_by_postgres() {
    let v = ScramVerifier::parse(PG15_VERIFIER).unwrap();
    assert_eq!(v.to_string(), PG15_VERIFIER);
    assert_eq!(v, ScramVerifier::from_password("refract", &v.salt, v.iterations));
    assert_ne!(v, ScramVerifier::from_password("Refract", &v.salt, v.iterations));
}

#[test]
fn verifier_text_form() {
    let v = ScramVerifier::generate("refract");
    let text = v.to_string();
    assert!(text.starts_with("SCRAM-SHA-256$4096:"), "{text}");
    assert_eq!(ScramVerifier::parse(&text).unwrap(), v);
    assert_eq!(v, ScramVerifier::from_password("refract", &v.salt, 4096));
    assert!(ScramVerifier::parse("md5abc").is_err());
    assert!(ScramVerifier::parse("SCRAM-SHA-256$0:AAAA$AAAA:AAAA").is_err());
    assert!(ScramVerifier::parse("SCRAM-SHA-256$4096:AAAA$AAAA:AAAA").is_err(), "short keys");
}

fn exchange(client_password: &str, server_password: &str) -> Result<(), Error> {
    let v = ScramVerifier::from_password(server_password, b"salt", 16);
    let mut server = ScramServer::new("u", v);
    let mut client = ScramClient::new(client_password);
    let server_first = server.first(client.client_first().as_bytes())?;
    let client_final = client.server_first(server_first.as_bytes())?;
    let server_final = server.finish(client_final.as_bytes())?;
    client.server_final(server_final.as_bytes())
}

#[test]
fn both_sides_agree() {
    exchange("secret", "secret").unwrap();
    assert_eq!(exchange("wrong", "secret"), Err(Error::AuthFailed { user: "u".into() }));
}

#[test]
fn server_refuses_bad_messages() {
    let first = |m: &[u8]| ScramServer::new("u", rfc_verifier()).first(m);
    assert!(first(b"p=tls-server-end-point,,n=,r=abc").is_err(), "channel binding");
    assert!(first(b"n,,n=,r=").is_err(), "empty nonce");
    assert!(first(b"garbage").is_err());
    assert!(first(b"n,,").is_err());
    let mut s = ScramServer::new("u", rfc_verifier());
    assert!(s.finish(b"c=biws,r=x,p=AAAA").is_err(), "final before first");
    let mut s = ScramServer::with_nonce("u", rfc_verifier(), "S".into());
    s.first(b"y,,n=,r=C").unwrap();
    assert!(s.finish(b"c=biws,r=CS,p=AAAA").is_err(), "binding must echo y,,");
    let mut s = ScramServer::with_nonce("u", rfc_verifier(), "S".into());
    s.first(b"n,,n=,r=C").unwrap();
    assert!(s.finish(b"c=biws,r=XX,p=AAAA").is_err(), "wrong nonce");
    assert!(s.finish(b"c=biws,r=CS,p=AAAA").is_err(), "second final");
}

#[test]
fn client_refuses_bad_server() {
    let mut c = ScramClient::with_nonce("pw", "abc".into());
    assert!(c.server_first(b"r=xyz123,s=AAAA,i=4096").is_err(), "nonce not extended");
    assert!(c.server_first(b"r=abc,s=AAAA,i=4096").is_err(), "nonce not extended at all");
    assert!(c.server_first(b"r=abcd,s=AAAA,i=0").is_err(), "zero iterations");
    assert!(c.server_first(b"r=abcd,s=!!,i=1").is_err(), "bad salt");
    assert!(c.server_final(b"v=AAAA").is_err(), "final before first");
    c.server_first(b"r=abcd,s=AAAA,i=1").unwrap();
    assert!(c.server_final(b"e=invalid-proof").is_err());
}
