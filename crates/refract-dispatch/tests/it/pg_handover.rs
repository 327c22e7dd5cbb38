//! The PostgreSQL result hand-over on one host (docs/handover.md, "PostgreSQL"): refract reaches
//! the primary through an agent (in this process, as `refract agent` runs it), hybrid mode with a
//! 64 KiB threshold. A large result is written to the client by the agent (counted in
//! `refract_handover_total{result="ok"}`) and reads exactly as it does straight from
//! PostgreSQL: the same messages in the same order, the same rows, the same error and the same
//! transaction status; the session goes on after it.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::agent::{self, Agent};
use pg_common::{Answer, Client, Refract};
use refract_pg::frontend::Bind;
use refract_pg::FrontendMessage;
use refract_testkit::{PgCluster, PASSWORD, USER};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// refract with hybrid hand-over in front of the cluster's primary, through an agent.
struct Hybrid {
    /// Declared first: stopped before the agent and the cluster.
    _refract: Refract,
    port: u16,
    admin: u16,
    agent: Agent,
    cluster: PgCluster,
}

impl Hybrid {
    fn start() -> Hybrid {
        Hybrid::with("")
    }

    /// With `extra` lines in `[postgres]`.
    fn with(extra: &str) -> Hybrid {
        let cluster = PgCluster::start().expect("PostgreSQL test cluster");
        let agent = Agent::start(cluster.primary.addr(), agent::sock_path("handover"));
        let servers = pg_common::server_tables(&[("primary", cluster.primary.addr(), Some(&agent))], 65536);
        let (port, admin, _refract) = pg_common::launch("", extra, &servers);
        Hybrid { _refract, port, admin, agent, cluster }
    }

    fn client(&self) -> Client {
        Client::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)), USER, PASSWORD).unwrap()
    }

    fn direct(&self) -> Client {
        Client::connect(self.cluster.primary.addr(), USER, PASSWORD).unwrap()
    }

    /// Hand-overs that succeeded so far.
    fn handed_over(&self) -> u64 {
        agent::handed_over(self.admin)
    }

    /// Bytes the agent wrote to clients so far (`refract_bytes_direct_total`).
    fn sent_direct(&self) -> u64 {
        let m = agent::metrics(self.admin);
        let line =
            m.lines().find(|l| l.starts_with("refract_bytes_direct_total{backend=\"primary\",front=\"postgres\"}"));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(0.0) as u64
    }
}

/// The size in bytes of `sql`'s whole answer, RowDescription to ReadyForQuery.
fn answer_bytes(c: &mut Client, sql: &str) -> u64 {
    c.send(&[FrontendMessage::Query(sql.into())]);
    let mut out = bytes::BytesMut::new();
    while let Some(m) = c.recv() {
        m.encode(&mut out);
        if matches!(m, refract_pg::BackendMessage::ReadyForQuery(_)) {
            break;
        }
    }
    out.len() as u64
}

/// Same messages, rows, error and status.
fn same(what: &str, through: &Answer, direct: &Answer) {
    let error = through.error.as_ref().map(|e| format!("{e:?}"));
    let head = |a: &Answer| a.tags.chars().take(40).collect::<String>();
    assert!(
        through.tags == direct.tags,
        "{what}: message types differ: {} ({} messages) vs {} ({}); error {error:?}",
        head(through),
        through.tags.len(),
        head(direct),
        direct.tags.len()
    );
    assert_eq!(through.rows, direct.rows, "{what}: rows differ");
    assert_eq!(through.code(), direct.code(), "{what}: errors differ");
    assert_eq!(through.status, direct.status, "{what}: status differs");
}

/// About 900 KB of rows.
const LARGE: &str = "select n, md5(n::text) from generate_series(1, 20000) n";

