//! The ParameterStatus set a client is greeted with at login, which must be what
//! PostgreSQL reports to a direct connection with the same startup settings: the server's
//! spelling of the client's values (`UTF8` for `utf-8`, `Europe/Rome` for `europe/rome`,
//! `SQL, DMY` for `sql,dmy`), an empty `application_name` when the client gives none.
//!
//! Only the server knows how it spells a value, and refract applies a client's startup
//! settings as SETs on whichever server connection serves it (`startup::startup_sets`), so the
//! primary is asked, on one of its pooled connections, in a transaction that is rolled back:
//! `RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL` (back to the connection's login values), the client's SETs, then the
//! `current_setting` of every parameter the server reported at that connection's login
//! (ParameterStatus carries the same text, in the client's encoding, as the query's answer
//! does). A setting the server refuses refuses the login, with the server's error, as
//! PostgreSQL refuses it at startup. What `SHOW` gives later comes from the same SETs.
//!
//! The answer is kept per set of startup settings (`startup::Greetings`: at most 256 sets,
//! each reused for 60 s), so a login with settings seen recently costs no round trip. Without the primary
//! (down, or no connection free within `checkout_timeout_ms`) a kept answer serves whatever its
//! age, else the servers' login values with the client's own on top, as the client spelt them.

use super::startup::{literal, startup_sets, Params, Refusal, TRACKED_PARAMS};
use crate::error::PgError;
use crate::server::sizes::Path;
use crate::server::ServerConn;
use crate::Shared;
use refract_pg::Startup;

/// The ParameterStatus set for a client with `startup` (see the module's text); a refusal when
/// the primary refuses one of its settings.
pub(crate) async fn greeting(shared: &Shared, startup: &Startup) -> Result<Params, Refusal> {
    let sets: Vec<String> = startup_sets(startup).into_iter().map(|(_, sql)| sql).collect();
    let kept = shared.greetings.get(&sets);
    if let Some((params, true)) = kept {
        return Ok(params);
    }
    match ask_primary(shared, &sets).await {
        Ok(Some(params)) => {
            shared.greetings.keep(sets, params.clone());
            Ok(params)
        }
        Ok(None) => match kept {
            Some((params, _)) => Ok(params),
            None => Ok(approximate(shared, startup).await),
        },
        Err(PgError::Server(e)) => {
            Err((refusal_code(e.code()), e.message().unwrap_or("invalid startup options").into()))
        }
        Err(e) => {
            tracing::debug!(error = %e, "could not learn a client's greeting");
            Ok(match kept {
                Some((params, _)) => params,
                None => approximate(shared, startup).await,
            })
        }
    }
}

/// The primary's ParameterStatus values under `sets` (`None`: no primary is available, or no
/// connection to it within `checkout_timeout_ms`).
async fn ask_primary(shared: &Shared, sets: &[String]) -> Result<Option<Params>, PgError> {
    let Some(server) = shared.servers.primary() else { return Ok(None) };
    let Ok(mut conn) = server.pool.get(Path::Direct).await else { return Ok(None) };
    if let Ok(mut p) = shared.server_params.write() {
        p.clone_from(&conn.params);
    }
    let names: Vec<String> = conn.params.iter().map(|(n, _)| n.clone()).collect();
    let asked = conn.query(&reading_query(sets, &names)).await;
    let back = if asked.is_err() { conn.query("ROLLBACK").await } else { Ok(vec![]) };
    if back.is_ok() {
        conn.release();
    }
    let rows = asked?;
    let values = rows.into_iter().last().unwrap_or_default();
    if values.len() != names.len() {
        return Err(PgError::Unavailable("internal: the greeting query answered another shape".into()));
    }
    Ok(Some(names.into_iter().zip(values).map(|(n, v)| (n, v.unwrap_or_default())).collect()))
}

/// One simple query: the client's settings applied in a transaction, every parameter in
/// `names` read, the transaction rolled back (after an error the caller rolls back).
fn reading_query(sets: &[String], names: &[String]) -> String {
    let reads: Vec<String> = names.iter().map(|n| format!("pg_catalog.current_setting({})", literal(n))).collect();
    // The connection may carry another client's settings, its session authorization among
    // them (a reported parameter): back to the login values, identity included.
    let mut sql = format!("BEGIN; {}; ", refract_pg::session::BACK_TO_DEFAULTS);
    for set in sets {
        sql.push_str(set);
        sql.push_str("; ");
    }
    sql.push_str(&format!("SELECT {}; ROLLBACK", reads.join(", ")));
    sql
}

/// The SQLSTATE a login refused for a setting gets: the server's for what PostgreSQL refuses
/// at startup with a code of its own, else `22023` (invalid parameter value).
fn refusal_code(code: Option<&str>) -> &'static str {
    match code.unwrap_or_default() {
        "42704" => "42704",
        "42501" => "42501",
        "55P02" => "55P02",
        "22021" => "22021",
        _ => "22023",
    }
}

/// Without the primary: the servers' login values (learnt from whichever answers) with the
/// client's own values on top, as given.
async fn approximate(shared: &Shared, startup: &Startup) -> Params {
    let known = shared.server_params.read().map(|p| p.clone()).unwrap_or_default();
    let mut params = if known.is_empty() { learn_server_params(shared).await } else { known };
    for (k, v) in &startup.params {
        if let Some(slot) = params.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(k)) {
            if TRACKED_PARAMS.contains(&k.to_ascii_lowercase().as_str()) {
                slot.1 = v.clone();
            }
        }
    }
    params
}

async fn learn_server_params(shared: &Shared) -> Params {
    for s in shared.servers.list().iter() {
        if let Ok(conn) = ServerConn::connect(s.pool.addr(), s.pool.login()).await {
            if let Ok(mut p) = shared.server_params.write() {
                p.clone_from(&conn.params);
            }
            return conn.params;
        }
    }
    // No server answers: enough for libpq and psql to proceed; queries will get errors.
    [
        ("application_name", ""),
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("TimeZone", "UTC"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_applies_the_settings_reads_every_parameter_and_rolls_back() {
        let sets =
            ["SET TimeZone = 'europe/rome'".to_owned(), "SELECT pg_catalog.set_config('a.b', 'x', false)".into()];
        let names = ["TimeZone".to_owned(), "it's".into()];
        assert_eq!(
            reading_query(&sets, &names),
            "BEGIN; RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL; SET TimeZone = 'europe/rome'; SELECT pg_catalog.set_config('a.b', 'x', false); \
             SELECT pg_catalog.current_setting('TimeZone'), pg_catalog.current_setting('it''s'); ROLLBACK"
        );
        assert_eq!(
            reading_query(&[], &names[..1]),
            "BEGIN; RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL; SELECT pg_catalog.current_setting('TimeZone'); ROLLBACK"
        );
    }

    #[test]
    fn refusals_keep_the_codes_postgres_gives_at_startup() {
        assert_eq!(refusal_code(Some("42704")), "42704");
        assert_eq!(refusal_code(Some("42601")), "22023");
        assert_eq!(refusal_code(None), "22023");
    }
}
