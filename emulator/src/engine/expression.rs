//! Aggregation expression evaluation (`$project`, `$addFields`, `$group`, `$expr`, ...).

use std::cell::RefCell;
use std::cmp::Ordering;

use bson::{Bson, Document};

use super::compare::compare_bson;
use super::limits::{check_depth, check_value_depth};
use super::pattern::compile_regex;
use super::value::{bson_type_name, Num};
use super::{EngineError, EngineResult};

/// Evaluates the aggregation expression `expr` with `root` as `$$ROOT` and `$$CURRENT`.
///
/// Supports field paths (`"$a.b"`, mapped over arrays), system variables (`$$ROOT`,
/// `$$CURRENT`, `$$REMOVE`, `$$NOW`), `$let`/`$map`/`$filter` variables, literals, `$literal`,
/// object and array literals, and the operators `$add $subtract $multiply $divide $mod $abs
/// $concat $toUpper $toLower $strLenCP $eq $ne $gt $gte $lt $lte $cmp $and $or $not $cond
/// $ifNull $size $arrayElemAt $first $last $in $concatArrays $isArray $type $toString $sum $avg
/// $min $max $stdDevPop $stdDevSamp $mergeObjects $let $map $filter $floor $ceil $trunc $round
/// $toInt $toLong $toDouble $toBool $slice $reverseArray $range $split $substrCP $strcasecmp
/// $indexOfArray $objectToArray $arrayToObject $setUnion $switch $reduce $regexMatch $trim
/// $ltrim $rtrim $sqrt $exp $ln $log10 $pow $year $month $dayOfMonth $hour $minute $second
/// $millisecond $dayOfWeek $dayOfYear $dateToString` (dates in UTC). Command `let` variables bound with
/// [`with_variables`] resolve as `$$name`. A missing value evaluates to `null`. Unknown
/// operators fail with 168 InvalidPipelineOperator.
pub fn evaluate(expr: &Bson, root: &Document) -> EngineResult<Bson> {
    check_value_depth(expr)?;
    Ok(eval_opt(expr, root)?.unwrap_or(Bson::Null))
}

/// Evaluates without the depth check; `None` means "missing" (the field is then omitted by
/// `$project`/`$addFields`, and `$$REMOVE` evaluates to it).
pub(crate) fn eval_opt(expr: &Bson, root: &Document) -> EngineResult<Option<Bson>> {
    let mut ctx = Ctx {
        root,
        vars: Vec::new(),
    };
    ctx.eval(expr)
}

thread_local! {
    /// Variables bound by a command's `let` option for the duration of [`with_variables`].
    static COMMAND_VARIABLES: RefCell<Vec<(String, Bson)>> = const { RefCell::new(Vec::new()) };
}

fn command_variable(name: &str) -> Option<Bson> {
    COMMAND_VARIABLES.with(|v| {
        v.borrow()
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    })
}

/// Runs `f` with the variables of a command's `let` option (`find`, `aggregate`, `update`,
/// `delete`, `findAndModify`) bound, so `$$name` resolves inside `$expr`, projections,
/// pipelines and pipeline updates. Each value is an expression evaluated once, up front.
/// Names must start with a lowercase ASCII letter or a non-ASCII character, as in mongod
/// (2 BadValue otherwise).
///
/// ```text
/// let docs = engine::with_variables(&let_doc, || store.find(db, coll, &spec))??;
/// ```
pub fn with_variables<R>(vars: &Document, f: impl FnOnce() -> R) -> EngineResult<R> {
    check_depth(vars)?;
    let bound = evaluate_variables(vars, &Document::new())?;
    Ok(bind_variables(bound, f))
}

/// Evaluates `let`-style variable definitions against `root`, validating the names.
pub(crate) fn evaluate_variables(
    vars: &Document,
    root: &Document,
) -> EngineResult<Vec<(String, Bson)>> {
    let mut bound = Vec::with_capacity(vars.len());
    for (name, expr) in vars {
        let valid_start = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || !c.is_ascii());
        if !valid_start
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || !c.is_ascii())
        {
            return Err(EngineError::bad_value(format!(
                "'{name}' starts with an invalid character for a user variable name"
            )));
        }
        bound.push((name.clone(), eval_opt(expr, root)?.unwrap_or(Bson::Null)));
    }
    Ok(bound)
}

/// Runs `f` with already evaluated variables bound on top of the current ones.
pub(crate) fn bind_variables<R>(bound: Vec<(String, Bson)>, f: impl FnOnce() -> R) -> R {
    /// Restores the outer bindings even if `f` unwinds.
    struct Restore(Vec<(String, Bson)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = std::mem::take(&mut self.0);
            COMMAND_VARIABLES.with(|v| *v.borrow_mut() = outer);
        }
    }
    let outer = COMMAND_VARIABLES.with(|v| {
        let mut current = v.borrow_mut();
        let outer = current.clone();
        current.extend(bound);
        outer
    });
    let _restore = Restore(outer);
    f()
}

/// Truthiness as `$cond`, `$and`, `$expr` use it: false, null, undefined, missing and numeric
/// zero are false.
pub(crate) fn is_truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null | Bson::Undefined => false,
        other => match Num::of(other) {
            Some(Num::Int(i)) => i != 0,
            Some(Num::Float(f)) => f != 0.0,
            None => true,
        },
    }
}

/// Numeric binary operations shared by expressions, `$inc`/`$mul` and `$sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
}

/// `a op b` with mongod's type promotion: int32 stays int32 unless it overflows (then int64),
/// int64 overflows to double, and any double makes a double. `None` if either is not a number.
pub(crate) fn arith(op: Arith, a: &Bson, b: &Bson) -> Option<Bson> {
    let (x, y) = (Num::of(a)?, Num::of(b)?);
    let both_i32 = matches!((a, b), (Bson::Int32(_), Bson::Int32(_)));
    let as_double = |p: f64, q: f64| match op {
        Arith::Add => p + q,
        Arith::Sub => p - q,
        Arith::Mul => p * q,
    };
    match (x, y) {
        (Num::Int(p), Num::Int(q))
            if !matches!(a, Bson::Decimal128(_)) && !matches!(b, Bson::Decimal128(_)) =>
        {
            let exact = match op {
                Arith::Add => p.checked_add(q),
                Arith::Sub => p.checked_sub(q),
                Arith::Mul => p.checked_mul(q),
            };
            match exact {
                Some(r) if both_i32 => {
                    Some(i32::try_from(r).map(Bson::Int32).unwrap_or(Bson::Int64(r)))
                }
                Some(r) => Some(Bson::Int64(r)),
                None => Some(Bson::Double(as_double(p as f64, q as f64))),
            }
        }
        _ => Some(Bson::Double(as_double(x.as_f64(), y.as_f64()))),
    }
}

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

struct Ctx<'a> {
    root: &'a Document,
    vars: Vec<(String, Bson)>,
}

fn path_value(v: &Bson, parts: &[&str]) -> Option<Bson> {
    let Some((first, rest)) = parts.split_first() else {
        return Some(v.clone());
    };
    match v {
        Bson::Document(d) => path_value(d.get(*first)?, rest),
        Bson::Array(items) => Some(Bson::Array(
            items
                .iter()
                .filter(|i| matches!(i, Bson::Document(_) | Bson::Array(_)))
                .filter_map(|i| path_value(i, parts))
                .collect(),
        )),
        _ => None,
    }
}

/// [`path_value`] starting at a document, without wrapping (copying) it into a `Bson`.
fn doc_path_value(doc: &Document, parts: &[&str]) -> Option<Bson> {
    let (first, rest) = parts.split_first()?;
    path_value(doc.get(*first)?, rest)
}

fn is_nullish(v: &Option<Bson>) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

