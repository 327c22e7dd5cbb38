//! The shard override (docs/sharding.md): `/* refract: shard=N */` in a statement's text, or
//! the session's `SET refract.shard = N`, sends statements to shard N alone, past key routing,
//! scatter and splitting (the hint beats the SET). N is a shard's configured name or its
//! 0-based index. `SET`/`RESET`/`SHOW refract.shard` are answered here, never by a server;
//! `RESET ALL` and `DISCARD ALL` run on the server as always and also clear the override.

use super::batch::BatchShard;
use super::route::Target;
use super::Sharding;
use crate::error::PgError;
use crate::session::Session;
use pg_query::protobuf::{a_const, VariableSetKind};
use pg_query::NodeEnum;
use refract_pg::classify::{shard_hint, Classification, Statement};
use refract_pg::notice::sqlstate;
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};

/// SQLSTATE `invalid_parameter_value`: an unknown shard name or index.
pub(crate) const INVALID_VALUE: &str = "22023";

/// The setting's name, as the parser folds it.
const NAME: &str = "refract.shard";

/// What a query says to the override.
#[derive(Debug, PartialEq, Eq)]
enum Setting {
    /// `SET refract.shard = VALUE` (the value as written).
    Set(String),
    /// `RESET refract.shard`, `SET refract.shard TO DEFAULT`.
    Clear,
    /// `SHOW refract.shard`.
    Show,
    /// Refused with this reason (`SET LOCAL`, mixed with other statements, a list of values).
    Refuse(String),
}

impl Sharding {
    /// The shard `v` names: a configured name (exactly, else ignoring ASCII case), else a
    /// 0-based index. Otherwise the message lists the valid shards.
    pub(crate) fn shard_named(&self, v: &str) -> Result<usize, String> {
        let by_name = self.names.iter().position(|n| n == v);
        let by_name = by_name.or_else(|| {
            let mut m = self.names.iter().enumerate().filter(|(_, n)| n.eq_ignore_ascii_case(v));
            match (m.next(), m.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        });
        let by_index = || v.parse::<usize>().ok().filter(|i| *i < self.count());
        by_name.or_else(by_index).ok_or_else(|| {
            let valid: Vec<String> = self.names.iter().enumerate().map(|(i, n)| format!("{i} ({n})")).collect();
            format!("no shard \"{v}\": the shards are {}", valid.join(", "))
        })
    }
}

impl Session {
    /// The shard override for `sql`: its hint, else the session's `SET refract.shard`, as a
    /// one-shard target (a bad hint: refused with 22023). `None`: no override.
    pub(crate) fn forced_target(&self, sh: &Sharding, sql: &str) -> Option<Target> {
        let at = match shard_hint(sql) {
            Some(v) => sh.shard_named(&v),
            None => Ok(self.shard_override?),
        };
        Some(match at {
            Ok(i) => Target::Shards(vec![i]),
            Err(why) => Target::Fail(INVALID_VALUE, format!("/* refract: shard=... */: {why}")),
        })
    }

    /// The explain rows of an overridden statement (`None`: no override).
    pub(crate) fn explain_override(&self, sh: &Sharding, sql: &str, read: bool) -> Option<Vec<String>> {
        let source = if shard_hint(sql).is_some() { "the /* refract: shard */ hint" } else { "SET refract.shard" };
        let kind = if read { "read" } else { "write" };
        Some(match self.forced_target(sh, sql)? {
            Target::Shards(s) => s
                .first()
                .map(|&i| format!("{kind} on shard {} (index {i}): shard override by {source}", sh.names[i]))
                .into_iter()
                .collect(),
            Target::Fail(code, why) => vec![format!("refused ({code}): {why}")],
            _ => vec![],
        })
    }

