//! Route classes and request classification. Order: the `x-refract-route` header; Hyrise-R
//! `POST /query` plans (write operators → write, TableLoad → all, else read); `/procedure` →
//! procedure; configured rules (method + path prefix); GET/HEAD → read, anything else → write.

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
        if let Some(hint) = &head.route_hint {
            return parse_hint(hint);
        }
        if is_query_plan(head) {
            return Ok(classify_plan(body));
        }
        if head.path() == "/procedure" || head.path().starts_with("/procedure/") {
            return Ok(RouteClass::Procedure);
        }
        if let Some(rule) = self.rules.iter().find(|r| rule_matches(r, head)) {
            return Ok(rule.class);
        }
        Ok(match head.method.as_str() {
            "GET" | "HEAD" => RouteClass::Read,
            _ => RouteClass::Write,
        })
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

/// The plan's operator types: from a form body (`query=<JSON>`) or a bare JSON body.
pub fn plan_operator_types(body: &[u8]) -> Option<Vec<String>> {
    let json: serde_json::Value = if body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice(body).ok()?
    } else {
        let (_, q) = form_urlencoded::parse(body).find(|(k, _)| k == "query")?;
        serde_json::from_str(&q).ok()?
    };
    let ops = json.get("operators")?.as_object()?;
    Some(ops.values().filter_map(|op| op.get("type")?.as_str().map(str::to_owned)).collect())
}

/// Classifies a Hyrise-R plan. An unreadable plan goes to the primary (class write): it is the
/// safe place, and the primary answers with its own error.
pub fn classify_plan(body: &[u8]) -> RouteClass {
    let Some(types) = plan_operator_types(body) else {
        return RouteClass::Write;
    };
    if types.iter().any(|t| t == "TableLoad") {
        RouteClass::All
    } else if types.iter().any(|t| WRITE_OPERATORS.contains(&t.as_str())) {
        RouteClass::Write
    } else {
        RouteClass::Read
    }
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