impl Ctx<'_> {
    fn eval(&mut self, expr: &Bson) -> EngineResult<Option<Bson>> {
        match expr {
            Bson::String(s) if s.starts_with("$$") => self.variable(&s[2..]),
            Bson::String(s) if s.starts_with('$') => {
                let path = &s[1..];
                if path.is_empty() {
                    return Err(EngineError::location(
                        16872,
                        "'$' by itself is not a valid FieldPath",
                    ));
                }
                let parts: Vec<&str> = path.split('.').collect();
                Ok(doc_path_value(self.root, &parts))
            }
            Bson::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    out.push(self.eval(item)?.unwrap_or(Bson::Null));
                }
                Ok(Some(Bson::Array(out)))
            }
            Bson::Document(d) => {
                let mut keys = d.keys();
                match keys.next() {
                    Some(k) if k.starts_with('$') => {
                        if d.len() != 1 {
                            return Err(EngineError::location(
                                15983,
                                format!("an expression specification must contain exactly one field, the name of the expression. Found {} fields", d.len()),
                            ));
                        }
                        let arg = d.get(k).unwrap_or(&Bson::Null);
                        self.operator(k, arg)
                    }
                    _ => {
                        let mut out = Document::new();
                        for (k, v) in d {
                            if k.starts_with('$') {
                                return Err(EngineError::location(16410, format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. Found: {k}")));
                            }
                            if let Some(val) = self.eval(v)? {
                                out.insert(k.clone(), val);
                            }
                        }
                        Ok(Some(Bson::Document(out)))
                    }
                }
            }
            other => Ok(Some(other.clone())),
        }
    }

    fn variable(&mut self, spec: &str) -> EngineResult<Option<Bson>> {
        let (name, rest) = match spec.split_once('.') {
            Some((n, r)) => (n, Some(r)),
            None => (spec, None),
        };
        let base = match name {
            // Avoid copying the whole document when only a field of it is wanted.
            "ROOT" | "CURRENT" => match rest {
                Some(r) => {
                    let parts: Vec<&str> = r.split('.').collect();
                    return Ok(doc_path_value(self.root, &parts));
                }
                None => Bson::Document(self.root.clone()),
            },
            "REMOVE" => return Ok(None),
            "NOW" => Bson::DateTime(bson::DateTime::now()),
            _ => match self
                .vars
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .or_else(|| command_variable(name))
            {
                Some(v) => v,
                None => {
                    return Err(EngineError::location(
                        17276,
                        format!("Use of undefined variable: {name}"),
                    ));
                }
            },
        };
        match rest {
            None => Ok(Some(base)),
            Some(r) => {
                let parts: Vec<&str> = r.split('.').collect();
                Ok(path_value(&base, &parts))
            }
        }
    }

    /// Evaluates an operator's argument list (a single non-array argument counts as one).
    fn args(&mut self, arg: &Bson) -> EngineResult<Vec<Option<Bson>>> {
        match arg {
            Bson::Array(items) => items.iter().map(|i| self.eval(i)).collect(),
            other => Ok(vec![self.eval(other)?]),
        }
    }

    fn exact_args(&mut self, op: &str, arg: &Bson, n: usize) -> EngineResult<Vec<Option<Bson>>> {
        let args = self.args(arg)?;
        if args.len() != n {
            return Err(EngineError::location(
                16020,
                format!(
                    "Expression {op} takes exactly {n} arguments. {} were passed in.",
                    args.len()
                ),
            ));
        }
        Ok(args)
    }

    /// `$getField`, `$setField` and `$unsetField` (5.0): read, set or remove one field named
    /// literally, so names with dots or a leading `$` work. `field` must be a constant string
    /// (a `$literal` one included); `input` defaults to `$$CURRENT` for `$getField` and must be
    /// a document, null or missing for the others. `$setField` with `value: "$$REMOVE"` removes.
    fn field_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let spec = match (op, arg) {
            ("$getField", Bson::String(_)) => {
                let mut d = Document::new();
                d.insert("field", arg.clone());
                d
            }
            (_, Bson::Document(d)) => d.clone(),
            _ => {
                return Err(EngineError::failed_to_parse(format!(
                    "{op} only supports an object as its argument"
                )))
            }
        };
        let allowed: &[&str] = match op {
            "$setField" => &["field", "input", "value"],
            _ => &["field", "input"],
        };
        if let Some(extra) = spec.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(EngineError::failed_to_parse(format!(
                "{op} found an unknown argument: {extra}"
            )));
        }
        let field = match spec.get("field") {
            Some(Bson::String(s)) if !s.starts_with('$') => s.clone(),
            Some(Bson::Document(d)) if d.len() == 1 => match d.get("$literal") {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(EngineError::location(
                        4161106,
                        format!("{op} requires 'field' to evaluate to a constant string"),
                    ))
                }
            },
            Some(_) => {
                return Err(EngineError::location(
                    4161106,
                    format!("{op} requires 'field' to evaluate to a constant string"),
                ))
            }
            None => {
                return Err(EngineError::location(
                    4161102,
                    format!("{op} requires 'field' to be specified"),
                ))
            }
        };
        let input = match spec.get("input") {
            Some(expr) => self.eval(expr)?,
            None if op == "$getField" => Some(Bson::Document(self.root.clone())),
            None => {
                return Err(EngineError::location(
                    4161109,
                    format!("{op} requires 'input' to be specified"),
                ))
            }
        };
        let input = match input {
            None => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Null) | Some(Bson::Undefined) => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Document(d)) => d,
            Some(other) if op == "$getField" => {
                return Err(EngineError::location(
                    3041705,
                    format!(
                        "$getField requires 'input' to evaluate to type Object, but got {}",
                        bson_type_name(&other)
                    ),
                ))
            }
            Some(other) => {
                return Err(EngineError::location(
                    4161105,
                    format!(
                        "{op} requires 'input' to evaluate to type Object, but got {}",
                        bson_type_name(&other)
                    ),
                ))
            }
        };
        match op {
            "$getField" => Ok(input.get(&field).cloned()),
            _ => {
                let value = match (op, spec.get("value")) {
                    ("$unsetField", _) => None,
                    (_, Some(expr)) => self.eval(expr)?,
                    (_, None) => {
                        return Err(EngineError::location(
                            4161103,
                            "$setField requires 'value' to be specified",
                        ))
                    }
                };
                let mut out = input;
                match value {
                    // Replacing keeps the field's position, as mongod does.
                    Some(v) => {
                        out.insert(field, v);
                    }
                    None => {
                        out.remove(&field);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
        }
    }

    fn operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$literal" => arg.clone(),
            // A double in [0, 1), drawn anew at each evaluation.
            "$rand" => match arg {
                Bson::Document(d) if d.is_empty() => Bson::Double(rand::random::<f64>()),
                _ => {
                    return Err(EngineError::location(
                        10065,
                        "invalid parameter: expected an object ($rand)",
                    ))
                }
            },
            "$getField" | "$setField" | "$unsetField" => return self.field_operator(op, arg),
            "$add" | "$multiply" => {
                let args = self.args(arg)?;
                let is_add = op == "$add";
                let mut acc = if is_add {
                    Bson::Int32(0)
                } else {
                    Bson::Int32(1)
                };
                let mut date: Option<i64> = None;
                for a in args {
                    let Some(a) = a.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) else {
                        return Ok(Some(Bson::Null));
                    };
                    if let (true, Bson::DateTime(dt)) = (is_add, &a) {
                        if date.is_some() {
                            return Err(EngineError::location(
                                16612,
                                "only one date allowed in an $add expression",
                            ));
                        }
                        date = Some(dt.timestamp_millis());
                        continue;
                    }
                    acc = arith(if is_add { Arith::Add } else { Arith::Mul }, &acc, &a)
                        .ok_or_else(|| {
                            EngineError::type_mismatch(format!(
                                "{op} only supports numeric{} types, not {}",
                                if is_add { " or date" } else { "" },
                                bson_type_name(&a)
                            ))
                        })?;
                }
                match date {
                    Some(ms) => {
                        let delta = Num::of(&acc).map(|n| n.as_f64()).unwrap_or(0.0);
                        Bson::DateTime(bson::DateTime::from_millis(
                            ms.saturating_add(delta.round() as i64),
                        ))
                    }
                    None => acc,
                }
            }
            "$subtract" => {
                let args = self.exact_args(op, arg, 2)?;
                let (Some(a), Some(b)) = (&args[0], &args[1]) else {
                    return Ok(Some(Bson::Null));
                };
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                match (a, b) {
                    (Bson::DateTime(x), Bson::DateTime(y)) => {
                        Bson::Int64(x.timestamp_millis().saturating_sub(y.timestamp_millis()))
                    }
                    (Bson::DateTime(x), n) if Num::of(n).is_some() => {
                        let delta = Num::of(n).map(|n| n.as_f64()).unwrap_or(0.0);
                        Bson::DateTime(bson::DateTime::from_millis(
                            x.timestamp_millis().saturating_sub(delta.round() as i64),
                        ))
                    }
                    _ => arith(Arith::Sub, a, b).ok_or_else(|| {
                        EngineError::type_mismatch(format!(
                            "can't $subtract {} from {}",
                            bson_type_name(b),
                            bson_type_name(a)
                        ))
                    })?,
                }
            }
            "$divide" | "$mod" => {
                let args = self.exact_args(op, arg, 2)?;
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                let (a, b) = (
                    args[0].clone().unwrap_or(Bson::Null),
                    args[1].clone().unwrap_or(Bson::Null),
                );
                let (Some(x), Some(y)) = (Num::of(&a), Num::of(&b)) else {
                    return Err(EngineError::type_mismatch(format!(
                        "{op} only supports numeric types, not {} and {}",
                        bson_type_name(&a),
                        bson_type_name(&b)
                    )));
                };
                if y.as_f64() == 0.0 {
                    return Err(EngineError::bad_value(if op == "$divide" {
                        "can't $divide by zero"
                    } else {
                        "can't $mod by zero"
                    }));
                }
                if op == "$divide" {
                    Bson::Double(x.as_f64() / y.as_f64())
                } else {
                    match (x, y, &a, &b) {
                        (Num::Int(p), Num::Int(q), Bson::Int32(_), Bson::Int32(_)) => {
                            Bson::Int32(p.wrapping_rem(q) as i32)
                        }
                        (Num::Int(p), Num::Int(q), _, _) => Bson::Int64(p.wrapping_rem(q)),
                        _ => Bson::Double(x.as_f64() % y.as_f64()),
                    }
                }
            }
            "$abs" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Int32(i)) => i
                        .checked_abs()
                        .map(Bson::Int32)
                        .unwrap_or(Bson::Int64(i64::from(*i).abs())),
                    Some(Bson::Int64(i)) => i
                        .checked_abs()
                        .map(Bson::Int64)
                        .unwrap_or(Bson::Double((*i as f64).abs())),
                    Some(v) => match Num::of(v) {
                        Some(n) => Bson::Double(n.as_f64().abs()),
                        None => {
                            return Err(EngineError::location(
                                28765,
                                format!(
                                    "$abs only supports numeric types, not {}",
                                    bson_type_name(v)
                                ),
                            ))
                        }
                    },
                }
            }
            "$concat" => {
                let mut out = String::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::String(s)) => out.push_str(&s),
                        Some(other) => {
                            return Err(EngineError::location(
                                16702,
                                format!(
                                    "$concat only supports strings, not {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::String(out)
            }
            "$toUpper" | "$toLower" | "$strLenCP" | "$toString" => {
                let args = self.exact_args(op, arg, 1)?;
                let v = args.into_iter().next().flatten().unwrap_or(Bson::Null);
                let text = match &v {
                    Bson::Null | Bson::Undefined if op == "$toString" => {
                        return Ok(Some(Bson::Null))
                    }
                    Bson::Null | Bson::Undefined => String::new(),
                    Bson::String(s) | Bson::Symbol(s) => s.clone(),
                    Bson::Int32(i) => i.to_string(),
                    Bson::Int64(i) => i.to_string(),
                    Bson::Double(f) => f.to_string(),
                    Bson::Boolean(b) => b.to_string(),
                    Bson::ObjectId(o) => o.to_hex(),
                    Bson::DateTime(d) => d.try_to_rfc3339_string().unwrap_or_default(),
                    Bson::Decimal128(d) => d.to_string(),
                    other => {
                        return Err(EngineError::location(
                            16007,
                            format!(
                                "can't convert from BSON type {} to String",
                                bson_type_name(other)
                            ),
                        ))
                    }
                };
                match op {
                    "$toUpper" => Bson::String(text.to_uppercase()),
                    "$toLower" => Bson::String(text.to_lowercase()),
                    "$strLenCP" => {
                        Bson::Int32(i32::try_from(text.chars().count()).unwrap_or(i32::MAX))
                    }
                    _ => Bson::String(text),
                }
            }
            "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
                let args = self.exact_args(op, arg, 2)?;
                // Missing compares as lower than null, as in mongod's expression comparison.
                let ord = match (&args[0], &args[1]) {
                    (None, None) => Ordering::Equal,
                    (None, Some(_)) => Ordering::Less,
                    (Some(_), None) => Ordering::Greater,
                    (Some(a), Some(b)) => compare_bson(a, b),
                };
                match op {
                    "$eq" => Bson::Boolean(ord == Ordering::Equal),
                    "$ne" => Bson::Boolean(ord != Ordering::Equal),
                    "$gt" => Bson::Boolean(ord == Ordering::Greater),
                    "$gte" => Bson::Boolean(ord != Ordering::Less),
                    "$lt" => Bson::Boolean(ord == Ordering::Less),
                    "$lte" => Bson::Boolean(ord != Ordering::Greater),
                    _ => Bson::Int32(match ord {
                        Ordering::Less => -1,
                        Ordering::Equal => 0,
                        Ordering::Greater => 1,
                    }),
                }
            }
            "$and" | "$or" => {
                let items: Vec<Bson> = match arg {
                    Bson::Array(items) => items.clone(),
                    other => vec![other.clone()],
                };
                let want = op == "$or";
                for item in &items {
                    let v = self.eval(item)?;
                    if v.as_ref().is_some_and(is_truthy) == want {
                        return Ok(Some(Bson::Boolean(want)));
                    }
                }
                Bson::Boolean(!want)
            }
            "$not" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::Boolean(!args[0].as_ref().is_some_and(is_truthy))
            }
            "$cond" => {
                let (cond, then, otherwise) = match arg {
                    Bson::Array(items) if items.len() == 3 => (&items[0], &items[1], &items[2]),
                    Bson::Document(d) => match (d.get("if"), d.get("then"), d.get("else")) {
                        (Some(i), Some(t), Some(e)) if d.len() == 3 => (i, t, e),
                        _ => {
                            return Err(EngineError::location(
                                17080,
                                "Missing 'if', 'then' or 'else' parameter to $cond",
                            ))
                        }
                    },
                    _ => {
                        return Err(EngineError::location(
                            16020,
                            "Expression $cond takes exactly 3 arguments.",
                        ))
                    }
                };
                let c = self.eval(cond)?;
                return if c.as_ref().is_some_and(is_truthy) {
                    self.eval(then)
                } else {
                    self.eval(otherwise)
                };
            }
            "$ifNull" => {
                let Bson::Array(items) = arg else {
                    return Err(EngineError::location(
                        1257300,
                        "$ifNull needs at least two arguments",
                    ));
                };
                if items.len() < 2 {
                    return Err(EngineError::location(
                        1257300,
                        "$ifNull needs at least two arguments",
                    ));
                }
                let last = items.len() - 1;
                for item in &items[..last] {
                    let v = self.eval(item)?;
                    if !is_nullish(&v) {
                        return Ok(v);
                    }
                }
                return self.eval(&items[last]);
            }
            "$size" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    Some(Bson::Array(a)) => Bson::Int32(i32::try_from(a.len()).unwrap_or(i32::MAX)),
                    other => {
                        let name = other.as_ref().map(bson_type_name).unwrap_or("missing");
                        return Err(EngineError::location(
                            17124,
                            format!(
                                "The argument to $size must be an array. Type of argument: {name}"
                            ),
                        ));
                    }
                }
            }
            "$arrayElemAt" => {
                let args = self.exact_args(op, arg, 2)?;
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                let Some(Bson::Array(items)) = &args[0] else {
                    return Err(EngineError::location(
                        28689,
                        "$arrayElemAt's first argument must be an array",
                    ));
                };
                let idx = match args[1].as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) => i,
                    Some(Num::Float(f)) if f.fract() == 0.0 => f as i64,
                    _ => {
                        return Err(EngineError::location(
                            28690,
                            "$arrayElemAt's second argument must be a numeric value",
                        ))
                    }
                };
                let len = items.len() as i64;
                let pos = if idx < 0 { len + idx } else { idx };
                return Ok(usize::try_from(pos)
                    .ok()
                    .and_then(|p| items.get(p))
                    .cloned());
            }
            "$first" | "$last" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let item = if op == "$first" {
                            items.first()
                        } else {
                            items.last()
                        };
                        return Ok(item.cloned());
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            28689,
                            format!(
                                "{op}'s argument must be an array, but is {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                }
            }
            "$in" => {
                let args = self.exact_args(op, arg, 2)?;
                let Some(Bson::Array(items)) = &args[1] else {
                    return Err(EngineError::location(
                        40081,
                        "$in requires an array as a second argument",
                    ));
                };
                let needle = args[0].clone().unwrap_or(Bson::Null);
                Bson::Boolean(
                    items
                        .iter()
                        .any(|i| compare_bson(i, &needle) == Ordering::Equal),
                )
            }
            "$concatArrays" => {
                let mut out = Vec::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::Array(items)) => out.extend(items),
                        Some(other) => {
                            return Err(EngineError::location(
                                28664,
                                format!(
                                    "$concatArrays only supports arrays, not {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::Array(out)
            }
            "$floor" | "$ceil" | "$trunc" | "$round" => {
                let args = self.args(arg)?;
                let Some(first) = args.first() else {
                    return Err(EngineError::location(
                        16020,
                        format!("Expression {op} takes at least 1 argument"),
                    ));
                };
                match first {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => v.clone(),
                    Some(v) => match Num::of(v) {
                        Some(n) => {
                            let f = n.as_f64();
                            Bson::Double(match op {
                                "$floor" => f.floor(),
                                "$ceil" => f.ceil(),
                                "$trunc" => f.trunc(),
                                // mongod rounds half to even.
                                _ => {
                                    let r = f.round();
                                    if (f - f.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
                                        r - f.signum()
                                    } else {
                                        r
                                    }
                                }
                            })
                        }
                        None => {
                            return Err(EngineError::location(
                                28765,
                                format!(
                                    "{op} only supports numeric types, not {}",
                                    bson_type_name(v)
                                ),
                            ));
                        }
                    },
                }
            }
            "$toInt" | "$toLong" | "$toDouble" | "$toBool" => {
                let args = self.exact_args(op, arg, 1)?;
                let v = args.into_iter().next().flatten();
                let Some(v) = v.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) else {
                    return Ok(Some(Bson::Null));
                };
                let fail = |v: &Bson| {
                    EngineError::location(241, format!("Unsupported conversion from {} to {} in $convert with no onError value", bson_type_name(v), &op[3..].to_lowercase()))
                };
                if op == "$toBool" {
                    Bson::Boolean(is_truthy(&v))
                } else {
                    let n = match &v {
                        Bson::Boolean(b) => Num::Int(i64::from(*b)),
                        Bson::String(s) => match s.trim().parse::<i64>() {
                            Ok(i) => Num::Int(i),
                            Err(_) => Num::Float(s.trim().parse::<f64>().map_err(|_| fail(&v))?),
                        },
                        Bson::DateTime(d) => Num::Int(d.timestamp_millis()),
                        other => Num::of(other).ok_or_else(|| fail(other))?,
                    };
                    match (op, n) {
                        ("$toDouble", n) => Bson::Double(n.as_f64()),
                        ("$toInt", Num::Int(i)) => {
                            Bson::Int32(i32::try_from(i).map_err(|_| fail(&v))?)
                        }
                        ("$toInt", Num::Float(f)) if f.is_finite() && f.abs() < 2_147_483_648.0 => {
                            Bson::Int32(f.trunc() as i32)
                        }
                        ("$toLong", Num::Int(i)) => Bson::Int64(i),
                        ("$toLong", Num::Float(f)) if f.is_finite() && f.abs() < 9.2e18 => {
                            Bson::Int64(f.trunc() as i64)
                        }
                        _ => return Err(fail(&v)),
                    }
                }
            }
            "$reverseArray" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(mut items)) => {
                        items.reverse();
                        Bson::Array(items)
                    }
                    Some(other) => {
                        return Err(EngineError::location(34435, format!("The argument to $reverseArray must be an array, but was of type: {}", bson_type_name(&other))));
                    }
                }
            }
            "$slice" => {
                let args = self.args(arg)?;
                if !(2..=3).contains(&args.len()) {
                    return Err(EngineError::location(
                        28667,
                        "Expression $slice takes at least 2 arguments, and at most 3",
                    ));
                }
                let items = match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items.clone(),
                    Some(other) => {
                        return Err(EngineError::location(
                            28724,
                            format!(
                                "First argument to $slice must be an array, but is of type: {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                };
                let int_arg = |v: &Option<Bson>| match v.as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) => Ok(i),
                    Some(Num::Float(f)) if f.fract() == 0.0 && f.is_finite() => Ok(f as i64),
                    _ => Err(EngineError::location(
                        28725,
                        "$slice arguments must be integral numbers",
                    )),
                };
                let len = items.len() as i64;
                let (start, count) = if args.len() == 2 {
                    let n = int_arg(&args[1])?;
                    if n >= 0 {
                        (0, n)
                    } else {
                        ((len + n).max(0), len)
                    }
                } else {
                    let pos = int_arg(&args[1])?;
                    let n = int_arg(&args[2])?;
                    if n <= 0 {
                        return Err(EngineError::location(
                            28729,
                            "Third argument to $slice must be positive",
                        ));
                    }
                    (
                        if pos >= 0 {
                            pos.min(len)
                        } else {
                            (len + pos).max(0)
                        },
                        n,
                    )
                };
                let start = usize::try_from(start).unwrap_or(0);
                let count = usize::try_from(count).unwrap_or(0);
                Bson::Array(items.into_iter().skip(start).take(count).collect())
            }
            "$range" => {
                let args = self.args(arg)?;
                if !(2..=3).contains(&args.len()) {
                    return Err(EngineError::location(
                        28667,
                        "Expression $range takes at least 2 arguments, and at most 3",
                    ));
                }
                let int_arg = |v: &Option<Bson>| {
                    match v.as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) if i32::try_from(i).is_ok() => Ok(i),
                    Some(Num::Float(f)) if f.fract() == 0.0 && f.abs() < 2_147_483_648.0 => Ok(f as i64),
                    _ => Err(EngineError::location(34443, "$range requires a numeric starting value and ending value that can be represented as 32-bit integers")),
                }
                };
                let (start, end) = (int_arg(&args[0])?, int_arg(&args[1])?);
                let step = match args.get(2) {
                    Some(s) => int_arg(s)?,
                    None => 1,
                };
                if step == 0 {
                    return Err(EngineError::location(
                        34449,
                        "$range requires a non-zero step value",
                    ));
                }
                let count = if (step > 0 && end > start) || (step < 0 && end < start) {
                    ((end - start).abs() + step.abs() - 1) / step.abs()
                } else {
                    0
                };
                if count > 1_000_000 {
                    return Err(EngineError::location(
                        34434,
                        "$range would produce more than 1,000,000 values",
                    ));
                }
                Bson::Array(
                    (0..count)
                        .map(|i| Bson::Int32((start + i * step) as i32))
                        .collect(),
                )
            }
            "$split" => {
                let args = self.exact_args(op, arg, 2)?;
                match (&args[0], &args[1]) {
                    (None | Some(Bson::Null) | Some(Bson::Undefined), _) => Bson::Null,
                    (Some(Bson::String(s)), Some(Bson::String(sep))) if !sep.is_empty() => {
                        Bson::Array(
                            s.split(sep.as_str())
                                .map(|p| Bson::String(p.to_owned()))
                                .collect(),
                        )
                    }
                    _ => {
                        return Err(EngineError::location(
                            40085,
                            "$split requires a string and a non-empty string delimiter",
                        ))
                    }
                }
            }
            "$substrCP" | "$substr" | "$substrBytes" => {
                let args = self.exact_args(op, arg, 3)?;
                let text = match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => String::new(),
                    Some(Bson::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                let int_arg = |v: &Option<Bson>| match v.as_ref().and_then(Num::of) {
                    Some(n) if n.as_f64() >= 0.0 => Ok(n.as_f64() as usize),
                    _ => Err(EngineError::location(
                        34452,
                        format!("{op} requires non-negative numeric start and length"),
                    )),
                };
                let (start, len) = (int_arg(&args[1])?, int_arg(&args[2])?);
                // Characters (not bytes) for every variant, which never splits a UTF-8 sequence.
                Bson::String(text.chars().skip(start).take(len).collect())
            }
            "$strcasecmp" => {
                let args = self.exact_args(op, arg, 2)?;
                let text = |v: &Option<Bson>| match v {
                    Some(Bson::String(s)) => s.to_lowercase(),
                    _ => String::new(),
                };
                Bson::Int32(match text(&args[0]).cmp(&text(&args[1])) {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })
            }
            "$indexOfArray" => {
                let args = self.args(arg)?;
                if args.len() < 2 {
                    return Err(EngineError::location(
                        28667,
                        "Expression $indexOfArray takes at least 2 arguments",
                    ));
                }
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let needle = args[1].clone().unwrap_or(Bson::Null);
                        let pos = items
                            .iter()
                            .position(|i| compare_bson(i, &needle) == Ordering::Equal);
                        Bson::Int32(pos.and_then(|p| i32::try_from(p).ok()).unwrap_or(-1))
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            40090,
                            format!(
                                "$indexOfArray requires an array as a first argument, found: {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                }
            }
            "$objectToArray" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Document(d)) => Bson::Array(
                        d.into_iter()
                            .map(|(k, v)| {
                                let mut kv = Document::new();
                                kv.insert("k", k);
                                kv.insert("v", v);
                                Bson::Document(kv)
                            })
                            .collect(),
                    ),
                    Some(other) => {
                        return Err(EngineError::location(
                            40390,
                            format!(
                                "$objectToArray requires a document input, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                }
            }
            "$arrayToObject" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let mut out = Document::new();
                        for item in items {
                            match item {
                                Bson::Document(d) => match (d.get("k"), d.get("v")) {
                                    (Some(Bson::String(k)), Some(v)) if d.len() == 2 => {
                                        out.insert(k.clone(), v.clone());
                                    }
                                    _ => return Err(EngineError::location(40392, "$arrayToObject requires an object keys of 'k' and 'v'")),
                                },
                                Bson::Array(pair) if pair.len() == 2 => match (&pair[0], &pair[1]) {
                                    (Bson::String(k), v) => {
                                        out.insert(k.clone(), v.clone());
                                    }
                                    _ => return Err(EngineError::location(40395, "$arrayToObject requires an array of key-value pairs with string keys")),
                                },
                                _ => return Err(EngineError::location(40398, "Unrecognised input type format for $arrayToObject")),
                            }
                        }
                        Bson::Document(out)
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            40386,
                            format!(
                                "$arrayToObject requires an array input, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                }
            }
            "$setUnion" => {
                let mut seen = std::collections::BTreeSet::new();
                let mut out = Vec::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::Array(items)) => {
                            for i in items {
                                if seen.insert(super::compare::OrdBson(i.clone())) {
                                    out.push(i);
                                }
                            }
                        }
                        Some(other) => {
                            return Err(EngineError::location(17043, format!("All operands of $setUnion must be arrays. One argument is of type: {}", bson_type_name(&other))));
                        }
                    }
                }
                Bson::Array(out)
            }
            "$switch" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        40060,
                        "$switch requires an object as an argument",
                    ));
                };
                let Some(Bson::Array(branches)) = spec.get("branches") else {
                    return Err(EngineError::location(
                        40061,
                        "$switch expected an array for 'branches'",
                    ));
                };
                for branch in branches {
                    let Bson::Document(b) = branch else {
                        return Err(EngineError::location(
                            40062,
                            "$switch expected each branch to be an object",
                        ));
                    };
                    let (Some(case), Some(then)) = (b.get("case"), b.get("then")) else {
                        return Err(EngineError::location(
                            40064,
                            "$switch requires each branch have a 'case' and 'then'",
                        ));
                    };
                    if self.eval(case)?.as_ref().is_some_and(is_truthy) {
                        return self.eval(then);
                    }
                }
                return match spec.get("default") {
                    Some(d) => self.eval(d),
                    None => Err(EngineError::location(40066, "$switch could not find a matching branch for an input, and no default was specified.")),
                };
            }
            "$reduce" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        40075,
                        "$reduce requires an object as an argument",
                    ));
                };
                let (Some(input), Some(initial), Some(body)) =
                    (spec.get("input"), spec.get("initialValue"), spec.get("in"))
                else {
                    return Err(EngineError::location(
                        40079,
                        "$reduce requires 'input', 'initialValue' and 'in'",
                    ));
                };
                let items = match self.eval(input)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items,
                    Some(other) => {
                        return Err(EngineError::location(
                            40080,
                            format!(
                                "$reduce requires that 'input' be an array, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let mut acc = self.eval(initial)?.unwrap_or(Bson::Null);
                for item in items {
                    self.vars.push(("value".to_owned(), acc));
                    self.vars.push(("this".to_owned(), item));
                    let r = self.eval(body);
                    self.vars.truncate(self.vars.len().saturating_sub(2));
                    acc = r?.unwrap_or(Bson::Null);
                }
                acc
            }
            "$regexMatch" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        51103,
                        "$regexMatch expects an object of named arguments",
                    ));
                };
                let input = match spec.get("input") {
                    Some(e) => self.eval(e)?,
                    None => {
                        return Err(EngineError::location(
                            31022,
                            "$regexMatch requires 'input' parameter",
                        ))
                    }
                };
                let (pattern, mut options) = match spec
                    .get("regex")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    Some(Bson::String(p)) => (p, String::new()),
                    Some(Bson::RegularExpression(r)) => (r.pattern, r.options),
                    None | Some(Bson::Null) => return Ok(Some(Bson::Boolean(false))),
                    Some(_) => {
                        return Err(EngineError::location(
                            51105,
                            "$regexMatch needs 'regex' to be of type string or regex",
                        ))
                    }
                };
                if let Some(o) = spec.get("options") {
                    match self.eval(o)? {
                        Some(Bson::String(extra)) => options.push_str(&extra),
                        None | Some(Bson::Null) => {}
                        Some(_) => {
                            return Err(EngineError::location(
                                51106,
                                "$regexMatch needs 'options' to be of type string",
                            ))
                        }
                    }
                }
                match input {
                    Some(Bson::String(text)) => {
                        Bson::Boolean(compile_regex(&pattern, &options)?.is_match(&text))
                    }
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Boolean(false),
                    Some(_) => {
                        return Err(EngineError::location(
                            51104,
                            "$regexMatch needs 'input' to be of type string",
                        ))
                    }
                }
            }
            "$trim" | "$ltrim" | "$rtrim" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        50696,
                        format!("{op} only supports an object as an argument"),
                    ));
                };
                let input = match spec.get("input") {
                    Some(e) => self.eval(e)?,
                    None => {
                        return Err(EngineError::location(
                            50695,
                            format!("{op} requires an 'input' field"),
                        ))
                    }
                };
                let chars: Option<Vec<char>> = match spec
                    .get("chars")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    None | Some(Bson::Null) => None,
                    Some(Bson::String(c)) => Some(c.chars().collect()),
                    Some(_) => {
                        return Err(EngineError::location(
                            50700,
                            format!("{op} requires 'chars' to be a string"),
                        ))
                    }
                };
                let text = match input {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::String(t)) => t,
                    Some(other) => {
                        return Err(EngineError::location(
                            50699,
                            format!(
                                "{op} requires its input to be a string, got {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let strip = |c: char| match &chars {
                    Some(set) => set.contains(&c),
                    None => c.is_whitespace() || c == '\0',
                };
                Bson::String(match op {
                    "$ltrim" => text.trim_start_matches(strip).to_owned(),
                    "$rtrim" => text.trim_end_matches(strip).to_owned(),
                    _ => text.trim_matches(strip).to_owned(),
                })
            }
            "$sqrt" | "$exp" | "$ln" | "$log10" | "$pow" => {
                let args = if op == "$pow" {
                    self.exact_args(op, arg, 2)?
                } else {
                    self.exact_args(op, arg, 1)?
                };
                if args.iter().any(is_nullish) {
                    return Ok(Some(Bson::Null));
                }
                let mut nums = Vec::with_capacity(args.len());
                for a in args.iter().flatten() {
                    nums.push(
                        Num::of(a)
                            .ok_or_else(|| {
                                EngineError::location(
                                    28765,
                                    format!(
                                        "{op} only supports numeric types, not {}",
                                        bson_type_name(a)
                                    ),
                                )
                            })?
                            .as_f64(),
                    );
                }
                let x = nums.first().copied().unwrap_or(0.0);
                let value = match op {
                    "$sqrt" if x < 0.0 => {
                        return Err(EngineError::location(
                            28714,
                            "$sqrt's argument must be greater than or equal to 0",
                        ))
                    }
                    "$sqrt" => x.sqrt(),
                    "$exp" => x.exp(),
                    "$ln" | "$log10" if x <= 0.0 => {
                        return Err(EngineError::location(
                            28766,
                            format!("{op}'s argument must be a positive number, but is {x}"),
                        ))
                    }
                    "$ln" => x.ln(),
                    "$log10" => x.log10(),
                    _ => {
                        let y = nums.get(1).copied().unwrap_or(1.0);
                        if x == 0.0 && y < 0.0 {
                            return Err(EngineError::location(
                                28764,
                                "$pow cannot take a base of 0 and a negative exponent",
                            ));
                        }
                        // Integer bases with non-negative integer exponents stay integral, as in mongod.
                        if let (Some(Num::Int(b)), Some(Num::Int(e))) = (
                            args[0].as_ref().and_then(Num::of),
                            args[1].as_ref().and_then(Num::of),
                        ) {
                            if let Some(r) = u32::try_from(e).ok().and_then(|e| b.checked_pow(e)) {
                                let both_i32 = matches!(
                                    (&args[0], &args[1]),
                                    (Some(Bson::Int32(_)), Some(Bson::Int32(_)))
                                );
                                return Ok(Some(match (both_i32, i32::try_from(r)) {
                                    (true, Ok(small)) => Bson::Int32(small),
                                    _ => Bson::Int64(r),
                                }));
                            }
                        }
                        x.powf(y)
                    }
                };
                Bson::Double(value)
            }
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
            "$isArray" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::Boolean(matches!(args[0], Some(Bson::Array(_))))
            }
            "$type" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::String(
                    args[0]
                        .as_ref()
                        .map(bson_type_name)
                        .unwrap_or("missing")
                        .to_owned(),
                )
            }
            "$sum" | "$avg" | "$min" | "$max" | "$stdDevPop" | "$stdDevSamp" => {
                let args = self.args(arg)?;
                // With one array argument the operator folds over the array's elements.
                let values: Vec<Bson> = match args.as_slice() {
                    [Some(Bson::Array(items))] => items.clone(),
                    _ => args.into_iter().flatten().collect(),
                };
                fold_values(op, &values)
            }
            "$mergeObjects" => {
                let mut out = Document::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                        Some(Bson::Document(d)) => out.extend(d),
                        Some(other) => {
                            return Err(EngineError::location(
                                40400,
                                format!(
                                    "$mergeObjects requires object inputs, but input is of type {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::Document(out)
            }
            "$let" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        16874,
                        "$let only supports an object as its argument",
                    ));
                };
                let (Some(Bson::Document(vars)), Some(body)) = (spec.get("vars"), spec.get("in"))
                else {
                    return Err(EngineError::location(
                        16876,
                        "Missing 'vars' or 'in' parameter to $let",
                    ));
                };
                let mut bound = Vec::with_capacity(vars.len());
                for (name, e) in vars {
                    bound.push((name.clone(), self.eval(e)?.unwrap_or(Bson::Null)));
                }
                let depth = self.vars.len();
                self.vars.extend(bound);
                let result = self.eval(body);
                self.vars.truncate(depth);
                return result;
            }
            "$map" | "$filter" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        16878,
                        format!("{op} only supports an object as its argument"),
                    ));
                };
                let body_key = if op == "$map" { "in" } else { "cond" };
                let (Some(input), Some(body)) = (spec.get("input"), spec.get(body_key)) else {
                    return Err(EngineError::location(
                        16880,
                        format!("Missing 'input' or '{body_key}' parameter to {op}"),
                    ));
                };
                let name = match spec.get("as") {
                    Some(Bson::String(s)) => s.clone(),
                    None => "this".to_owned(),
                    Some(_) => {
                        return Err(EngineError::bad_value(format!(
                            "{op}: 'as' must be a string"
                        )))
                    }
                };
                let items = match self.eval(input)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items,
                    Some(other) => {
                        return Err(EngineError::location(
                            16883,
                            format!(
                                "input to {op} must be an array not {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    self.vars.push((name.clone(), item.clone()));
                    let r = self.eval(body);
                    self.vars.pop();
                    let r = r?;
                    if op == "$map" {
                        out.push(r.unwrap_or(Bson::Null));
                    } else if r.as_ref().is_some_and(is_truthy) {
                        out.push(item);
                    }
                }
                Bson::Array(out)
            }
            _ => {
                return Err(EngineError::invalid_pipeline_operator(format!(
                    "Unrecognized expression '{op}'"
                )));
            }
        };
        Ok(Some(value))
    }
}

