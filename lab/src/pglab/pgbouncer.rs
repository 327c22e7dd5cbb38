//! PgBouncer, the pooler refract is measured against: transaction pooling on 198.18.0.2:6434
//! in rf-d (the namespace that owns that address, where HAProxy runs in the HTTP lab), one
//! database entry for the primary (PgBouncer does not split reads), SCRAM for clients and the
//! server from a clear-text `auth_file`.

use crate::fabric::topology::DISPATCHER;
use crate::pglab::layout::{pg_dir, Server, PGBOUNCER_PORT};
use refract_pg::testkit::{DATABASE, PASSWORD, USER};
use std::path::PathBuf;

/// Debian's PgBouncer.
pub const BINARY: &str = "/usr/sbin/pgbouncer";

/// PgBouncer's directory (config and userlist), owned by the server user; deleted on `lab down`.
pub fn dir() -> PathBuf {
    pg_dir().join("pgbouncer")
}

/// `userlist.txt`: the lab user with its clear-text password, which PgBouncer needs to log into
/// the server by SCRAM on the client's behalf.
pub fn userlist() -> String {
    format!("\"{USER}\" \"{PASSWORD}\"\n")
}

/// `pgbouncer.ini`: transaction pooling over `primary`, `pool_size` server connections (as
/// many as refract has to the primary and the replica together).
pub fn config(primary: &Server, pool_size: usize) -> String {
    let d = dir();
    let d = d.display();
    format!(
        "; refract lab (lab/src/pglab/pgbouncer.rs). PgBouncer sends every statement\n\
         ; to the one server of its database entry: the primary.\n\
         [databases]\n{DATABASE} = host={} port={} dbname={DATABASE}\n\n\
         [pgbouncer]\nlisten_addr = {}\nlisten_port = {PGBOUNCER_PORT}\nunix_socket_dir =\n\
         auth_type = scram-sha-256\nauth_file = {d}/userlist.txt\npool_mode = transaction\n\
         default_pool_size = {pool_size}\nmax_client_conn = 1000\n\
         ignore_startup_parameters = extra_float_digits\n",
        primary.host.addr,
        crate::pglab::layout::PG_PORT,
        DISPATCHER.addr,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pglab::layout::SERVERS;

    #[test]
    fn pools_over_the_primary_in_transaction_mode() {
        let c = config(&SERVERS[0], 40);
        for needle in [
            "postgres = host=198.18.0.21 port=5432 dbname=postgres\n",
            "listen_addr = 198.18.0.2\nlisten_port = 6434\n",
            "auth_type = scram-sha-256\n",
            "pool_mode = transaction\n",
            "default_pool_size = 40\n",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in:\n{c}");
        }
    }
}
