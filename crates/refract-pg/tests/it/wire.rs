//! The codec and authentication against a real PostgreSQL 15 server: refract's client side logs
//! in with SCRAM (and md5), runs simple and extended queries, and reads errors with SQLSTATE.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use refract_pg::auth::{ClientAuth, ClientStep, ScramVerifier};
use refract_pg::frontend::{Bind, Target};
use refract_pg::startup::PROTOCOL_3_0;
use refract_pg::{BackendMessage, FrontendMessage, Limits, Startup, StartupPacket, TxStatus};
use refract_testkit::{PgCluster, PgServer, DATABASE, PASSWORD, USER};

/// A minimal blocking client built only from refract-pg's codec.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    fn connect(server: &PgServer, user: &str, password: &str) -> Result<Conn, refract_pg::Error> {
        let stream = TcpStream::connect(server.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut conn = Conn { stream, buf: BytesMut::new() };
        let params = vec![("user".into(), user.into()), ("database".into(), DATABASE.into())];
        let mut out = BytesMut::new();
        StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params }).encode(&mut out);
        conn.stream.write_all(&out).unwrap();
        conn.login(user, password)?;
        Ok(conn)
    }

    fn login(&mut self, user: &str, password: &str) -> Result<(), refract_pg::Error> {
        let mut auth = ClientAuth::new(user, Some(password));
        loop {
            match self.recv() {
                BackendMessage::Authentication(a) => match auth.step(&a)? {
                    ClientStep::Send(bytes) => self.stream.write_all(&bytes).unwrap(),
                    ClientStep::Wait => {}
                    ClientStep::Authenticated => break,
                },
                BackendMessage::ErrorResponse(e) => {
                    return Err(refract_pg::Error::AuthFailed { user: format!("{user}: {:?}", e.message()) })
                }
                other => panic!("during auth: {other:?}"),
            }
        }
        self.until_ready();
        Ok(())
    }

    fn recv(&mut self) -> BackendMessage {
        loop {
            if let Some((msg, n)) = BackendMessage::parse(&self.buf, &Limits::default()).unwrap() {
                let _ = self.buf.split_to(n);
                return msg;
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, msgs: &[FrontendMessage]) {
        let mut out = BytesMut::new();
        msgs.iter().for_each(|m| m.encode(&mut out));
        self.stream.write_all(&out).unwrap();
    }

    /// Everything up to and including ReadyForQuery.
    fn until_ready(&mut self) -> (Vec<BackendMessage>, TxStatus) {
        let mut got = Vec::new();
        loop {
            match self.recv() {
                BackendMessage::ReadyForQuery(s) => return (got, s),
                m => got.push(m),
            }
        }
    }

    fn query(&mut self, sql: &str) -> (Vec<BackendMessage>, TxStatus) {
        self.send(&[FrontendMessage::Query(sql.into())]);
        self.until_ready()
    }
}

fn rows(msgs: &[BackendMessage]) -> Vec<Vec<Option<String>>> {
    let text = |v: &Option<Bytes>| v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    msgs.iter()
        .filter_map(|m| match m {
            BackendMessage::DataRow(vals) => Some(vals.iter().map(text).collect()),
            _ => None,
        })
        .collect()
}

#[test]
fn against_a_real_server() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    let p = &cluster.primary;
    let mut c = Conn::connect(p, USER, PASSWORD).unwrap();
    simple_queries(&mut c);
    extended_queries(&mut c);
    errors_and_transactions(&mut c);
    copy_out(&mut c);
    c.send(&[FrontendMessage::Terminate]);

    let wrong = Conn::connect(p, USER, "wrong").err().unwrap();
    assert!(wrong.to_string().contains("password authentication failed"), "{wrong}");

    // The verifier PostgreSQL stored is one refract derives from the same password.
    let stored = cluster.psql(p, "SELECT rolpassword FROM pg_authid WHERE rolname = 'refract'").unwrap();
    let v = ScramVerifier::parse(&stored).unwrap();
    assert_eq!(v, ScramVerifier::from_password(PASSWORD, &v.salt, v.iterations));

    md5_login(&cluster);
}

