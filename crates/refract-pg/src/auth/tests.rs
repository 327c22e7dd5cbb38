//! Both state machines against each other, through encoded bytes as on the wire.

use super::*;
use crate::backend::{Authentication, BackendMessage};
use crate::frame::Limits;

/// Runs a login; returns the server's verdict.
fn login(method: AuthMethod, credential: Option<&Credential>, password: Option<&str>) -> Result<(), Error> {
    let (mut server, mut step) = ServerAuth::start("alice", method, credential);
    let mut client = ClientAuth::new("alice", password);
    loop {
        let bytes = match step {
            ServerStep::Continue(b) => b,
            ServerStep::Authenticated(b) => {
                feed_client(&mut client, &b)?;
                assert_eq!(client.step(&Authentication::Ok)?, ClientStep::Authenticated);
                return Ok(());
            }
        };
        let ClientStep::Send(answer) = feed_client(&mut client, &bytes)? else { panic!("client must answer") };
        let (msg, n) = FrontendMessage::parse(&answer, &Limits::default())?.unwrap();
        assert_eq!(n, answer.len());
        step = server.step(&msg)?;
    }
}

fn feed_client(client: &mut ClientAuth, bytes: &[u8]) -> Result<ClientStep, Error> {
    if bytes.is_empty() {
        return Ok(ClientStep::Wait);
    }
    let (msg, _) = BackendMessage::parse(bytes, &Limits::default())?.unwrap();
    let BackendMessage::Authentication(a) = msg else { panic!("{msg:?}") };
    client.step(&a)
}

fn failed() -> Result<(), Error> {
    Err(Error::AuthFailed { user: "alice".into() })
}

#[test]
fn scram_login() {
    let cred = Credential::from_password("alice", "s3cret");
    login(AuthMethod::ScramSha256, Some(&cred), Some("s3cret")).unwrap();
    assert_eq!(login(AuthMethod::ScramSha256, Some(&cred), Some("wrong")), failed());
}

#[test]
fn scram_against_stored_verifier() {
    let text = ScramVerifier::from_password("s3cret", b"0123456789abcdef", 4096).to_string();
    let cred = Credential::parse("alice", &text).unwrap();
    assert!(cred.md5.is_none());
    login(AuthMethod::ScramSha256, Some(&cred), Some("s3cret")).unwrap();
    assert_eq!(login(AuthMethod::Md5, Some(&cred), Some("s3cret")), failed(), "no md5 hash stored");
}

#[test]
fn md5_login() {
    let cred = Credential::from_password("alice", "s3cret");
    login(AuthMethod::Md5, Some(&cred), Some("s3cret")).unwrap();
    assert_eq!(login(AuthMethod::Md5, Some(&cred), Some("nope")), failed());
    let hashed = Credential::parse("alice", &md5::stored_hash("alice", "s3cret")).unwrap();
    assert!(hashed.scram.is_none());
    login(AuthMethod::Md5, Some(&hashed), Some("s3cret")).unwrap();
    assert_eq!(login(AuthMethod::ScramSha256, Some(&hashed), Some("s3cret")), failed(), "no SCRAM verifier");
}

#[test]
fn trust_and_unknown_users() {
    login(AuthMethod::Trust, None, None).unwrap();
    assert_eq!(login(AuthMethod::ScramSha256, None, Some("x")), failed());
    assert_eq!(login(AuthMethod::Md5, None, Some("x")), failed());
}

#[test]
fn client_without_password() {
    let cred = Credential::from_password("alice", "s3cret");
    assert!(matches!(login(AuthMethod::ScramSha256, Some(&cred), None), Err(Error::UnsupportedAuth(_))));
}

#[test]
fn client_handles_cleartext_and_refuses_unknown_methods() {
    let mut c = ClientAuth::new("alice", Some("pw"));
    let ClientStep::Send(b) = c.step(&Authentication::CleartextPassword).unwrap() else { panic!() };
    assert_eq!(&b[..], b"p\0\0\0\x07pw\0");
    assert!(c.step(&Authentication::Other { code: 7, data: Bytes::new() }).is_err(), "GSS");
    assert!(c.step(&Authentication::Sasl { mechanisms: vec!["SCRAM-SHA-256-PLUS".into()] }).is_err());
}

#[test]
fn client_refuses_ok_before_scram_final() {
    let mut c = ClientAuth::new("alice", Some("pw"));
    c.step(&Authentication::Sasl { mechanisms: vec![scram::MECHANISM.into()] }).unwrap();
    assert!(c.step(&Authentication::Ok).is_err());
}

#[test]
fn server_refuses_wrong_messages() {
    let cred = Credential::from_password("alice", "pw");
    let (mut s, _) = ServerAuth::start("alice", AuthMethod::ScramSha256, Some(&cred));
    assert!(s.step(&FrontendMessage::Query("select 1".into())).is_err());
    let (mut s, _) = ServerAuth::start("alice", AuthMethod::ScramSha256, Some(&cred));
    let other = SaslInitialResponse { mechanism: "PLAIN".into(), data: None }.to_message();
    assert!(s.step(&other).is_err());
    assert!(SaslInitialResponse::decode(b"SCRAM-SHA-256\0\0\0").is_err(), "truncated length");
}
