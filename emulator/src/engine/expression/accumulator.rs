//! Accumulators used as expressions: `$sum $avg $min $max $stdDevPop $stdDevSamp` over their
//! arguments (or one array argument's elements), and [`fold_values`], the fold `$group`
//! shares.

use std::cmp::Ordering;

use bson::Bson;

use super::arithmetic::{arith, Arith};
use super::{unrecognized, Ctx};
use crate::engine::compare::compare_bson;
use crate::engine::value::Num;
use crate::engine::EngineResult;

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

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn accumulator_operator(
        &mut self,
        op: &str,
        arg: &Bson,
    ) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$sum" | "$avg" | "$min" | "$max" | "$stdDevPop" | "$stdDevSamp" => {
                let args = self.args(arg)?;
                // With one array argument the operator folds over the array's elements.
                let values: Vec<Bson> = match args.as_slice() {
                    [Some(Bson::Array(items))] => items.clone(),
                    _ => args.into_iter().flatten().collect(),
                };
                fold_values(op, &values)
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
