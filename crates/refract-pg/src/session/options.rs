//! The startup packet's `options` (`-c name=value`, `--name=value`, as libpq's `options` and
//! `PGOPTIONS` pass them), split and read the way PostgreSQL's `pg_split_opts` and
//! `process_postgres_switches` do: whitespace separates arguments, a backslash escapes the
//! next character, `-` in a name is `_`.

/// Why `options` were refused: PostgreSQL's SQLSTATE and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionsError {
    /// SQLSTATE.
    pub code: &'static str,
    /// Message.
    pub message: String,
}

/// The settings (lower-case name, value) that `options` asks for, in order.
pub fn parse_options(options: &str) -> Result<Vec<(String, String)>, OptionsError> {
    let args = split(options);
    let mut settings = vec![];
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, setting) = if let Some(rest) = arg.strip_prefix("--") {
            ("--", rest.to_owned())
        } else if arg == "-c" {
            i += 1;
            let next = args.get(i).ok_or_else(|| syntax("option requires an argument -- 'c'".into()))?;
            ("-c ", next.clone())
        } else if let Some(rest) = arg.strip_prefix("-c") {
            ("-c ", rest.to_owned())
        } else if arg.starts_with('-') {
            return Err(OptionsError {
                code: "0A000",
                message: format!(
                    "refract: startup option \"{arg}\" is not supported (only -c name=value, --name=value)"
                ),
            });
        } else {
            return Err(syntax(format!("invalid command-line argument for server process: {arg}")));
        };
        let Some((name, value)) = setting.split_once('=') else {
            return Err(syntax(format!("{flag}{setting} requires a value")));
        };
        settings.push((name.replace('-', "_").to_ascii_lowercase(), value.to_owned()));
        i += 1;
    }
    Ok(settings)
}

fn syntax(message: String) -> OptionsError {
    OptionsError { code: "42601", message }
}

/// Whitespace-separated arguments; `\x` is `x`.
fn split(options: &str) -> Vec<String> {
    let mut args = vec![];
    let mut chars = options.chars();
    let mut current: Option<String> = None;
    while let Some(c) = chars.next() {
        match c {
            c if c.is_ascii_whitespace() => {
                if let Some(a) = current.take() {
                    args.push(a);
                }
            }
            '\\' => current.get_or_insert_with(String::new).extend(chars.next()),
            c => current.get_or_insert_with(String::new).push(c),
        }
    }
    args.extend(current);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Vec<(String, String)> {
        parse_options(s).unwrap()
    }

    #[test]
    fn reads_settings() {
        assert_eq!(ok(""), vec![]);
        assert_eq!(
            ok(" -c statement_timeout=5s  --search-path=a,b -cDateStyle=ISO -c app.x=a\\ b\\\\"),
            vec![
                ("statement_timeout".into(), "5s".into()),
                ("search_path".into(), "a,b".into()),
                ("datestyle".into(), "ISO".into()),
                ("app.x".into(), "a b\\".into()),
            ]
        );
    }

    #[test]
    fn refuses_what_postgres_refuses() {
        let code = |s: &str| parse_options(s).unwrap_err().code;
        assert_eq!(code("-c statement_timeout"), "42601");
        assert_eq!(code("--work_mem"), "42601");
        assert_eq!(code("-c"), "42601");
        assert_eq!(code("stray"), "42601");
        assert_eq!(code("-B 100"), "0A000");
    }
}