#[test]
fn large_results_are_handed_over_and_read_as_from_postgresql() {
    let h = Hybrid::start();
    let (mut c, mut d) = (h.client(), h.direct());
    let before = h.handed_over();

    // Simple query, then a small one on the same session (the socket came back).
    same("simple query", &c.query(LARGE), &d.query(LARGE));
    assert!(h.handed_over() > before, "the large result was handed over");
    same("small query after", &c.query("select 1"), &d.query("select 1"));

    // One row above the threshold: the cut is before the row that reaches it, so even a
    // one-row result goes straight to the client; and before the RowDescription that came with
    // it, so the agent writes the whole answer (refract relayed none of it).
    let one_row = "select repeat('x', 200000)";
    let (before_one, sent_before) = (h.handed_over(), h.sent_direct());
    same("one large row", &c.query(one_row), &d.query(one_row));
    assert_eq!(h.handed_over() - before_one, 1, "the one-row result was handed over");
    let whole = answer_bytes(&mut d, one_row);
    // Counted at the hand-back, which may come after the client read the answer's last byte.
    pg_common::until("the hand-over's bytes counted", || h.sent_direct() >= sent_before + whole);
    assert_eq!(h.sent_direct() - sent_before, whole, "the agent wrote the whole answer");

    // Several statements, the large one in the middle.
    let multi = format!("select 1; {LARGE}; select 2");
    same("multi-statement query", &c.query(&multi), &d.query(&multi));

    // An error in the middle of a large result.
    let failing = "select n, 1/(n - 15000) from generate_series(1, 20000) n";
    same("error mid-result", &c.query(failing), &d.query(failing));
    same("after the error", &c.query("select 3"), &d.query("select 3"));

    // Inside a transaction: the transaction's own connection, status kept.
    same("begin", &c.query("begin"), &d.query("begin"));
    same("read in a transaction", &c.query(LARGE), &d.query(LARGE));
    same("commit", &c.query("commit"), &d.query("commit"));

    // COPY TO STDOUT.
    let copy = format!("copy ({LARGE}) to stdout with (format csv)");
    same("copy out", &c.query(&copy), &d.query(&copy));

    // Extended protocol, binary results, pipelined with a second batch behind it.
    let batch = |c: &mut Client| {
        c.send(&[
            FrontendMessage::Parse { name: String::new(), query: LARGE.into(), param_types: vec![] },
            FrontendMessage::Bind(Bind {
                portal: String::new(),
                statement: String::new(),
                param_formats: vec![],
                params: vec![],
                result_formats: vec![1],
            }),
            FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
            FrontendMessage::Sync,
            FrontendMessage::Query("select 4".into()),
        ]);
        (c.until_ready(), c.until_ready())
    };
    let (through, direct) = (batch(&mut c), batch(&mut d));
    same("extended, binary", &through.0, &direct.0);
    same("pipelined behind it", &through.1, &direct.1);

    let handed = h.handed_over() - before;
    assert!(handed >= 6, "{handed} hand-overs, expected one per large result");
}

/// A result far larger than the tests read (about 450 MB): the agent is still writing it
/// when the test acts.
const HUGE: &str = "select n, md5(n::text) from generate_series(1, 10000000) n";

/// Reads rows of the result under way until `bytes` of them came (the agent writes by then).
fn read_rows(c: &mut Client, bytes: usize) {
    let mut got = 0;
    while got < bytes {
        match c.recv().expect("the result ended early") {
            refract_pg::BackendMessage::DataRow(cols) => {
                got += cols.iter().flatten().map(|b| b.len() + 4).sum::<usize>()
            }
            m => assert!(matches!(m, refract_pg::BackendMessage::RowDescription(_)), "unexpected {m:?}"),
        }
    }
}

/// Whether the huge query still runs on the server.
fn huge_running(d: &mut Client) -> bool {
    let q = format!("select count(*) from pg_stat_activity where query = '{HUGE}' and pid <> pg_backend_pid()");
    d.query(&q).value() != "0"
}

#[test]
fn an_agent_that_is_gone_leaves_results_relayed() {
    let mut h = Hybrid::start();
    let (mut c, mut d) = (h.client(), h.direct());
    same("through the agent", &c.query(LARGE), &d.query(LARGE));
    assert!(h.handed_over() > 0, "handed over while the agent ran");
    h.agent.kill();
    let before = h.handed_over();
    // The idle connection through the dead agent is dropped at checkout; the next one goes
    // straight to the server, and the result is relayed.
    same("after the agent died", &c.query(LARGE), &d.query(LARGE));
    same("and again", &c.query(LARGE), &d.query(LARGE));
    assert_eq!(h.handed_over(), before, "no hand-over without the agent");
}

#[test]
fn an_agent_that_dies_mid_result_ends_that_client_only() {
    let mut h = Hybrid::start();
    let (mut other, mut d) = (h.client(), h.direct());
    let mut c = h.client();
    c.send(&[FrontendMessage::Query(HUGE.into())]);
    read_rows(&mut c, 4 << 20);
    let killed = std::time::Instant::now();
    h.agent.kill();
    // The client reads what is in its socket, then the connection ends.
    while c.recv().is_some() {}
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(2), "the client's connection ended {took:?} after the agent died");
    // Every other client goes on (straight to the server now).
    same("another client", &other.query("select 1"), &d.query("select 1"));
    same("a new client", &h.client().query(LARGE), &d.query(LARGE));
    // The server connection the agent had is gone with its query, never reused.
    pg_common::until("the huge query ended on the server", || !huge_running(&mut d));
}