    /// `SET`, `RESET` and `SHOW refract.shard`, answered here (`true`: answered). `RESET ALL`
    /// and `DISCARD ALL` clear the override and go on to the server (`false`).
    pub(crate) async fn shard_setting(
        &mut self,
        sh: &Sharding,
        sql: &str,
        c: &Classification,
    ) -> Result<bool, PgError> {
        let resets = |s: &Statement| matches!(s, Statement::Reset { name: None } | Statement::Discard { all: true });
        if c.statements.iter().any(resets) {
            self.shard_override = None;
            return Ok(false);
        }
        let Some(setting) = setting(sql, c) else { return Ok(false) };
        if self.phase().tx() == TxStatus::Failed {
            let msg = "current transaction is aborted, commands ignored until end of transaction block";
            self.io.out.extend_from_slice(&reply::error("25P02", msg));
            self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Failed));
            self.flush().await?;
            return Ok(true);
        }
        let tag = match setting {
            Setting::Refuse(why) => {
                self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await?;
                return Ok(true);
            }
            Setting::Set(v) => match sh.shard_named(&v) {
                Ok(i) => {
                    self.shard_override = Some(i);
                    "SET"
                }
                Err(why) => {
                    self.refuse_sharded(sh, INVALID_VALUE, &format!("SET refract.shard: {why}")).await?;
                    return Ok(true);
                }
            },
            Setting::Clear => {
                self.shard_override = None;
                if matches!(c.statements.as_slice(), [Statement::Reset { .. }]) {
                    "RESET"
                } else {
                    "SET"
                }
            }
            Setting::Show => {
                let value = self.shard_override.map(|i| sh.names[i].clone()).unwrap_or_default();
                self.io.out.extend_from_slice(&reply::text_rows(NAME, &[value]));
                "SHOW"
            }
        };
        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
        self.io.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        self.flush().await?;
        Ok(true)
    }

    /// Extended protocol: `SET`/`RESET`/`SHOW refract.shard` in a Parse is refused (refract
    /// answers them for simple queries only; a server would take the SET as a setting of its
    /// own and the override would silently not happen).
    pub(super) fn batch_setting(&self, msgs: &[FrontendMessage]) -> Option<BatchShard> {
        msgs.iter().find_map(|m| match m {
            FrontendMessage::Parse { query, .. } if query.to_ascii_lowercase().contains(NAME) => {
                setting(query, &self.shared.classifier.classify(query)).map(|_| {
                    let why = "SET, RESET and SHOW refract.shard are answered for simple queries only: send them as a simple Query";
                    BatchShard::Refused(sqlstate::FEATURE_NOT_SUPPORTED, why.into())
                })
            }
            _ => None,
        })
    }
}

/// What the query `sql` (classified as `c`) does to `refract.shard`, if anything.
fn setting(sql: &str, c: &Classification) -> Option<Setting> {
    let ours = |s: &Statement| match s {
        Statement::Set { name, .. } => name == NAME,
        Statement::Reset { name: Some(n) } => n == NAME,
        Statement::Read => true, // SHOW: looked at below
        _ => false,
    };
    if !sql.to_ascii_lowercase().contains(NAME) || !c.statements.iter().any(ours) {
        return None;
    }
    let parsed = pg_query::parse(sql, 0).ok()?;
    let nodes: Vec<&NodeEnum> = parsed.protobuf.stmts.iter().filter_map(|r| r.stmt.as_ref()?.node.as_ref()).collect();
    let mine = |n: &&NodeEnum| match n {
        NodeEnum::VariableSetStmt(s) => s.name.eq_ignore_ascii_case(NAME),
        NodeEnum::VariableShowStmt(s) => s.name.eq_ignore_ascii_case(NAME),
        _ => false,
    };
    let node = match nodes.as_slice() {
        [one] if mine(one) => *one,
        many if many.iter().any(mine) => {
            return Some(Setting::Refuse(format!("send SET, RESET and SHOW {NAME} alone, not with other statements")))
        }
        _ => return None,
    };
    Some(match node {
        NodeEnum::VariableShowStmt(_) => Setting::Show,
        NodeEnum::VariableSetStmt(s) if s.is_local => {
            Setting::Refuse(format!("SET LOCAL {NAME} is not supported: use SET {NAME} (and RESET) or the hint"))
        }
        NodeEnum::VariableSetStmt(s) => match VariableSetKind::try_from(s.kind) {
            Ok(VariableSetKind::VarReset | VariableSetKind::VarSetDefault) => Setting::Clear,
            Ok(VariableSetKind::VarSetValue) => match set_value(&s.args) {
                Some(v) => Setting::Set(v),
                None => Setting::Refuse(format!("{NAME} takes one shard name or index")),
            },
            _ => Setting::Refuse(format!("this form of SET {NAME} is not supported")),
        },
        _ => return None,
    })
}

