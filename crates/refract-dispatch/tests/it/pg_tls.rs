//! TLS towards PostgreSQL clients (rustls), against a real primary + replica: psql with
//! `sslmode=require`, the `S` answer to a raw SSLRequest, plaintext refused right after it, and
//! `tls_required` refusing unencrypted clients with `28000`.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{Client, Fixture};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The SSLRequest packet.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// A self-signed certificate and key made with the `openssl` CLI; `None` (and a printed
/// reason) when it is not installed.
fn self_signed(tag: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::temp_dir().join(format!("refract-pg-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    match made {
        Ok(o) if o.status.success() => Some((cert, key)),
        Ok(o) => panic!("openssl req failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipped: the openssl CLI cannot be run: {e}");
            None
        }
    }
}

fn tls_lines(cert: &std::path::Path, key: &std::path::Path) -> String {
    format!("tls_cert = {:?}\ntls_key = {:?}", cert.display().to_string(), key.display().to_string())
}

#[test]
fn tls_is_offered_and_used_by_psql() {
    let Some((cert, key)) = self_signed("offered") else { return };
    let f = Fixture::start(&tls_lines(&cert, &key));
    let replica = f.cluster.replica().port;
    let got = f.psql_conninfo("sslmode=require", &["SELECT pg_is_in_recovery(), inet_server_port()"]).unwrap();
    assert_eq!(got, format!("t|{replica}"), "routing works over TLS");
    let got = f.psql_conninfo("sslmode=require", &["CREATE TABLE t_tls (x int)", "INSERT INTO t_tls VALUES (1)"]);
    assert_eq!(got.unwrap(), "");
    // Plaintext is still accepted without tls_required.
    assert_eq!(f.psql_conninfo("sslmode=disable", &["SELECT 'plain'"]).unwrap(), "plain");

    // A raw SSLRequest gets 'S'; plaintext sent before the handshake is refused (closed).
    let mut c = Client::raw(f.addr());
    c.stream.write_all(&SSL_REQUEST).unwrap();
    let mut answer = [0u8; 1];
    c.stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"S");
    let mut c = Client::raw(f.addr());
    c.stream.write_all(&[&SSL_REQUEST[..], b"\0\0\0\x09\0\x03\0\0\0"].concat()).unwrap();
    let mut got = vec![];
    let _ = c.stream.read_to_end(&mut got);
    assert_eq!(got.first(), Some(&b'S'));
    let (msg, n) = refract_pg::BackendMessage::parse(&got[1..], &Default::default()).unwrap().unwrap();
    let refused = matches!(&msg, refract_pg::BackendMessage::ErrorResponse(e) if e.code() == Some("08P01"));
    assert!(refused && got.len() == 1 + n, "'S', then (like PostgreSQL) a plaintext FATAL and close: {msg:?}");

    // /pg/clients says which clients use TLS.
    let sleeper = {
        let port = f.port;
        std::thread::spawn(move || {
            let mut cmd = Command::new(refract_testkit::tool("psql").unwrap());
            let conninfo = format!("host=127.0.0.1 port={port} user=refract dbname=postgres sslmode=require");
            cmd.arg(conninfo).args(["-XAtq", "-c", "SELECT pg_sleep(3)"]).env("PGPASSWORD", "refract");
            cmd.output().unwrap()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clients = f.admin_json("/pg/clients");
        if clients.as_array().unwrap().iter().any(|c| c["tls"] == true && c["state"] == "active") {
            break;
        }
        assert!(Instant::now() < deadline, "no active TLS client in {clients}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sleeper.join().unwrap().status.success());
    let _ = std::fs::remove_dir_all(cert.parent().unwrap());
}

#[test]
fn tls_required_refuses_plaintext_clients() {
    let Some((cert, key)) = self_signed("required") else { return };
    let f = Fixture::start(&format!("{}\ntls_required = true", tls_lines(&cert, &key)));
    let refused = f.psql_conninfo("sslmode=disable", &["SELECT 1"]).unwrap_err();
    assert!(refused.contains("TLS is required"), "{refused}");
    let err = Client::connect(f.addr(), refract_testkit::USER, refract_testkit::PASSWORD).err().unwrap();
    assert_eq!(err.code(), Some("28000"));
    assert_eq!(f.psql_conninfo("sslmode=require", &["SELECT 'encrypted'"]).unwrap(), "encrypted");
    // libpq's default (prefer) tries TLS first, so it gets in too.
    assert_eq!(f.psql_conninfo("", &["SELECT 'preferred'"]).unwrap(), "preferred");
    let _ = std::fs::remove_dir_all(cert.parent().unwrap());
}
