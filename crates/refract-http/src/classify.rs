//! Route classes and request classification. Order: the `x-refract-route` header; Hyrise-R
//! `POST /query` plans (write operators → write, TableLoad → all, else read); `/procedure` →
//! procedure; configured rules (method + path prefix); GET/HEAD → read, anything else → write.
//! A read plan also names the tables it reads ([`PlanTables`]), for partial replicas, and the
//! values its equality predicates look up ([`ReadPlan`]), for the affinity policy.

use crate::error::Error;
use crate::head::RequestHead;
use serde::{Deserialize, Serialize};

pub use refract_vocab::RouteClass;

/// A configured rule: requests with this method (any, if `None`) under this path prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// Method to match (case-insensitive); absent = any.
    #[serde(default)]
    pub method: Option<String>,
    /// Path prefix to match.
    pub path_prefix: String,
    /// The class requests matching this rule get.
    pub class: RouteClass,
}

/// Hyrise-R operators that modify data.
const WRITE_OPERATORS: [&str; 4] = ["InsertScan", "Delete", "PosUpdateIncrementScan", "PosUpdateScan"];

/// Classifies requests.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    rules: Vec<RouteRule>,
}

impl Classifier {
    /// A classifier with configured rules, tried in order after the built-in ones.
    pub fn new(rules: Vec<RouteRule>) -> Self {
        Classifier { rules }
    }

    /// Whether classification must see the body (a Hyrise-R plan without a route header).
    pub fn needs_body(&self, head: &RequestHead) -> bool {
        head.route_hint.is_none() && is_query_plan(head)
    }

    /// The class of a request; `body` is the whole body when [`Self::needs_body`] said so.
    pub fn classify(&self, head: &RequestHead, body: &[u8]) -> Result<RouteClass, Error> {
        self.classify_with_tables(head, body).map(|(class, _)| class)
    }

    /// [`Self::classify`], and for a Hyrise-R read plan the tables it reads (`None`: the
    /// request is no plan, or its route header decided).
    pub fn classify_with_tables(
        &self,
        head: &RequestHead,
        body: &[u8],
    ) -> Result<(RouteClass, Option<PlanTables>), Error> {
        self.classify_read(head, body).map(|(class, plan)| (class, plan.map(|p| p.tables)))
    }

    /// [`Self::classify`], and for a Hyrise-R read plan what it reads ([`ReadPlan`]; `None`:
    /// the request is no plan, or its route header decided).
    pub fn classify_read(&self, head: &RequestHead, body: &[u8]) -> Result<(RouteClass, Option<ReadPlan>), Error> {
        if let Some(hint) = &head.route_hint {
            return parse_hint(hint).map(|c| (c, None));
        }
        if is_query_plan(head) {
            return Ok(parse_read_plan(body));
        }
        if head.path() == "/procedure" || head.path().starts_with("/procedure/") {
            return Ok((RouteClass::Procedure, None));
        }
        if let Some(rule) = self.rules.iter().find(|r| rule_matches(r, head)) {
            return Ok((rule.class, None));
        }
        let class = match head.method.as_str() {
            "GET" | "HEAD" => RouteClass::Read,
            _ => RouteClass::Write,
        };
        Ok((class, None))
    }
}

fn parse_hint(hint: &str) -> Result<RouteClass, Error> {
    match hint {
        "read" => Ok(RouteClass::Read),
        "write" => Ok(RouteClass::Write),
        "all" => Ok(RouteClass::All),
        other => Err(Error::BadHeader {
            name: "x-refract-route",
            reason: format!("{other:?} is not one of read, write, all"),
        }),
    }
}

fn is_query_plan(head: &RequestHead) -> bool {
    head.method == "POST" && head.path() == "/query"
}

fn rule_matches(rule: &RouteRule, head: &RequestHead) -> bool {
    let method_ok = rule.method.as_deref().is_none_or(|m| m.eq_ignore_ascii_case(&head.method));
    method_ok && head.path().starts_with(&rule.path_prefix)
}

