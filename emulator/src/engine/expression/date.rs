//! Dates, in UTC (no time zones, like mongod's default): `$year $month $dayOfMonth $hour
//! $minute $second $millisecond $dayOfWeek $dayOfYear $dateToString`.

use bson::Bson;

use super::{unrecognized, Ctx};
use crate::engine::value::bson_type_name;
use crate::engine::{EngineError, EngineResult};

/// A UTC calendar breakdown of a millisecond timestamp (no time zones, like mongod's default).
struct CivilTime {
    year: i32,
    month: i32,
    day: i32,
    hour: i32,
    minute: i32,
    second: i32,
    millis: i32,
    /// 1 = Sunday ... 7 = Saturday, as `$dayOfWeek` reports.
    weekday: i32,
    day_of_year: i32,
}

impl CivilTime {
    fn from_millis(ms: i64) -> Self {
        let days = ms.div_euclid(86_400_000);
        let in_day = ms.rem_euclid(86_400_000);
        // Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let before = cumulative
            .get(usize::try_from(month - 1).unwrap_or(0))
            .copied()
            .unwrap_or(0);
        let day_of_year = before + day + i64::from(leap && month > 2);
        // 1970-01-01 was a Thursday (weekday 5 when Sunday is 1).
        let weekday = (days + 4).rem_euclid(7) + 1;
        let clamp = |v: i64| i32::try_from(v).unwrap_or(i32::MAX);
        CivilTime {
            year: clamp(year),
            month: clamp(month),
            day: clamp(day),
            hour: clamp(in_day / 3_600_000),
            minute: clamp(in_day / 60_000 % 60),
            second: clamp(in_day / 1000 % 60),
            millis: clamp(in_day % 1000),
            weekday: clamp(weekday),
            day_of_year: clamp(day_of_year),
        }
    }

    fn format(&self, format: &str) -> EngineResult<String> {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('Y') => out.push_str(&format!("{:04}", self.year)),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('H') => out.push_str(&format!("{:02}", self.hour)),
                Some('M') => out.push_str(&format!("{:02}", self.minute)),
                Some('S') => out.push_str(&format!("{:02}", self.second)),
                Some('L') => out.push_str(&format!("{:03}", self.millis)),
                Some('j') => out.push_str(&format!("{:03}", self.day_of_year)),
                Some('u') => out.push_str(&format!(
                    "{}",
                    if self.weekday == 1 {
                        7
                    } else {
                        self.weekday - 1
                    }
                )),
                Some('w') => out.push_str(&format!("{}", self.weekday)),
                Some('Z') => out.push_str("+0000"),
                Some('z') => out.push('0'),
                Some('%') => out.push('%'),
                other => {
                    return Err(EngineError::location(
                        18536,
                        format!(
                            "Invalid format character '%{}' in format string",
                            other.unwrap_or(' ')
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }
}

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn date_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$year" | "$month" | "$dayOfMonth" | "$hour" | "$minute" | "$second"
            | "$millisecond" | "$dayOfWeek" | "$dayOfYear" => {
                let date_expr = match arg {
                    Bson::Document(d) if d.contains_key("date") => {
                        d.get("date").unwrap_or(&Bson::Null)
                    }
                    Bson::Array(items) if items.len() == 1 => &items[0],
                    other => other,
                };
                let millis = match self.eval(date_expr)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::DateTime(d)) => d.timestamp_millis(),
                    Some(Bson::Timestamp(t)) => i64::from(t.time) * 1000,
                    Some(Bson::ObjectId(o)) => o.timestamp().timestamp_millis(),
                    Some(other) => {
                        return Err(EngineError::location(
                            16006,
                            format!(
                                "can't convert from BSON type {} to Date",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let parts = CivilTime::from_millis(millis);
                Bson::Int32(match op {
                    "$year" => parts.year,
                    "$month" => parts.month,
                    "$dayOfMonth" => parts.day,
                    "$hour" => parts.hour,
                    "$minute" => parts.minute,
                    "$second" => parts.second,
                    "$millisecond" => parts.millis,
                    "$dayOfWeek" => parts.weekday,
                    _ => parts.day_of_year,
                })
            }
            "$dateToString" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        18629,
                        "$dateToString only supports an object as its argument",
                    ));
                };
                let format = match spec
                    .get("format")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    None => "%Y-%m-%dT%H:%M:%S.%LZ".to_owned(),
                    Some(Bson::String(f)) => f,
                    Some(_) => {
                        return Err(EngineError::location(
                            18533,
                            "$dateToString requires that 'format' be a string",
                        ))
                    }
                };
                let millis = match spec
                    .get("date")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => {
                        return match spec.get("onNull") {
                            Some(e) => self.eval(e),
                            None => Ok(Some(Bson::Null)),
                        };
                    }
                    Some(Bson::DateTime(d)) => d.timestamp_millis(),
                    Some(other) => {
                        return Err(EngineError::location(
                            16006,
                            format!(
                                "can't convert from BSON type {} to Date",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                Bson::String(CivilTime::from_millis(millis).format(&format)?)
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