fn simple_queries(c: &mut Conn) {
    let (msgs, status) = c.query("SELECT 1 AS one, NULL::text AS nothing, 'x' || 'y'");
    assert_eq!(status, TxStatus::Idle);
    let BackendMessage::RowDescription(fields) = &msgs[0] else { panic!("{msgs:?}") };
    assert_eq!(fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["one", "nothing", "?column?"]);
    assert_eq!(fields[0].type_oid, 23);
    assert_eq!(rows(&msgs), vec![vec![Some("1".into()), None, Some("xy".into())]]);
    assert_eq!(msgs.last(), Some(&BackendMessage::CommandComplete("SELECT 1".into())));
    let (msgs, _) = c.query("");
    assert_eq!(msgs, vec![BackendMessage::EmptyQueryResponse]);
    let (msgs, _) = c.query("CREATE TABLE w (id int, v text); INSERT INTO w VALUES (1, 'a'), (2, 'b')");
    assert!(msgs.contains(&BackendMessage::CommandComplete("INSERT 0 2".into())), "{msgs:?}");
}

fn extended_queries(c: &mut Conn) {
    let bind = Bind {
        portal: String::new(),
        statement: "by_id".into(),
        param_formats: vec![],
        params: vec![Some(Bytes::from_static(b"2"))],
        result_formats: vec![],
    };
    c.send(&[
        FrontendMessage::Parse {
            name: "by_id".into(),
            query: "SELECT v FROM w WHERE id = $1".into(),
            param_types: vec![],
        },
        FrontendMessage::Describe(Target::Statement, "by_id".into()),
        FrontendMessage::Bind(bind),
        FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
        FrontendMessage::Close(Target::Statement, "by_id".into()),
        FrontendMessage::Sync,
    ]);
    let (msgs, status) = c.until_ready();
    assert_eq!(status, TxStatus::Idle);
    assert_eq!(msgs[0], BackendMessage::ParseComplete);
    assert_eq!(msgs[1], BackendMessage::ParameterDescription(vec![23]));
    assert!(matches!(msgs[2], BackendMessage::RowDescription(_)));
    assert_eq!(msgs[3], BackendMessage::BindComplete);
    assert_eq!(rows(&msgs), vec![vec![Some("b".into())]]);
    assert_eq!(msgs[5..], [BackendMessage::CommandComplete("SELECT 1".into()), BackendMessage::CloseComplete]);
}

fn errors_and_transactions(c: &mut Conn) {
    let (msgs, status) = c.query("SELECT * FROM no_such_table");
    let BackendMessage::ErrorResponse(e) = &msgs[0] else { panic!("{msgs:?}") };
    assert_eq!((e.code(), e.severity()), (Some("42P01"), Some("ERROR")));
    assert_eq!(status, TxStatus::Idle);
    assert_eq!(c.query("BEGIN").1, TxStatus::InTransaction);
    assert_eq!(c.query("SELEC").1, TxStatus::Failed);
    assert_eq!(c.query("COMMIT"), (vec![BackendMessage::CommandComplete("ROLLBACK".into())], TxStatus::Idle));
    let (msgs, _) = c.query("DO $$ BEGIN RAISE NOTICE 'hi there'; END $$");
    let BackendMessage::NoticeResponse(n) = &msgs[0] else { panic!("{msgs:?}") };
    assert_eq!(n.message(), Some("hi there"));
    let (msgs, _) = c.query("SET application_name = 'refract-test'");
    assert!(msgs
        .contains(&BackendMessage::ParameterStatus { name: "application_name".into(), value: "refract-test".into() }));
}

fn copy_out(c: &mut Conn) {
    let (msgs, _) = c.query("COPY (SELECT id, v FROM w ORDER BY id) TO STDOUT");
    assert!(matches!(&msgs[0], BackendMessage::CopyOutResponse(r) if r.column_formats.len() == 2), "{msgs:?}");
    assert_eq!(msgs[1], BackendMessage::CopyData(Bytes::from_static(b"1\ta\n")));
    assert_eq!(msgs[2], BackendMessage::CopyData(Bytes::from_static(b"2\tb\n")));
    assert_eq!(msgs[3..], [BackendMessage::CopyDone, BackendMessage::CommandComplete("COPY 2".into())]);
}

fn md5_login(cluster: &PgCluster) {
    let p = &cluster.primary;
    let hba = p.data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all md5user 127.0.0.1/32 md5\n{old}")).unwrap();
    cluster
        .psql(p, "SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN PASSWORD 'md5pw'; SELECT pg_reload_conf()")
        .unwrap();
    let mut c = Conn::connect(p, "md5user", "md5pw").unwrap();
    assert_eq!(rows(&c.query("SELECT current_user").0), vec![vec![Some("md5user".into())]]);
    assert!(Conn::connect(p, "md5user", "nope").is_err());
}
