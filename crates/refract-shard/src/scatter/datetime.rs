//! Dates and timestamps in PostgreSQL's ISO text output (`DateStyle` ISO) as one number each,
//! so they compare in time order: years beyond 9999, BC dates, UTC offsets and the infinities
//! included (which plain string comparison gets wrong).

/// Microseconds per day.
const DAY: i128 = 86_400_000_000;

/// `date_out` in ISO style: `YYYY-MM-DD[ BC]`, `infinity`, `-infinity`; days since 1970.
pub fn date(t: &str) -> Option<i128> {
    if let Some(inf) = infinity(t) {
        return Some(inf);
    }
    let (body, bc) = era(t);
    days(body, bc)
}

/// `timestamp_out`/`timestamptz_out` in ISO style: `YYYY-MM-DD HH:MM:SS[.f][+HH[:MM[:SS]]][ BC]`;
/// microseconds since 1970 UTC. The offset is required when `tz` and refused otherwise.
pub fn timestamp(t: &str, tz: bool) -> Option<i128> {
    if let Some(inf) = infinity(t) {
        return Some(inf);
    }
    let (body, bc) = era(t);
    let (day, clock) = body.split_once(' ')?;
    let (clock, offset) = match clock.find(['+', '-']) {
        Some(at) if tz => (&clock[..at], offset_micros(&clock[at..])?),
        None if !tz => (clock, 0),
        _ => return None,
    };
    Some(days(day, bc)? * DAY + time_micros(clock)? - offset)
}

fn infinity(t: &str) -> Option<i128> {
    match t {
        "infinity" => Some(i128::MAX),
        "-infinity" => Some(i128::MIN),
        _ => None,
    }
}

fn era(t: &str) -> (&str, bool) {
    match t.strip_suffix(" BC") {
        Some(body) => (body, true),
        None => (t, false),
    }
}

/// Digits only, at most nine (PostgreSQL's years have six): no arithmetic below can overflow.
fn num(s: &str) -> Option<i64> {
    let ok = (1..=9).contains(&s.len()) && s.bytes().all(|c| c.is_ascii_digit());
    ok.then(|| s.parse().ok()).flatten()
}

/// `YYYY-MM-DD` as days since 1970-01-01 in the proleptic Gregorian calendar (PostgreSQL's);
/// year N BC is astronomical year 1 - N.
fn days(s: &str, bc: bool) -> Option<i128> {
    let mut parts = s.splitn(3, '-');
    let (y, m, d) = (num(parts.next()?)?, num(parts.next()?)?, num(parts.next()?)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if bc { 1 - y } else { y };
    Some(i128::from(days_from_civil(y, m, d)))
}

/// Howard Hinnant's `days_from_civil`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `HH:MM:SS[.ffffff]`.
fn time_micros(s: &str) -> Option<i128> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut hms = whole.splitn(3, ':');
    let (h, m, sec) = (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?);
    if frac.len() > 6 || (!frac.is_empty() && num(frac).is_none()) {
        return None;
    }
    let micros = format!("{frac:0<6}").parse::<i64>().ok()?;
    Some(i128::from(((h * 60 + m) * 60 + sec) * 1_000_000 + micros))
}

/// `+HH[:MM[:SS]]` / `-HH...`.
fn offset_micros(s: &str) -> Option<i128> {
    let (sign, rest) = (if s.starts_with('-') { -1 } else { 1 }, &s[1..]);
    let mut parts = rest.split(':');
    let h = num(parts.next()?)?;
    let m = parts.next().map_or(Some(0), num)?;
    let sec = parts.next().map_or(Some(0), num)?;
    Some(sign * i128::from((h * 60 + m) * 60 + sec) * 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_forms_read_in_time_order() {
        assert_eq!(date("1970-01-01"), Some(0));
        assert_eq!(date("2000-03-01"), Some(11_017));
        assert_eq!(date("0001-12-31 BC"), Some(date("0001-01-01").unwrap() - 1));
        assert_eq!(timestamp("1970-01-01 00:00:01.5+01", true), Some(1_500_000 - 3_600_000_000));
        assert_eq!(timestamp("1970-01-01 00:00:00+05:30:15", true), Some(-19_815_000_000));
        assert_eq!(timestamp("1970-01-02 00:00:00", false), Some(DAY));
        assert_eq!(timestamp("1970-01-02 00:00:00", true), None);
        assert_eq!(timestamp("1970-01-02 00:00:00+00", false), None);
        assert_eq!(date("2020-13-01"), None);
        assert_eq!(timestamp("infinity", true), Some(i128::MAX));
        assert_eq!(date("99999999999999999999-01-01"), None);
    }
}
