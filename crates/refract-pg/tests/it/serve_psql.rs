//! refract's server-side authentication against a real libpq client: psql logs into a tiny
//! server built from `ServerAuth` and the reply encoders, with SCRAM-SHA-256 and md5.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::thread;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use refract_pg::auth::{AuthMethod, Credential, ServerAuth, ServerStep};
use refract_pg::backend::FieldDescription;
use refract_pg::notice::sqlstate;
use refract_pg::{reply, BackendMessage, FrontendMessage, Limits, StartupPacket, TxStatus};

struct Peer {
    stream: TcpStream,
    buf: BytesMut,
}

impl Peer {
    fn fill(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).unwrap();
        assert!(n > 0, "client went away");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    fn startup(&mut self) -> String {
        loop {
            match StartupPacket::parse(&self.buf, &Limits::default()).unwrap() {
                None => self.fill(),
                Some((packet, n)) => {
                    let _ = self.buf.split_to(n);
                    match packet {
                        StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                            self.stream.write_all(reply::REFUSE_ENCRYPTION).unwrap()
                        }
                        StartupPacket::Startup(s) => return s.user().unwrap().to_owned(),
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
    }

    fn recv(&mut self) -> FrontendMessage {
        loop {
            if let Some((msg, n)) = FrontendMessage::parse(&self.buf, &Limits::default()).unwrap() {
                let _ = self.buf.split_to(n);
                return msg;
            }
            self.fill();
        }
    }
}

/// Serves one connection: authenticates, answers one query with `42`, and waits for Terminate.
fn serve(stream: TcpStream, method: AuthMethod, credential: Credential) {
    let mut peer = Peer { stream, buf: BytesMut::new() };
    let user = peer.startup();
    let (mut auth, mut step) = ServerAuth::start(&user, method, Some(&credential));
    loop {
        match step {
            ServerStep::Continue(bytes) => peer.stream.write_all(&bytes).unwrap(),
            ServerStep::Authenticated(bytes) => {
                peer.stream.write_all(&bytes).unwrap();
                break;
            }
        }
        step = match auth.step(&peer.recv()) {
            Ok(s) => s,
            Err(e) => return peer.stream.write_all(&reply::fatal(sqlstate::INVALID_PASSWORD, &e.to_string())).unwrap(),
        };
    }
    let params = [("server_version", "15.0"), ("client_encoding", "UTF8"), ("standard_conforming_strings", "on")];
    let params: Vec<_> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    peer.stream.write_all(&reply::login_complete(&params, 7, [1, 2, 3, 4])).unwrap();
    assert!(matches!(peer.recv(), FrontendMessage::Query(_)));
    let field = FieldDescription {
        name: "answer".into(),
        table_oid: 0,
        column: 0,
        type_oid: 25,
        type_size: -1,
        type_modifier: -1,
        format: 0,
    };
    let mut out = BytesMut::new();
    BackendMessage::RowDescription(vec![field]).encode(&mut out);
    BackendMessage::DataRow(vec![Some(Bytes::from_static(b"42"))]).encode(&mut out);
    BackendMessage::CommandComplete("SELECT 1".into()).encode(&mut out);
    out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
    peer.stream.write_all(&out).unwrap();
    assert_eq!(peer.recv(), FrontendMessage::Terminate);
}

/// Runs psql against a one-shot server; returns psql's stdout or stderr.
fn psql(method: AuthMethod, credential: Credential, password: &str) -> Result<String, String> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let server = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        serve(stream, method, credential);
    });
    let out = Command::new(refract_testkit::tool("psql").unwrap())
        .args(["-h", "127.0.0.1", "-p", &port, "-U", "alice", "-d", "db", "-XAtq", "-c", "SELECT 'whatever'"])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "prefer")
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .unwrap();
    server.join().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

#[test]
fn psql_logs_in_with_scram() {
    let cred = Credential::from_password("alice", "s3cret");
    assert_eq!(psql(AuthMethod::ScramSha256, cred.clone(), "s3cret"), Ok("42".into()));
    let err = psql(AuthMethod::ScramSha256, cred, "wrong").unwrap_err();
    assert!(err.contains("password authentication failed for user \"alice\""), "{err}");
}

#[test]
fn psql_logs_in_with_md5() {
    let cred = Credential::from_password("alice", "s3cret");
    assert_eq!(psql(AuthMethod::Md5, cred.clone(), "s3cret"), Ok("42".into()));
    assert!(psql(AuthMethod::Md5, cred, "wrong").is_err());
}