/// The one value of a SET: a name (quoted or not) or an integer.
fn set_value(args: &[pg_query::protobuf::Node]) -> Option<String> {
    let [arg] = args else { return None };
    let Some(NodeEnum::AConst(k)) = arg.node.as_ref() else { return None };
    match k.val.as_ref()? {
        a_const::Val::Sval(s) => Some(s.sval.clone()),
        a_const::Val::Ival(i) => Some(i.ival.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_pg::classify::{Classifier, ClassifierConfig};

    fn sharding() -> Sharding {
        let mut text = "listen = \"127.0.0.1:6432\"\nserver_user = \"u\"\n".to_owned();
        for (i, name) in ["s0", "east", "2"].iter().enumerate() {
            text.push_str(&format!(
                "[[shard]]\nname = \"{name}\"\n[[shard.server]]\nname = \"p{i}\"\naddr = \"127.0.0.1:{}\"\nrole = \"primary\"\n",
                5441 + i
            ));
        }
        Sharding::new(&toml::from_str(&text).expect("config"), &std::sync::Arc::default())
    }

    #[test]
    fn shards_are_named_by_name_or_index() {
        let sh = sharding();
        assert_eq!(sh.shard_named("s0"), Ok(0));
        assert_eq!(sh.shard_named("EAST"), Ok(1), "a name, case aside");
        assert_eq!(sh.shard_named("1"), Ok(1), "an index");
        assert_eq!(sh.shard_named("2"), Ok(2), "the name \"2\" is also index 2");
        let err = sh.shard_named("9").unwrap_err();
        assert_eq!(err, "no shard \"9\": the shards are 0 (s0), 1 (east), 2 (2)");
        assert!(sh.shard_named("").is_err());
        assert!(sh.shard_named("-1").is_err());
        assert!(sh.shard_named("west").is_err());
    }

    #[test]
    fn set_reset_and_show_of_the_override_are_recognised() {
        let c = Classifier::new(ClassifierConfig::default());
        let s = |sql: &str| setting(sql, &c.classify(sql));
        assert_eq!(s("SET refract.shard = 1"), Some(Setting::Set("1".into())));
        assert_eq!(s("set refract.shard to 'east'"), Some(Setting::Set("east".into())));
        assert_eq!(s("SET SESSION refract.shard = east"), Some(Setting::Set("east".into())));
        assert_eq!(s("SET refract.shard TO DEFAULT"), Some(Setting::Clear));
        assert_eq!(s("RESET refract.shard"), Some(Setting::Clear));
        assert_eq!(s("show refract.shard"), Some(Setting::Show));
        assert!(matches!(s("SET LOCAL refract.shard = 1"), Some(Setting::Refuse(w)) if w.contains("LOCAL")));
        assert!(matches!(s("SET refract.shard = 1; select 1"), Some(Setting::Refuse(w)) if w.contains("alone")));
        assert!(matches!(s("SET refract.shard = a, b"), Some(Setting::Refuse(_))));
        assert_eq!(s("SET work_mem = '4MB'"), None);
        assert_eq!(s("select 'refract.shard'"), None);
        assert_eq!(s("RESET ALL"), None);
        assert_eq!(s("show work_mem"), None);
    }
}