/// The plan's `operators` object: from a form body (`query=<JSON>`) or a bare JSON body.
fn plan_operators(body: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let json: serde_json::Value = if body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice(body).ok()?
    } else {
        let (_, q) = form_urlencoded::parse(body).find(|(k, _)| k == "query")?;
        serde_json::from_str(&q).ok()?
    };
    match json {
        serde_json::Value::Object(mut plan) => match plan.remove("operators")? {
            serde_json::Value::Object(ops) => Some(ops),
            _ => None,
        },
        _ => None,
    }
}

/// The plan's operator types: from a form body (`query=<JSON>`) or a bare JSON body.
pub fn plan_operator_types(body: &[u8]) -> Option<Vec<String>> {
    let ops = plan_operators(body)?;
    Some(ops.values().filter_map(|op| op.get("type")?.as_str().map(str::to_owned)).collect())
}

/// Classifies a Hyrise-R plan. An unreadable plan goes to the primary (class write): it is the
/// safe place, and the primary answers with its own error.
pub fn classify_plan(body: &[u8]) -> RouteClass {
    read_plan(body).0
}

/// A Hyrise-R plan's class and, for a read, the tables it reads (one parse for both).
pub fn read_plan(body: &[u8]) -> (RouteClass, Option<PlanTables>) {
    let (class, plan) = parse_read_plan(body);
    (class, plan.map(|p| p.tables))
}

/// A Hyrise-R plan's class and, for a read, what it reads (one parse for both).
pub fn parse_read_plan(body: &[u8]) -> (RouteClass, Option<ReadPlan>) {
    let Some(ops) = plan_operators(body) else {
        return (RouteClass::Write, None);
    };
    let types: Vec<&str> = ops.values().filter_map(|op| op.get("type")?.as_str()).collect();
    if types.contains(&"TableLoad") {
        (RouteClass::All, None)
    } else if types.iter().any(|t| WRITE_OPERATORS.contains(t)) {
        (RouteClass::Write, None)
    } else {
        (RouteClass::Read, Some(ReadPlan { tables: plan_tables(&ops), values: plan_values(&ops) }))
    }
}

/// What a read plan reads, as the balancer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Its tables (partial replicas).
    pub tables: PlanTables,
    /// The values its equality predicates look up: in any operator's `predicates`, those of
    /// type `EQ`, `EQ_V` or `EQ_R` (or their numbers 0, 20, 13) with a string, number or
    /// boolean `value`, as text (a string as it is, a number or boolean as JSON writes it);
    /// sorted, each once.
    pub values: Vec<String>,
}

impl ReadPlan {
    /// What its affinity key is made of: its tables, then its values (a read of table `t`
    /// looking up `42`: `["t", "42"]`); `None` when it names no table or refract cannot name
    /// them all.
    pub fn key_parts(&self) -> Option<Vec<&[u8]>> {
        let tables = self.tables.as_slice();
        if tables.is_empty() {
            return None;
        }
        Some(tables.iter().chain(&self.values).map(|s| s.as_bytes()).collect())
    }
}

/// Hyrise-R's equality predicates, by name and by number (`PredicateType`): `EQ`, `EQ_R`, `EQ_V`.
const EQUALITY_PREDICATES: [(&str, u64); 3] = [("EQ", 0), ("EQ_R", 13), ("EQ_V", 20)];

/// The values a read plan's equality predicates look up (see [`ReadPlan::values`]).
fn plan_values(ops: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    let predicates = ops.values().filter_map(|op| op.get("predicates")?.as_array()).flatten();
    let mut values: Vec<String> =
        predicates.filter(|p| p.get("type").is_some_and(is_equality)).filter_map(|p| text(p.get("value")?)).collect();
    values.sort();
    values.dedup();
    values
}

/// Whether a predicate's `type` is an equality.
fn is_equality(t: &serde_json::Value) -> bool {
    match t {
        serde_json::Value::String(s) => EQUALITY_PREDICATES.iter().any(|(name, _)| name == s),
        serde_json::Value::Number(n) => EQUALITY_PREDICATES.iter().any(|(_, k)| n.as_u64() == Some(*k)),
        _ => false,
    }
}

/// A scalar value as text; `None` for null, an array or an object.
fn text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The tables a read plan touches, as far as refract can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanTables {
    /// Every table it reads, sorted, without duplicates.
    Named(Vec<String>),
    /// It may reach stored data some way refract does not read (an index, a file, a script,
    /// an operator it does not know): only a backend that holds every table may run it.
    Unknown,
}