/// `$sum`, `$avg`, `$min` or `$max` over already evaluated values (shared with `$group`).
pub(crate) fn fold_values(op: &str, values: &[Bson]) -> Bson {
    match op {
        "$stdDevPop" | "$stdDevSamp" => {
            let nums: Vec<f64> = values.iter().filter_map(Num::of).map(Num::as_f64).collect();
            let n = nums.len() as f64;
            let min_count = if op == "$stdDevPop" { 1.0 } else { 2.0 };
            if n < min_count {
                return Bson::Null;
            }
            let mean = nums.iter().sum::<f64>() / n;
            let squares = nums.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
            let divisor = if op == "$stdDevPop" { n } else { n - 1.0 };
            Bson::Double((squares / divisor).sqrt())
        }
        "$sum" | "$avg" => {
            let mut total = Bson::Int32(0);
            let mut count = 0u64;
            for v in values {
                if let Some(t) = arith(Arith::Add, &total, v) {
                    total = t;
                    count += 1;
                }
            }
            if op == "$sum" {
                total
            } else if count == 0 {
                Bson::Null
            } else {
                Bson::Double(Num::of(&total).map(|n| n.as_f64()).unwrap_or(0.0) / count as f64)
            }
        }
        _ => {
            let want = if op == "$min" {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            let mut best: Option<&Bson> = None;
            for v in values
                .iter()
                .filter(|v| !matches!(v, Bson::Null | Bson::Undefined))
            {
                if best.is_none_or(|b| compare_bson(v, b) == want) {
                    best = Some(v);
                }
            }
            best.cloned().unwrap_or(Bson::Null)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ev(expr: Bson, root: Document) -> Bson {
        evaluate(&expr, &root).expect("valid expression")
    }

    #[test]
    fn field_operators_take_dotted_and_dollar_names_literally() {
        let root = doc! { "a.b": 1, "a": { "b": 2 }, "$x": 3 };
        assert_eq!(
            ev(Bson::from(doc! { "$getField": "a.b" }), root.clone()),
            Bson::Int32(1)
        );
        let get_dollar = doc! { "$getField": { "field": { "$literal": "$x" } } };
        assert_eq!(ev(Bson::from(get_dollar), root.clone()), Bson::Int32(3));
        let set =
            doc! { "$setField": { "field": { "$literal": "$y" }, "value": 4, "input": "$$ROOT" } };
        assert_eq!(
            ev(Bson::from(set), root.clone()),
            Bson::from(doc! { "a.b": 1, "a": { "b": 2 }, "$x": 3, "$y": 4 })
        );
        // Replacing keeps the field's place; $$REMOVE and $unsetField remove it.
        let replace = doc! { "$setField": { "field": "a.b", "value": 9, "input": "$$ROOT" } };
        assert_eq!(
            ev(Bson::from(replace), root.clone()),
            Bson::from(doc! { "a.b": 9, "a": { "b": 2 }, "$x": 3 })
        );
        let remove =
            doc! { "$setField": { "field": "a.b", "value": "$$REMOVE", "input": "$$ROOT" } };
        let unset = doc! { "$unsetField": { "field": "a.b", "input": "$$ROOT" } };
        let expected = Bson::from(doc! { "a": { "b": 2 }, "$x": 3 });
        assert_eq!(ev(Bson::from(remove), root.clone()), expected);
        assert_eq!(ev(Bson::from(unset), root.clone()), expected);
        // A null input gives null; a non-constant field name is an error.
        let on_null = doc! { "$setField": { "field": "f", "value": 1, "input": null } };
        assert_eq!(ev(Bson::from(on_null), root.clone()), Bson::Null);
        let computed = doc! { "$getField": { "field": "$a", "input": "$$ROOT" } };
        assert!(evaluate(&Bson::from(computed), &root).is_err());
    }

    #[test]
    fn rand_is_a_fresh_double_in_the_unit_interval() {
        let draws: Vec<f64> = (0..20)
            .map(
                |_| match ev(Bson::from(doc! { "$rand": {} }), Document::new()) {
                    Bson::Double(f) => f,
                    other => panic!("$rand gave {other}"),
                },
            )
            .collect();
        assert!(draws.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
        assert!(evaluate(&Bson::from(doc! { "$rand": 1 }), &Document::new()).is_err());
    }

    #[test]
    fn field_paths_map_over_arrays() {
        let d = doc! {"a": [{"b": 1}, {"c": 2}, {"b": 3}], "x": {"y": "z"}};
        assert_eq!(
            ev(Bson::String("$a.b".into()), d.clone()),
            Bson::Array(vec![1.into(), 3.into()])
        );
        assert_eq!(
            ev(Bson::String("$x.y".into()), d.clone()),
            Bson::String("z".into())
        );
        assert_eq!(ev(Bson::String("$missing".into()), d), Bson::Null);
    }

    #[test]
    fn arithmetic_promotes_types() {
        assert_eq!(ev(bson::bson!({"$add": [1, 2]}), doc! {}), Bson::Int32(3));
        assert_eq!(
            ev(bson::bson!({"$add": [i32::MAX, 1]}), doc! {}),
            Bson::Int64(i64::from(i32::MAX) + 1)
        );
        assert_eq!(
            ev(bson::bson!({"$add": [1, 2.5]}), doc! {}),
            Bson::Double(3.5)
        );
        assert_eq!(
            ev(bson::bson!({"$multiply": ["$a", 3]}), doc! {"a": 2i64}),
            Bson::Int64(6)
        );
        assert_eq!(
            ev(bson::bson!({"$subtract": [10, "$a"]}), doc! {"a": 4}),
            Bson::Int32(6)
        );
        assert_eq!(
            ev(bson::bson!({"$divide": [9, 2]}), doc! {}),
            Bson::Double(4.5)
        );
        assert_eq!(ev(bson::bson!({"$add": [1, null]}), doc! {}), Bson::Null);
        let err = evaluate(&bson::bson!({"$divide": [1, 0]}), &doc! {}).expect_err("div by zero");
        assert_eq!(err.code, 2);
        let err = evaluate(&bson::bson!({"$add": [1, "x"]}), &doc! {}).expect_err("type");
        assert_eq!(err.code, 14);
    }

    #[test]
    fn strings_comparisons_and_conditions() {
        assert_eq!(
            ev(bson::bson!({"$concat": ["a", "$s"]}), doc! {"s": "b"}),
            Bson::String("ab".into())
        );
        assert_eq!(
            ev(bson::bson!({"$toUpper": "$s"}), doc! {"s": "ab"}),
            Bson::String("AB".into())
        );
        assert_eq!(
            ev(bson::bson!({"$gt": ["$a", 1]}), doc! {"a": 2}),
            Bson::Boolean(true)
        );
        assert_eq!(
            ev(bson::bson!({"$eq": ["$a", 2.0]}), doc! {"a": 2}),
            Bson::Boolean(true)
        );
        assert_eq!(
            ev(
                bson::bson!({"$cond": {"if": "$f", "then": "y", "else": "n"}}),
                doc! {"f": 0}
            ),
            Bson::String("n".into())
        );
        assert_eq!(
            ev(bson::bson!({"$cond": [true, 1, 2]}), doc! {}),
            Bson::Int32(1)
        );
        assert_eq!(
            ev(bson::bson!({"$ifNull": ["$m", "d"]}), doc! {}),
            Bson::String("d".into())
        );
        assert_eq!(
            ev(bson::bson!({"$and": [1, "$t"]}), doc! {"t": true}),
            Bson::Boolean(true)
        );
        assert_eq!(
            ev(bson::bson!({"$or": [0, false]}), doc! {}),
            Bson::Boolean(false)
        );
        assert_eq!(ev(bson::bson!({"$not": [0]}), doc! {}), Bson::Boolean(true));
    }

    #[test]
    fn array_operators() {
        let d = doc! {"a": [1, 2, 3]};
        assert_eq!(ev(bson::bson!({"$size": "$a"}), d.clone()), Bson::Int32(3));
        assert_eq!(
            ev(bson::bson!({"$arrayElemAt": ["$a", -1]}), d.clone()),
            Bson::Int32(3)
        );
        assert_eq!(ev(bson::bson!({"$sum": "$a"}), d.clone()), Bson::Int32(6));
        assert_eq!(ev(bson::bson!({"$max": "$a"}), d.clone()), Bson::Int32(3));
        assert_eq!(
            ev(bson::bson!({"$stdDevPop": "$a"}), d.clone()),
            Bson::Double((2.0f64 / 3.0).sqrt())
        );
        assert_eq!(
            ev(bson::bson!({"$stdDevSamp": "$a"}), d.clone()),
            Bson::Double(1.0)
        );
        assert_eq!(
            ev(
                bson::bson!({"$map": {"input": "$a", "as": "x", "in": {"$multiply": ["$$x", 2]}}}),
                d.clone()
            ),
            bson::bson!([2, 4, 6])
        );
        assert_eq!(
            ev(
                bson::bson!({"$filter": {"input": "$a", "cond": {"$gt": ["$$this", 1]}}}),
                d
            ),
            bson::bson!([2, 3])
        );
        assert_eq!(
            evaluate(&bson::bson!({"$size": 1}), &doc! {}).map_err(|e| e.code),
            Err(17124)
        );
    }

    #[test]
    fn literals_and_object_expressions() {
        assert_eq!(
            ev(bson::bson!({"$literal": "$a"}), doc! {"a": 1}),
            Bson::String("$a".into())
        );
        assert_eq!(
            ev(bson::bson!({"x": "$a", "y": "$missing"}), doc! {"a": 1}),
            bson::bson!({"x": 1})
        );
        assert_eq!(
            ev(
                bson::bson!({"$let": {"vars": {"v": 5}, "in": "$$v"}}),
                doc! {}
            ),
            Bson::Int32(5)
        );
    }

    #[test]
    fn conversion_and_array_helpers() {
        assert_eq!(ev(bson::bson!({"$toInt": "42"}), doc! {}), Bson::Int32(42));
        assert_eq!(ev(bson::bson!({"$toLong": 2.9}), doc! {}), Bson::Int64(2));
        assert_eq!(
            ev(bson::bson!({"$toDouble": "1.5"}), doc! {}),
            Bson::Double(1.5)
        );
        assert_eq!(ev(bson::bson!({"$floor": 2.5}), doc! {}), Bson::Double(2.0));
        assert_eq!(ev(bson::bson!({"$round": 2.5}), doc! {}), Bson::Double(2.0));
        assert_eq!(ev(bson::bson!({"$round": 3.5}), doc! {}), Bson::Double(4.0));
        assert_eq!(
            ev(bson::bson!({"$slice": [[1, 2, 3, 4], -2]}), doc! {}),
            bson::bson!([3, 4])
        );
        assert_eq!(
            ev(bson::bson!({"$slice": [[1, 2, 3, 4], 1, 2]}), doc! {}),
            bson::bson!([2, 3])
        );
        assert_eq!(
            ev(bson::bson!({"$range": [0, 10, 4]}), doc! {}),
            bson::bson!([0, 4, 8])
        );
        assert_eq!(
            ev(bson::bson!({"$range": [5, 0, -2]}), doc! {}),
            bson::bson!([5, 3, 1])
        );
        assert_eq!(
            ev(bson::bson!({"$split": ["a,b", ","]}), doc! {}),
            bson::bson!(["a", "b"])
        );
        assert_eq!(
            ev(bson::bson!({"$substrCP": ["héllo", 1, 3]}), doc! {}),
            Bson::String("éll".into())
        );
        assert_eq!(
            ev(bson::bson!({"$indexOfArray": [[1, 2, 3], 2.0]}), doc! {}),
            Bson::Int32(1)
        );
        assert_eq!(
            ev(
                bson::bson!({"$arrayToObject": {"$objectToArray": {"a": 1}}}),
                doc! {}
            ),
            bson::bson!({"a": 1})
        );
        assert_eq!(
            ev(bson::bson!({"$setUnion": [[1, 2], [2, 3]]}), doc! {}),
            bson::bson!([1, 2, 3])
        );
        assert!(evaluate(&bson::bson!({"$range": [0, 2_000_000_000]}), &doc! {}).is_err());
    }

    #[test]
    fn command_variables_are_scoped() {
        let vars = doc! {"limit": {"$add": [1, 1]}, "name": "x"};
        let inside = with_variables(&vars, || {
            evaluate(&Bson::String("$$limit".into()), &doc! {})
        })
        .expect("valid names");
        assert_eq!(inside, Ok(Bson::Int32(2)));
        assert!(evaluate(&Bson::String("$$limit".into()), &doc! {}).is_err());
        let nested = with_variables(&vars, || {
            with_variables(&doc! {"other": 1}, || {
                evaluate(&bson::bson!({"$add": ["$$limit", "$$other"]}), &doc! {})
            })
        });
        assert_eq!(nested, Ok(Ok(Ok(Bson::Int32(3)))));
        assert_eq!(
            with_variables(&doc! {"Bad": 1}, || ()).map_err(|e| e.code),
            Err(2)
        );
        let filter = doc! {"$expr": {"$eq": ["$a", "$$name"]}};
        assert_eq!(
            with_variables(&vars, || crate::engine::matches(&filter, &doc! {"a": "x"})),
            Ok(Ok(true))
        );
    }

    #[test]
    fn switch_reduce_regex_trim_math() {
        assert_eq!(
            ev(
                bson::bson!({"$switch": {"branches": [{"case": {"$gt": ["$a", 5]}, "then": "big"}], "default": "small"}}),
                doc! {"a": 1}
            ),
            Bson::String("small".into())
        );
        assert_eq!(
            ev(
                bson::bson!({"$reduce": {"input": [1, 2, 3], "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}}),
                doc! {}
            ),
            Bson::Int32(6)
        );
        assert_eq!(
            ev(
                bson::bson!({"$regexMatch": {"input": "Hello", "regex": "^h", "options": "i"}}),
                doc! {}
            ),
            Bson::Boolean(true)
        );
        assert_eq!(
            ev(bson::bson!({"$trim": {"input": "  x  "}}), doc! {}),
            Bson::String("x".into())
        );
        assert_eq!(
            ev(
                bson::bson!({"$ltrim": {"input": "xxy", "chars": "x"}}),
                doc! {}
            ),
            Bson::String("y".into())
        );
        assert_eq!(
            ev(bson::bson!({"$pow": [2, 10]}), doc! {}),
            Bson::Int32(1024)
        );
        assert_eq!(ev(bson::bson!({"$sqrt": 16}), doc! {}), Bson::Double(4.0));
        assert!(evaluate(&bson::bson!({"$sqrt": -1}), &doc! {}).is_err());
    }

    #[test]
    fn date_parts_and_formatting() {
        // 2024-02-29T13:45:06.789Z, a Thursday and the 60th day of the year.
        let d = doc! {"t": bson::DateTime::from_millis(1_709_214_306_789)};
        let part = |op: &str| {
            let mut e = Document::new();
            e.insert(op, "$t");
            ev(Bson::Document(e), d.clone())
        };
        assert_eq!(part("$year"), Bson::Int32(2024));
        assert_eq!(part("$month"), Bson::Int32(2));
        assert_eq!(part("$dayOfMonth"), Bson::Int32(29));
        assert_eq!(part("$hour"), Bson::Int32(13));
        assert_eq!(part("$minute"), Bson::Int32(45));
        assert_eq!(part("$second"), Bson::Int32(6));
        assert_eq!(part("$millisecond"), Bson::Int32(789));
        assert_eq!(part("$dayOfWeek"), Bson::Int32(5));
        assert_eq!(part("$dayOfYear"), Bson::Int32(60));
        assert_eq!(
            ev(
                bson::bson!({"$dateToString": {"date": "$t", "format": "%Y-%m-%d %H:%M:%S.%L"}}),
                d.clone()
            ),
            Bson::String("2024-02-29 13:45:06.789".into())
        );
        assert_eq!(
            ev(bson::bson!({"$dateToString": {"date": "$t"}}), d),
            Bson::String("2024-02-29T13:45:06.789Z".into())
        );
        let before_epoch = doc! {"t": bson::DateTime::from_millis(-1)};
        assert_eq!(
            ev(bson::bson!({"$year": "$t"}), before_epoch.clone()),
            Bson::Int32(1969)
        );
        assert_eq!(
            ev(bson::bson!({"$dayOfYear": "$t"}), before_epoch),
            Bson::Int32(365)
        );
    }

    #[test]
    fn unknown_operators_are_rejected() {
        let err = evaluate(&bson::bson!({"$nope": 1}), &doc! {}).expect_err("unknown");
        assert_eq!((err.code, err.code_name), (168, "InvalidPipelineOperator"));
        assert!(evaluate(&Bson::String("$$undefinedVar".into()), &doc! {}).is_err());
    }
}