#[test]
fn a_client_that_leaves_mid_result_has_its_query_cancelled() {
    let h = Hybrid::start();
    let mut d = h.direct();
    let mut c = h.client();
    c.send(&[FrontendMessage::Query(HUGE.into())]);
    read_rows(&mut c, 4 << 20);
    assert!(huge_running(&mut d), "the query runs while the agent writes");
    drop(c); // unread data in its socket: the close resets the connection
    pg_common::until("the huge query ended on the server", || !huge_running(&mut d));
    let mut again = h.client();
    same("refract serves on", &again.query(LARGE), &d.query(LARGE));
}

#[test]
fn a_cancel_request_stops_a_handed_over_result() {
    let h = Hybrid::start();
    let mut c = h.client();
    c.send(&[FrontendMessage::Query(HUGE.into())]);
    read_rows(&mut c, 4 << 20);
    c.cancel(SocketAddr::from((Ipv4Addr::LOCALHOST, h.port)));
    let rest = c.until_ready();
    assert_eq!(rest.code(), Some("57014"), "the result ends with query_canceled");
    assert_eq!(rest.status, Some(refract_pg::TxStatus::Idle));
    assert_eq!(c.query("select 5").value(), "5", "the session goes on");
    assert!(h.handed_over() > 0, "the cancelled result had been handed over");
}

#[test]
fn small_statements_learn_to_go_straight_to_the_server() {
    let h = Hybrid::start();
    let (mut c, mut d) = (h.client(), h.direct());
    // A kind of statement not seen before goes through the agent; after a few small answers
    // it goes straight to the server, also in the extended protocol.
    let small = "select n from generate_series(1, 3) n where n > 1";
    for _ in 0..8 {
        same("small, learning", &c.query(small), &d.query(small));
    }
    for _ in 0..8 {
        same("extended, learning", &c.extended("select 2"), &d.extended("select 2"));
    }
    let before = agent::through_agent(h.admin, "primary");
    assert!(before >= 8, "unknown kinds went through the agent ({before})");
    for _ in 0..20 {
        same("small, known", &c.query(small), &d.query(small));
        same("extended, known", &c.extended("select 2"), &d.extended("select 2"));
    }
    assert_eq!(agent::through_agent(h.admin, "primary"), before, "known small statements skip the agent");

    // A transaction's connection serves statements not yet seen: BEGIN never goes direct.
    for _ in 0..6 {
        same("begin", &c.query("begin"), &d.query("begin"));
        same("read in a transaction", &c.query(LARGE), &d.query(LARGE));
        same("commit", &c.query("commit"), &d.query("commit"));
    }
    let handed = h.handed_over();
    assert!(handed >= 6, "every large read in a transaction was handed over ({handed})");

    // A kind known small that answers large once is relayed on its direct connection, exactly,
    // then goes through the agent again and is handed over.
    let sized = |n: u32| format!("select n, md5(n::text) from generate_series(1, {n}) n");
    for _ in 0..8 {
        same("sized, small", &c.query(&sized(3)), &d.query(&sized(3)));
    }
    same("sized, large on a direct connection", &c.query(&sized(20000)), &d.query(&sized(20000)));
    assert_eq!(h.handed_over(), handed, "relayed: its connection did not go through the agent");
    same("sized, large again", &c.query(&sized(20000)), &d.query(&sized(20000)));
    assert_eq!(h.handed_over(), handed + 1, "handed over once it was known to answer large");
}

#[test]
fn a_full_pool_replaces_connections_of_the_other_kind_within_its_budget() {
    let h = Hybrid::with("pool_size = 1");
    let (mut c, mut d) = (h.client(), h.direct());
    let small = "select 7";
    for _ in 0..8 {
        same("small, learning", &c.query(small), &d.query(small));
    }
    // The one connection went through the agent; the pool is full, so the first known-small
    // statement replaces it with a direct one once the budget allows. The login spent it: the
    // greeting's query took a direct connection, which the first statement replaced. The budget
    // refills at one a second.
    std::thread::sleep(Duration::from_millis(1100));
    let before = agent::through_agent(h.admin, "primary");
    for _ in 0..5 {
        same("small, known", &c.query(small), &d.query(small));
    }
    assert_eq!(agent::through_agent(h.admin, "primary"), before, "replaced by a direct connection");
    // The budget refills at one a second: a large result after that gets a connection through
    // the agent again, and is handed over.
    std::thread::sleep(Duration::from_millis(1100));
    let handed = h.handed_over();
    same("large", &c.query(LARGE), &d.query(LARGE));
    assert_eq!(h.handed_over(), handed + 1, "a connection through the agent took the direct one's place");
}
