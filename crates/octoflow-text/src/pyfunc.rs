//! Python behaviours chat templates rely on: `json.dumps` formatting (`", "` and `": "`
//! separators, non-ASCII kept, optional indent) and `strftime` on the current UTC time.

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// Writes `value` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` would.
pub(crate) fn python_json<T: Serialize>(
    value: &T,
    indent: Option<usize>,
) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)?;
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            value.serialize(&mut ser)?;
        }
    }
    // serde_json writes only valid UTF-8.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        CompactFormatter.write_f64(w, value)
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Formats the UTC time `secs` after the Unix epoch with the strftime directives
/// `%Y %y %m %d %H %M %S %b %B %j %%`; other directives are copied through.
pub(crate) fn strftime_utc(format: &str, secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem / 60 % 60, rem % 60);
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01, proleptic Gregorian calendar,
/// by counting 400-year eras of 146,097 days from 0000-03-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
    let mp = (5 * doy + 2) / 153; // March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        for d in [-1000, 0, 59, 60, 11_016, 20_000, 60_000] {
            let (y, m, day) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, day), d);
        }
    }

    #[test]
    fn strftime_formats_the_directives_templates_use() {
        // 2024-07-26 13:05:09 UTC
        let t = 1_721_999_109;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %B %j %%", t),
            "2024-07-26 13:05:09 July 208 %"
        );
    }

    #[test]
    fn json_uses_python_separators_and_keeps_unicode() {
        let v = serde_json::json!({"a": [1, "é"], "b": {}});
        assert_eq!(
            python_json(&v, None).unwrap(),
            r#"{"a": [1, "é"], "b": {}}"#
        );
        assert_eq!(
            python_json(&v, Some(2)).unwrap(),
            "{\n  \"a\": [\n    1,\n    \"é\"\n  ],\n  \"b\": {}\n}"
        );
    }
}