impl PlanTables {
    /// The tables, for a partial-replica check: empty when unknown, which only a backend
    /// holding everything covers.
    pub fn as_slice(&self) -> &[String] {
        match self {
            PlanTables::Named(t) => t,
            PlanTables::Unknown => &[],
        }
    }
}

/// Hyrise-R operators that reach stored data only through their inputs: the tables a plan of
/// them reads are those its `GetTable` operators name (`name`) and those any operator takes
/// as `input` (the query parser looks each up by name). From Hyrise-R's operator registry
/// (`QueryParser::registerPlanOperation`); an operator not listed here (an index scan, which
/// names an index; `MetaData`, `ScriptOperation`, the loaders and storage operators) makes the
/// plan's tables [`PlanTables::Unknown`].
const INPUT_ONLY_OPERATORS: [&str; 44] = [
    "AdhocSelection",
    "Barrier",
    "CreateRadixTable",
    "Distinct",
    "Division",
    "GetLastRecords",
    "GetTable",
    "GroupByScan",
    "HashBuild",
    "HashJoinProbe",
    "Histogram",
    "IntersectPositions",
    "JoinScan",
    "JsonTable",
    "MaterializingScan",
    "MergeHashTables",
    "MergePrefixSum",
    "MergeTable",
    "Mod",
    "Mult",
    "MultiplyRefField",
    "NestedLoopEquiJoin",
    "PipelineMergeHashTables",
    "PipelineStream",
    "PipeliningHashBuild",
    "PipeliningHashProbe",
    "PipeliningTableScan",
    "PrefixSum",
    "Print",
    "ProjectionScan",
    "RadixCluster",
    "RadixJoin",
    "SimplePipeliningTableScan",
    "SimpleTableScan",
    "SmallestTableScan",
    "SortScan",
    "SubString",
    "TableScan",
    "ValidatePositions",
    "Wait",
    "LayoutSingleTable",
    "LayoutTable",
    "Commit",
    "SettingsOperation",
];

/// The tables the operators of a read plan name (see [`INPUT_ONLY_OPERATORS`]).
fn plan_tables(ops: &serde_json::Map<String, serde_json::Value>) -> PlanTables {
    let mut tables = Vec::new();
    for op in ops.values() {
        match operator_tables(op) {
            Some(names) => tables.extend(names),
            None => return PlanTables::Unknown,
        }
    }
    tables.sort();
    tables.dedup();
    PlanTables::Named(tables)
}

