//! The whole configuration file: the engine's sections (`refract_core::config`) and the front
//! ends' (`[http]`, `[[route]]`, `[[share]]` and `[handover]` for HTTP, `[postgres]`) and
//! `[cluster]` (several dispatchers sharing state through etcd), parsed in one pass with unknown
//! keys refused and every error naming its line (`docs/config.md`). The front ends' sections
//! ride in the engine's [`Config`] as [`Sections`](refract_core::config::Sections).

use refract_cluster::ClusterConfig;
use refract_core::config::{
    describe_toml_error, find_key_line, line_of, AdminConfig, BackendConfig, Balance, Config, ConfigError, Health,
    Limits, Listen, Overload, Sections, Timeouts,
};
use refract_core::partial::check_share;
use refract_front_http::config::{HandoverConfig, HttpConfig, HttpSection, HttpShare, Listening};
use refract_front_pg::PgConfig;
use refract_http::RouteRule;
use serde::Deserialize;
use std::path::Path;
use toml::Spanned;

/// Every section of the file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    http: Option<HttpSection>,
    #[serde(default)]
    listen: Listen,
    #[serde(default)]
    balance: Balance,
    #[serde(default)]
    timeouts: Timeouts,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    health: Health,
    #[serde(default, rename = "backend")]
    backends: Vec<Spanned<BackendConfig>>,
    #[serde(default, rename = "route")]
    routes: Vec<RouteRule>,
    #[serde(default, rename = "share")]
    shares: Vec<Spanned<HttpShare>>,
    #[serde(default)]
    overload: Overload,
    #[serde(default)]
    postgres: Option<PgConfig>,
    #[serde(default)]
    handover: Option<HandoverConfig>,
    #[serde(default)]
    admin: AdminConfig,
    #[serde(default)]
    cluster: Option<ClusterConfig>,
}

/// Reads, parses and validates a configuration file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, e.to_string()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_in(&text, base).map_err(|message| ConfigError::new(path, message))
}

/// Parses and validates configuration text; the error names the line. Relative paths in it
/// (`[admin] token_file`) are taken from the current directory.
pub fn parse(text: &str) -> Result<Config, String> {
    parse_in(text, Path::new("."))
}

/// Parses and validates configuration text whose relative paths start at `base`.
pub fn parse_in(text: &str, base: &Path) -> Result<Config, String> {
    let f: File = toml::from_str(text).map_err(|e| describe_toml_error(text, &e))?;
    if f.backends.is_empty() && f.postgres.is_none() {
        return Err(format!(
            "line {}: no [[backend]]: the HTTP front end needs at least one backend",
            find_key_line(text, "[listen]")
        ));
    }
    let listening = Listening::resolve(f.http.as_ref(), f.listen.http, f.health.path.clone())
        .map_err(|e| format!("line {}: {e}", find_key_line(text, "[http]")))?;
    let Some((key, addr)) = listening.listen else {
        return Err(format!("line {}: no HTTP listener: set [http] listen", find_key_line(text, "[listen]")));
    };
    let http = if key == "[http] listen" { ("http", "listen", addr) } else { ("listen", "http", addr) };
    let pg = f.postgres.iter().map(|p| ("postgres", "listen", p.listen));
    let others: Vec<_> = std::iter::once(http).chain(pg).collect();
    let engine = Config {
        listen: f.listen,
        balance: f.balance,
        timeouts: f.timeouts,
        limits: f.limits,
        health: f.health,
        backends: f.backends,
        overload: f.overload,
        admin: f.admin,
        sections: Sections::default(),
    };
    let mut cfg = engine.checked(text, base, &others)?;
    if let Some(h) = &f.handover {
        let mut names: Vec<&str> = cfg.backends.iter().map(|b| b.get_ref().name.as_str()).collect();
        names.extend(f.postgres.iter().flat_map(|p| p.servers.iter().map(|s| s.name.as_str())));
        h.validate(&names, find_key_line(text, "handover"))?;
        // The PostgreSQL front end reads the section on its own.
        cfg.sections.insert(h.clone());
    }
    check_shares(&cfg, &f.shares, text)?;
    let shares = f.shares.into_iter().map(Spanned::into_inner).collect();
    cfg.sections.insert(HttpConfig { listening, ..HttpConfig::new(f.routes, f.handover, shares) });
    if let Some(mut pg) = f.postgres {
        // Several dispatchers keep two-phase decisions in etcd, where all of them find them.
        if f.cluster.is_some() {
            pg.share_decisions();
        }
        cfg.sections.insert(pg);
    }
    if let Some(cluster) = f.cluster {
        let at = find_key_line(text, "[cluster]");
        let mut cluster = cluster.validate().map_err(|e| format!("line {at}: {e}"))?;
        let files = [&mut cluster.password_file, &mut cluster.ca_file, &mut cluster.cert_file, &mut cluster.key_file];
        for file in files.into_iter().chain([&mut cluster.peer_key_file]) {
            if let Some(f) = file.as_mut().filter(|f| f.is_relative()) {
                *f = base.join(&*f);
            }
        }
        cfg.sections.insert(cluster);
    }
    Ok(cfg)
}

