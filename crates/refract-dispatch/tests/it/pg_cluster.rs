//! Two dispatchers in front of one PostgreSQL cluster, sharing one etcd: a client's
//! CancelRequest cancels its statement whichever dispatcher it reaches; a forwarded request
//! with the wrong key, or a wrong secret, cancels nothing.

use crate::pg_common::{Client, Refract};
use refract_pg::FrontendMessage;
use refract_testkit::{free_port, postgres_section, Etcd, PgCluster, PASSWORD, USER};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

struct Dispatcher {
    addr: SocketAddr,
    cancel: SocketAddr,
    admin: SocketAddr,
    _refract: Refract,
}

fn dispatcher(pg: &PgCluster, etcd: &Etcd, node_id: &str, key_file: &std::path::Path) -> Dispatcher {
    let (port, cancel, admin) = (free_port(), free_port(), free_port());
    let postgres = postgres_section(&format!("127.0.0.1:{port}"), "health_interval_ms = 200");
    let text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:{admin}\"\n[admin]\ninsecure_loopback = true\n\n{postgres}\n\
         [[postgres.server]]\nname = \"primary\"\naddr = \"{}\"\nrole = \"primary\"\n\n\
         [cluster]\netcd = [\"{}\"]\nnode_id = \"{node_id}\"\nlease_ttl_s = 2\n\
         cancel_listen = \"127.0.0.1:{cancel}\"\npeer_key_file = \"{}\"\n",
        pg.primary.addr(),
        etcd.endpoint(),
        key_file.display()
    );
    let refract = Refract::start(&text, port);
    let at = |p| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
    Dispatcher { addr: at(port), cancel: at(cancel), admin: at(admin), _refract: refract }
}

/// `GET /cluster` of `d`.
fn cluster_view(d: &Dispatcher) -> serde_json::Value {
    let mut s = TcpStream::connect(d.admin).unwrap();
    s.write_all(b"GET /cluster HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap()
}

/// `d`'s count of cancel `event`s between dispatchers (`refract_cluster_cancels_total`).
fn cancels(d: &Dispatcher, event: &str) -> u64 {
    let mut s = TcpStream::connect(d.admin).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    let series = format!("refract_cluster_cancels_total{{event=\"{event}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok()).unwrap_or(0)
}

/// Waits until `d` sees two dispatchers, each with its cancel address.
fn wait_for_peers(d: &Dispatcher) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = cluster_view(d);
        let peers = v["dispatchers"].as_array().unwrap();
        if v["etcd"] == "up" && peers.len() == 2 && peers.iter().all(|p| p["info"]["cancel"].is_string()) {
            return;
        }
        assert!(Instant::now() < deadline, "peers never seen: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What two dispatchers stand on (bound first, so dropped after them).
struct Rig {
    _etcd: Etcd,
    _dir: tempfile::TempDir,
    _pg: PgCluster,
}

/// A primary, etcd and two dispatchers sharing `key` (its file's text), each seeing the other.
fn two_dispatchers(key: &str) -> (Rig, Dispatcher, Dispatcher) {
    let pg = PgCluster::start_with_replicas(0).unwrap();
    let etcd = Etcd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("peer.key");
    std::fs::write(&key_file, key).unwrap();
    let d1 = dispatcher(&pg, &etcd, "d1", &key_file);
    let d2 = dispatcher(&pg, &etcd, "d2", &key_file);
    wait_for_peers(&d1);
    wait_for_peers(&d2);
    (Rig { _etcd: etcd, _dir: dir, _pg: pg }, d1, d2)
}

/// Starts `SELECT pg_sleep(10)` on `c` and waits until it runs.
fn sleeping(c: &mut Client) {
    c.send(&[FrontendMessage::Query("SELECT pg_sleep(10)".into())]);
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_cancel_reaching_the_other_dispatcher_cancels_the_statement() {
    let (_rig, d1, d2) = two_dispatchers("a-peer-key-of-at-least-16-bytes\n");
    // Each dispatcher's ids are in its own slot.
    let (a, b) = (Client::connect(d1.addr, USER, PASSWORD).unwrap(), Client::connect(d2.addr, USER, PASSWORD).unwrap());
    assert_ne!(refract_front_pg::slot_of(a.key.0), refract_front_pg::slot_of(b.key.0));
    drop((a, b));

    let mut c = Client::connect(d1.addr, USER, PASSWORD).unwrap();
    sleeping(&mut c);
    let started = Instant::now();
    c.cancel(d2.addr);
    assert_eq!(c.until_ready().code(), Some("57014"));
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());

    // Ten clients on either dispatcher, each cancelled through the other, all within 1 s.
    let mut clients: Vec<(Client, SocketAddr)> = (0..10)
        .map(|i| {
            let (home, other) = if i % 2 == 0 { (&d1, &d2) } else { (&d2, &d1) };
            (Client::connect(home.addr, USER, PASSWORD).unwrap(), other.addr)
        })
        .collect();
    for (c, _) in &mut clients {
        c.send(&[FrontendMessage::Query("SELECT pg_sleep(10)".into())]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    for (c, other) in &clients {
        c.cancel(*other);
    }
    for (c, _) in &mut clients {
        assert_eq!(c.until_ready().code(), Some("57014"));
        assert_eq!(c.query("SELECT 1").value(), "1", "the session goes on");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    // 11 forwarded: 6 by d2 (the first and five), 5 by d1; each received by the other.
    assert_eq!((cancels(&d2, "forwarded"), cancels(&d1, "received")), (6, 6));
    assert_eq!((cancels(&d1, "forwarded"), cancels(&d2, "received")), (5, 5));
    assert_eq!(cancels(&d1, "forward_failed") + cancels(&d2, "forward_failed"), 0);
}

#[test]
fn forged_or_wrong_cancels_change_nothing() {
    let (_rig, d1, d2) = two_dispatchers("a-peer-key-of-at-least-16-bytes");
    let mut c = Client::connect(d1.addr, USER, PASSWORD).unwrap();
    c.send(&[FrontendMessage::Query("SELECT pg_sleep(1.5)".into())]);
    std::thread::sleep(Duration::from_millis(300));
    // A wrong secret, through either dispatcher.
    let mut wrong = c.key.1.to_vec();
    wrong[0] ^= 0xff;
    let genuine = c.key.1.clone();
    c.key.1 = wrong.into();
    c.cancel(d2.addr);
    c.cancel(d1.addr);
    c.key.1 = genuine;
    // A forwarded request sealed with another key, straight to d1's peer listener.
    let mut forged = Vec::from(*b"RFC1");
    forged.extend_from_slice(&c.key.0.to_be_bytes());
    forged.extend_from_slice(&c.key.1);
    forged.extend_from_slice(&0u64.to_be_bytes());
    forged.extend_from_slice(&[0u8; 32]);
    TcpStream::connect(d1.cancel).unwrap().write_all(&forged).unwrap();
    let a = c.until_ready();
    assert_eq!(a.code(), None, "the statement ran to its end: {a:?}");
    assert_eq!(a.rows.len(), 1);
    assert_eq!(cancels(&d1, "refused"), 1, "the forged request, counted");
}