/// The tables one operator names; `None` when refract cannot tell.
fn operator_tables(op: &serde_json::Value) -> Option<Vec<String>> {
    let kind = op.get("type")?.as_str()?;
    if !INPUT_ONLY_OPERATORS.contains(&kind) {
        return None;
    }
    let mut names = Vec::new();
    if kind == "GetTable" {
        names.push(op.get("name")?.as_str()?);
    }
    if let Some(input) = op.get("input") {
        for t in input.as_array()? {
            names.push(t.as_str()?);
        }
    }
    if names.iter().any(|n| n.is_empty()) {
        return None;
    }
    Some(names.into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> RequestHead {
        let raw = raw.replacen("HTTP/1.1\r\n", "HTTP/1.1\r\nHost: x\r\n", 1);
        RequestHead::parse(raw.as_bytes(), 8192).unwrap().unwrap()
    }

    fn form(plan: &str) -> Vec<u8> {
        form_urlencoded::Serializer::new(String::new()).append_pair("query", plan).finish().into_bytes()
    }

    #[test]
    fn defaults_by_method() {
        let c = Classifier::default();
        assert_eq!(c.classify(&head("GET /x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Read));
        assert_eq!(c.classify(&head("HEAD /x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Read));
        assert_eq!(c.classify(&head("POST /x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Write));
        assert_eq!(c.classify(&head("POST /procedure HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Procedure));
    }

    #[test]
    fn header_wins() {
        let c = Classifier::default();
        let h = head("GET /x HTTP/1.1\r\nx-refract-route: all\r\n\r\n");
        assert_eq!(c.classify(&h, b""), Ok(RouteClass::All));
        let bad = head("GET /x HTTP/1.1\r\nx-refract-route: sideways\r\n\r\n");
        assert!(c.classify(&bad, b"").is_err());
    }

    #[test]
    fn hyrise_plans() {
        let c = Classifier::default();
        let h = head("POST /query HTTP/1.1\r\nContent-Length: 1\r\n\r\n");
        assert!(c.needs_body(&h));
        let load = r#"{"operators":{"0":{"type":"TableLoad","table":"t","filename":"t.tbl"}}}"#;
        assert_eq!(c.classify(&h, &form(load)), Ok(RouteClass::All));
        let ins = r#"{"operators":{"0":{"type":"GetTable"},"1":{"type":"InsertScan"}}}"#;
        assert_eq!(c.classify(&h, &form(ins)), Ok(RouteClass::Write));
        let sel = r#"{"operators":{"0":{"type":"GetTable"},"1":{"type":"SimpleTableScan"}}}"#;
        assert_eq!(c.classify(&h, &form(sel)), Ok(RouteClass::Read));
        assert_eq!(c.classify(&h, sel.as_bytes()), Ok(RouteClass::Read));
        assert_eq!(c.classify(&h, b"query=%7Bnot json"), Ok(RouteClass::Write));
        let named = Some(PlanTables::Named(vec!["t".into()]));
        let sel_t = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"SimpleTableScan"}}}"#;
        assert_eq!(c.classify_with_tables(&h, sel_t.as_bytes()), Ok((RouteClass::Read, named)));
        let forced = head("POST /query HTTP/1.1\r\nx-refract-route: read\r\nContent-Length: 1\r\n\r\n");
        assert_eq!(c.classify_with_tables(&forced, sel.as_bytes()), Ok((RouteClass::Read, None)), "the header decides");
        let get = head("GET /x HTTP/1.1\r\n\r\n");
        assert_eq!(c.classify_with_tables(&get, b""), Ok((RouteClass::Read, None)), "no plan: any reader");
    }

    fn tables(plan: &str) -> Option<PlanTables> {
        read_plan(&form(plan)).1
    }

    fn named(v: &[&str]) -> Option<PlanTables> {
        Some(PlanTables::Named(v.iter().map(|s| s.to_string()).collect()))
    }

    #[test]
    fn a_read_plan_names_its_tables() {
        let scan = r#"{"operators":{"0":{"type":"GetTable","name":"a"},"1":{"type":"SimpleTableScan"}}}"#;
        assert_eq!(tables(scan), named(&["a"]));
        let join = r#"{"operators":{"0":{"type":"GetTable","name":"c"},"1":{"type":"GetTable","name":"a"},
            "2":{"type":"GetTable","name":"c"},"3":{"type":"JoinScan"}},"edges":[["0","3"],["1","3"]]}"#;
        assert_eq!(tables(join), named(&["a", "c"]), "sorted, once each");
        // Hyrise-R's query parser also looks up any operator's `input` by name.
        let input = r#"{"operators":{"0":{"type":"ProjectionScan","input":["b"],"fields":[0]}}}"#;
        assert_eq!(tables(input), named(&["b"]));
        assert_eq!(read_plan(scan.as_bytes()).1, named(&["a"]), "a bare JSON body too");
        let inline = r#"{"operators":{"0":{"type":"JsonTable","names":["x"],"data":[[1]]}}}"#;
        assert_eq!(tables(inline), named(&[]), "names no table: only a full copy may run it");
        assert_eq!(named(&[]).unwrap().as_slice(), &[] as &[String]);
    }

    #[test]
    fn a_read_plan_names_the_values_its_equality_predicates_look_up() {
        let plan = |preds: &str| {
            let ops = format!(
                r#"{{"operators":{{"0":{{"type":"GetTable","name":"t"}},"1":{{"type":"SimpleTableScan","predicates":[{preds}]}}}}}}"#
            );
            parse_read_plan(&form(&ops)).1.unwrap()
        };
        let one = plan(r#"{"type":"EQ","in":0,"f":"id","vtype":0,"value":42}"#);
        assert_eq!(one.values, ["42"]);
        assert_eq!(one.key_parts(), Some(vec![&b"t"[..], b"42"]));
        let and = plan(
            r#"{"type":"AND"},{"type":20,"in":0,"f":0,"vtype":2,"value":"b"},{"type":"EQ_R","in":0,"f":1,"value":"a"}"#,
        );
        assert_eq!(and.values, ["a", "b"], "sorted: the order of the predicates does not matter");
        let others = plan(r#"{"type":"LT","in":0,"f":"id","value":3},{"type":"EQ","value":[1]},{"type":1,"value":4}"#);
        assert_eq!(others.values, Vec::<String>::new(), "ranges and lists are no key");
        assert_eq!(others.key_parts(), Some(vec![&b"t"[..]]), "the table alone");
        let dup = plan(r#"{"type":"OR"},{"type":"EQ","value":7},{"type":0,"value":7},{"type":"EQ","value":true}"#);
        assert_eq!(dup.values, ["7", "true"]);
        // A plan whose tables are unknown or none has no key.
        let index = r#"{"operators":{"0":{"type":"IndexScan","index":"i","predicates":[{"type":"EQ","value":1}]}}}"#;
        assert_eq!(parse_read_plan(index.as_bytes()).1.unwrap().key_parts(), None);
        let inline = r#"{"operators":{"0":{"type":"JsonTable","names":["x"],"data":[[1]]}}}"#;
        assert_eq!(parse_read_plan(inline.as_bytes()).1.unwrap().key_parts(), None);
        let h = head("POST /query HTTP/1.1\r\nContent-Length: 1\r\n\r\n");
        let scan = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"TableScan","predicates":[{"type":"EQ","value":"x"}]}}}"#;
        let (class, read) = Classifier::default().classify_read(&h, &form(scan)).unwrap();
        assert_eq!((class, read.map(|r| r.values)), (RouteClass::Read, Some(vec!["x".to_string()])));
    }

    #[test]
    fn a_plan_whose_tables_cannot_all_be_named_is_unknown() {
        let unknown = Some(PlanTables::Unknown);
        for plan in [
            // An index scan names an index, not a table; MetaData and scripts reach any table.
            r#"{"operators":{"0":{"type":"GetTable","name":"a"},"1":{"type":"IndexScan","index":"i"}}}"#,
            r#"{"operators":{"0":{"type":"MetaData","input":["a"]}}}"#,
            r#"{"operators":{"0":{"type":"ScriptOperation","script":"s"}}}"#,
            r#"{"operators":{"0":{"type":"SomethingNew"}}}"#,
            r#"{"operators":{"0":{"name":"a"}}}"#,
            r#"{"operators":{"0":{"type":"GetTable"}}}"#,
            r#"{"operators":{"0":{"type":"GetTable","name":7}}}"#,
            r#"{"operators":{"0":{"type":"GetTable","name":""}}}"#,
            r#"{"operators":{"0":{"type":"SortScan","input":"a"}}}"#,
            r#"{"operators":{"0":{"type":"SortScan","input":["a",1]}}}"#,
        ] {
            assert_eq!(tables(plan), unknown, "{plan}");
            assert_eq!(unknown.as_ref().map(PlanTables::as_slice), Some(&[] as &[String]));
        }
    }

    #[test]
    fn only_reads_name_tables_and_bad_plans_stay_writes() {
        let load = r#"{"operators":{"0":{"type":"TableLoad","table":"t","filename":"t.tbl"}}}"#;
        assert_eq!(read_plan(&form(load)), (RouteClass::All, None));
        let ins = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"InsertScan"}}}"#;
        assert_eq!(read_plan(&form(ins)), (RouteClass::Write, None));
        for bad in [&b"query=%7Bnot json"[..], b"{\"operators\":[]}", b"[1]", b"query=1"] {
            assert_eq!(read_plan(bad), (RouteClass::Write, None));
        }
    }

    #[test]
    fn configured_rules() {
        let rule = RouteRule { method: Some("post".into()), path_prefix: "/search".into(), class: RouteClass::Read };
        let c = Classifier::new(vec![rule]);
        assert_eq!(c.classify(&head("POST /search/x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Read));
        assert_eq!(c.classify(&head("PUT /search/x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Write));
        // The path of an absolute-form target is what the rules see.
        assert_eq!(c.classify(&head("POST http://x/search/x HTTP/1.1\r\n\r\n"), b""), Ok(RouteClass::Read));
    }
}