/// Checks each `[[share]]` (of `text`) against the `[[backend]]`s; the error names its line.
fn check_shares(cfg: &Config, shares: &[Spanned<HttpShare>], text: &str) -> Result<(), String> {
    let all: Vec<&[String]> = shares.iter().map(|s| s.get_ref().tables.as_slice()).collect();
    let known = |n: &str| cfg.backends.iter().any(|b| b.get_ref().name == n);
    shares.iter().try_for_each(|s| {
        let (at, share) = (line_of(text, s.span().start), s.get_ref());
        check_share(HttpShare::SECTION, &share.tables, &share.backends, known, &all)
            .map_err(|e| format!("line {at}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_front_http::config::{AgentAddr, HandoverMode};
    use refract_pg::auth::AuthMethod;

    /// A replica, then `[listen]` (so that tests append `[listen]` keys); 7 lines.
    const MIN: &str =
        "[[backend]]\nname = \"r0\"\naddr = \"127.0.0.1:9\"\nrole = \"replica\"\n\n[listen]\nhttp = \"127.0.0.1:8080\"\n";

    const B: &str = "[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n";

    fn err(text: &str) -> String {
        parse(text).expect_err(text)
    }

    /// The `[handover]` section of a parsed configuration.
    fn handover(c: Config) -> Option<HandoverConfig> {
        HttpConfig::of(&c).handover.clone()
    }
    #[test]
    fn handover_section() {
        let b = "[[backend]]\nname = \"b1\"\naddr = \"127.0.0.1:1\"\nrole = \"replica\"\n";
        assert!(handover(parse(MIN).unwrap()).is_none());
        let c = parse(&format!("{MIN}{b}[handover]\nmode = \"always\"\nagents = {{ b1 = \"unix:/tmp/a.sock\" }}\n"))
            .unwrap();
        let h = handover(c).unwrap();
        assert_eq!((h.mode, h.threshold, h.idle_ms), (HandoverMode::Always, 32 << 10, 20));
        assert_eq!(h.agents["b1"], AgentAddr::Unix("/tmp/a.sock".into()));
        let e = parse(&format!("{MIN}{b}[handover]\nmode = \"hybrid\"\n")).unwrap_err();
        assert!(e.contains("at least one agent"), "{e}");
        let e = parse(&format!("{MIN}{b}[handover]\nagents = {{ b9 = \"unix:/a\" }}\n")).unwrap_err();
        assert!(e.contains("not a backend"), "{e}");
        let e = parse(&format!("{MIN}{b}[handover]\nagents = {{ b1 = \"198.18.0.21:7000\" }}\n")).unwrap_err();
        assert!(e.contains("key_file"), "{e}");
        let e = parse(&format!("{MIN}{b}[handover]\nagents = {{ b1 = \"nowhere\" }}\n")).unwrap_err();
        assert!(e.contains("unix:/path"), "{e}");
        let e = parse(&format!("{MIN}{b}[handover]\nmode = \"sometimes\"\n")).unwrap_err();
        assert!(e.starts_with("line 13:"), "{e}");
        let agents = "agents = { b1 = \"unix:/a\" }\n";
        let c = parse(&format!("{MIN}{b}[handover]\nidle_ms = 0\n{agents}")).unwrap();
        assert_eq!(handover(c).unwrap().idle_ms, 0);
        let e = parse(&format!("{MIN}{b}[handover]\nidle_ms = 1001\n{agents}")).unwrap_err();
        assert!(e.contains("idle_ms must be at most 1000"), "{e}");
        assert!(parse(&format!("{MIN}{b}[handover]\nidle_ms = -1\n{agents}")).is_err());
    }

    #[test]
    fn shares_name_backends_with_weights() {
        let r1 = "[[backend]]\nname = \"r1\"\naddr = \"127.0.0.1:1\"\nrole = \"replica\"\ntables = [\"a\"]\n";
        let share = "[[share]]\ntables = [\"a\"]\nbackends = { r0 = 1, r1 = 3 }\n";
        let c = parse(&format!("{MIN}{r1}{share}")).unwrap();
        let http = HttpConfig::of(&c);
        assert_eq!(http.share_config[0].backends["r1"], 3.0);
        assert!(http.shares.names("r0") && !http.shares.names("r9"));
        let e = err(&format!("{MIN}{r1}{}", share.replace("r0", "r9")));
        assert_eq!(e, "line 13: [[share]] for a: no [[backend]] \"r9\"");
        let e = err(&format!("{MIN}{r1}{}", share.replace("r0 = 1", "r0 = 0")));
        assert!(e.ends_with("the weight of r0 must be > 0"), "{e}");
        let e = err(&format!("{MIN}{r1}{share}{share}"));
        assert_eq!(e, "line 13: [[share]] for a is given twice");
        let e = err(&format!("{MIN}{r1}{}", share.replace("backends", "servers")));
        assert!(e.contains("unknown field `servers`"), "{e}");
    }

    #[test]
    fn backends_missing_or_on_one_address_refused() {
        let e = err("[listen]\nhttp = \"127.0.0.1:8080\"\n");
        assert!(e.starts_with("line 1:") && e.contains("no [[backend]]"), "{e}");
        let twice = "[[backend]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\nrole = \"replica\"\n";
        let e = err(&format!("[listen]\nhttp = \"127.0.0.1:8080\"\n{B}{twice}"));
        assert!(e.starts_with("line 7:") && e.contains("\"b\" has the address 127.0.0.1:1 of backend \"a\""), "{e}");
    }

    #[test]
    fn listeners_on_one_address_name_both_keys() {
        let e = err(&format!("[listen]\nhttp = \"127.0.0.1:8080\"\nadmin = \"127.0.0.1:8080\"\n{B}"));
        assert_eq!(e, "line 3: [listen] admin 127.0.0.1:8080 clashes with [listen] http on the same address");
        let e = err(&format!("[listen]\nhttp = \"0.0.0.0:8080\"\nadmin = \"127.0.0.1:8080\"\n{B}"));
        assert!(e.contains("clashes"), "{e}");
        assert!(parse(&format!("[listen]\nhttp = \"127.0.0.1:0\"\n{B}")).is_ok());
        let e = err(&format!("[http]\nlisten = \"127.0.0.1:8080\"\n[listen]\nadmin = \"127.0.0.1:8080\"\n{B}"));
        assert_eq!(e, "line 4: [listen] admin 127.0.0.1:8080 clashes with [http] listen on the same address");
    }

    #[test]
    fn http_section_or_its_deprecated_spellings_not_both() {
        let new = format!("[http]\nlisten = \"127.0.0.1:8080\"\nhealth_path = \"/up\"\n{B}");
        let l = HttpConfig::of(&parse(&new).unwrap()).listening.clone();
        assert_eq!(l.listen, Some(("[http] listen", "127.0.0.1:8080".parse().unwrap())));
        assert_eq!((l.health_path.as_deref(), l.renamed.len()), (Some("/up"), 0));
        let old = format!("[listen]\nhttp = \"127.0.0.1:8080\"\n[health]\npath = \"/up\"\n{B}");
        let l = HttpConfig::of(&parse(&old).unwrap()).listening.clone();
        assert_eq!(l.listen, Some(("[listen] http", "127.0.0.1:8080".parse().unwrap())));
        assert_eq!(l.health_path.as_deref(), Some("/up"));
        assert_eq!(l.renamed, [("[listen] http", "[http] listen"), ("[health] path", "[http] health_path")]);
        let e = err(&format!("[http]\nlisten = \"127.0.0.1:8080\"\n[listen]\nhttp = \"127.0.0.1:8081\"\n{B}"));
        assert!(e.starts_with("line 1: [http] listen and [listen] http are both set"), "{e}");
        let e = err(&format!("{new}[health]\npath = \"/up\"\n"));
        assert!(e.contains("[http] health_path and [health] path are both set"), "{e}");
        let e = err(&format!("[listen]\nworkers = 1\n{B}"));
        assert!(e.starts_with("line 1: no HTTP listener: set [http] listen"), "{e}");
    }

    #[test]
    fn the_example_has_the_documented_addresses() {
        let cfg = parse(include_str!("../../../examples/postgres.toml")).map(|c| c.sections.get::<PgConfig>().cloned());
        let pg = cfg.ok().flatten().map(|p| {
            let servers: Vec<String> = p.servers.iter().map(|s| format!("{} {:?}", s.addr, s.role)).collect();
            (p.listen.to_string(), servers, p.user("refract").map(|u| u.method))
        });
        let servers = vec!["127.0.0.1:5433 Primary".to_owned(), "127.0.0.1:5434 Replica".to_owned()];
        assert_eq!(pg, Some(("127.0.0.1:6432".to_owned(), servers, Some(AuthMethod::ScramSha256))));
    }
}
