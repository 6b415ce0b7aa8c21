//! Aggregation expression evaluation (`$project`, `$addFields`, `$group`, `$expr`, ...).
//!
//! This module reads the expression language itself (field paths, `$$` variables, array and
//! object literals, argument lists) and routes each operator to its family, one module each
//! with one dispatch method on the evaluation context:
//!
//! * `arithmetic`: `$add $subtract $multiply $divide $mod $abs $floor $ceil $trunc $round $sqrt
//!   $exp $ln $log10 $pow`, and the type-promoting [`arith`] that `$inc`, `$mul` and `$sum`
//!   share;
//! * `comparison`: `$eq $ne $gt $gte $lt $lte $cmp $and $or $not`, and [`is_truthy`];
//! * `conditional`: `$cond $ifNull $switch`;
//! * `string`: `$concat $toUpper $toLower $strLenCP $toString $split $substrCP $substr
//!   $substrBytes $strcasecmp $regexMatch $trim $ltrim $rtrim`;
//! * `array`: `$size $arrayElemAt $first $last $in $concatArrays $isArray $reverseArray $slice
//!   $range $indexOfArray $map $filter $reduce`;
//! * `set`: `$setUnion`;
//! * `date`: `$year $month $dayOfMonth $hour $minute $second $millisecond $dayOfWeek
//!   $dayOfYear $dateToString` (UTC);
//! * `conversion`: `$type $toInt $toLong $toDouble $toBool`;
//! * `object`: `$mergeObjects $objectToArray $arrayToObject $getField $setField $unsetField`;
//! * `accumulator`: `$sum $avg $min $max $stdDevPop $stdDevSamp`, and [`fold_values`], which
//!   `$group` shares;
//! * `variable`: `$let $literal $rand`.
//!
//! Families depend on this module (the context, argument helpers) and on `comparison` (for
//! truthiness) or `arithmetic` (for [`arith`]), never on each other otherwise.

mod accumulator;
mod arithmetic;
mod array;
mod comparison;
mod conditional;
mod conversion;
mod date;
mod object;
mod set;
mod string;
mod variable;

use std::cell::RefCell;

use bson::{Bson, Document};

use super::limits::{check_depth, check_value_depth};
use super::{EngineError, EngineResult};

pub(crate) use accumulator::fold_values;
pub(crate) use arithmetic::{arith, Arith};
pub(crate) use comparison::is_truthy;

/// Evaluates the aggregation expression `expr` with `root` as `$$ROOT` and `$$CURRENT`.
///
/// Supports field paths (`"$a.b"`, mapped over arrays), system variables (`$$ROOT`,
/// `$$CURRENT`, `$$REMOVE`, `$$NOW`), `$let`/`$map`/`$filter` variables, literals, `$literal`,
/// object and array literals, and the operators of the families the module documentation
/// lists (dates in UTC). Command `let` variables bound with [`with_variables`] resolve as
/// `$$name`. A missing value evaluates to `null`. Unknown
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

/// 168 InvalidPipelineOperator, as mongod reports an expression operator it does not know.
fn unrecognized(op: &str) -> EngineError {
    EngineError::invalid_pipeline_operator(format!("Unrecognized expression '{op}'"))
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

    /// Routes an operator to its family. Each family answers a name it does not know with the
    /// same 168 InvalidPipelineOperator as an unknown name here.
    fn operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        match op {
            "$add" | "$multiply" | "$subtract" | "$divide" | "$mod" | "$abs" | "$floor"
            | "$ceil" | "$trunc" | "$round" | "$sqrt" | "$exp" | "$ln" | "$log10" | "$pow" => {
                self.arithmetic_operator(op, arg)
            }
            "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" | "$and" | "$or" | "$not" => {
                self.comparison_operator(op, arg)
            }
            "$cond" | "$ifNull" | "$switch" => self.conditional_operator(op, arg),
            "$concat" | "$toUpper" | "$toLower" | "$strLenCP" | "$strLenBytes" | "$toString"
            | "$split" | "$substrCP" | "$substr" | "$substrBytes" | "$strcasecmp"
            | "$regexMatch" | "$trim" | "$ltrim" | "$rtrim" => self.string_operator(op, arg),
            "$size" | "$arrayElemAt" | "$first" | "$last" | "$in" | "$concatArrays"
            | "$isArray" | "$reverseArray" | "$slice" | "$range" | "$indexOfArray" | "$map"
            | "$filter" | "$reduce" => self.array_operator(op, arg),
            "$setUnion" => self.set_operator(op, arg),
            "$year" | "$month" | "$dayOfMonth" | "$hour" | "$minute" | "$second"
            | "$millisecond" | "$dayOfWeek" | "$dayOfYear" | "$dateToString" => {
                self.date_operator(op, arg)
            }
            "$type" | "$toInt" | "$toLong" | "$toDouble" | "$toBool" => {
                self.conversion_operator(op, arg)
            }
            "$getField" | "$setField" | "$unsetField" | "$mergeObjects" | "$objectToArray"
            | "$arrayToObject" => self.object_operator(op, arg),
            "$sum" | "$avg" | "$min" | "$max" | "$stdDevPop" | "$stdDevSamp" => {
                self.accumulator_operator(op, arg)
            }
            "$let" | "$literal" | "$rand" => self.variable_operator(op, arg),
            _ => Err(unrecognized(op)),
        }
    }
}

#[cfg(test)]
mod tests;
