//! Sorting documents by a sort specification (`{a: 1, "b.c": -1}`).

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::compare::compare_bson;
use super::path::{lookup, Found};
use super::{EngineError, EngineResult};

/// A parsed sort specification: `(path, descending)` pairs in priority order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SortSpec {
    keys: Vec<(String, bool)>,
    /// `{$natural: -1}`: reverse natural (insertion) order before applying the other keys.
    natural_reverse: bool,
}

impl SortSpec {
    /// Parses `{field: 1 | -1 | {$meta: ...}}`. `$meta` keys (text score, natural order) are
    /// accepted and ignored, since the engine has no text index.
    pub(crate) fn parse(spec: &Document) -> EngineResult<Self> {
        let mut keys = Vec::with_capacity(spec.len());
        let mut natural_reverse = false;
        for (path, dir) in spec {
            if path == "$natural" {
                natural_reverse = matches!(dir, Bson::Int32(-1) | Bson::Int64(-1))
                    || matches!(dir, Bson::Double(f) if *f == -1.0);
                continue;
            }
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(EngineError::bad_value(format!(
                    "Invalid sort key: '{path}'"
                )));
            }
            let descending = match dir {
                Bson::Int32(1) | Bson::Int64(1) => false,
                Bson::Int32(-1) | Bson::Int64(-1) => true,
                Bson::Double(f) if *f == 1.0 => false,
                Bson::Double(f) if *f == -1.0 => true,
                Bson::Document(d) if d.contains_key("$meta") => continue,
                _ => {
                    return Err(EngineError::location(
                        15975,
                        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
                    ))
                }
            };
            keys.push((path.clone(), descending));
        }
        Ok(SortSpec {
            keys,
            natural_reverse,
        })
    }

    /// Whether the specification has no keys (sorting is then a no-op).
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty() && !self.natural_reverse
    }

    /// The sort key of `doc`: per path, the smallest (ascending) or largest (descending) value
    /// the path reaches, arrays contributing their elements as in mongod.
    fn key_of(&self, doc: &Document) -> Vec<Bson> {
        self.keys
            .iter()
            .map(|(path, desc)| key_for_path(doc, path, *desc))
            .collect()
    }

    fn compare_keys(&self, a: &[Bson], b: &[Bson]) -> Ordering {
        for ((x, y), (_, desc)) in a.iter().zip(b.iter()).zip(self.keys.iter()) {
            let ord = compare_bson(x, y);
            let ord = if *desc { ord.reverse() } else { ord };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }

    /// Stable sort of `docs` (ties keep their natural order).
    pub(crate) fn sort(&self, docs: &mut Vec<Document>) {
        self.sort_by_doc(docs, |d| d);
    }

    /// Stable sort of arbitrary items by the document each one stands for.
    pub(crate) fn sort_by_doc<T>(&self, items: &mut Vec<T>, doc_of: impl Fn(&T) -> &Document) {
        if self.natural_reverse {
            items.reverse();
        }
        if self.keys.is_empty() {
            return;
        }
        let mut keyed: Vec<(Vec<Bson>, T)> = items
            .drain(..)
            .map(|t| (self.key_of(doc_of(&t)), t))
            .collect();
        keyed.sort_by(|(ka, _), (kb, _)| self.compare_keys(ka, kb));
        items.extend(keyed.into_iter().map(|(_, t)| t));
    }
}

fn key_for_path(doc: &Document, path: &str, descending: bool) -> Bson {
    let found = lookup(doc, path);
    let mut best: Option<&Bson> = None;
    let mut saw_empty_array = false;
    for f in &found {
        let value = match f {
            Found::Present {
                value: Bson::Array(items),
                from_array: false,
            } => {
                saw_empty_array |= items.is_empty();
                continue;
            }
            Found::Present { value, .. } => *value,
            Found::Missing => &Bson::Null,
        };
        let better = match best {
            None => true,
            Some(b) => {
                let ord = compare_bson(value, b);
                if descending {
                    ord == Ordering::Greater
                } else {
                    ord == Ordering::Less
                }
            }
        };
        if better {
            best = Some(value);
        }
    }
    match best {
        Some(v) => v.clone(),
        // An empty array sorts before null, like mongod's undefined sort key for `[]`.
        None if saw_empty_array => Bson::Undefined,
        None => Bson::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ids(docs: &[Document]) -> Vec<i32> {
        docs.iter()
            .map(|d| d.get_i32("_id").unwrap_or(-1))
            .collect()
    }

    #[test]
    fn sorts_by_multiple_keys_stably() {
        let mut docs = vec![
            doc! {"_id": 1, "a": 2, "b": 1},
            doc! {"_id": 2, "a": 1, "b": 1},
            doc! {"_id": 3, "a": 2, "b": 2},
            doc! {"_id": 4, "a": 1, "b": 1},
        ];
        SortSpec::parse(&doc! {"a": 1, "b": -1})
            .expect("valid")
            .sort(&mut docs);
        assert_eq!(ids(&docs), vec![2, 4, 3, 1]);
    }

    #[test]
    fn mixes_types_in_bson_order_and_numbers_by_value() {
        let mut docs = vec![
            doc! {"_id": 1, "a": "s"},
            doc! {"_id": 2, "a": 2.5},
            doc! {"_id": 3},
            doc! {"_id": 4, "a": 2i64},
            doc! {"_id": 5, "a": null},
        ];
        SortSpec::parse(&doc! {"a": 1})
            .expect("valid")
            .sort(&mut docs);
        assert_eq!(ids(&docs), vec![3, 5, 4, 2, 1]);
    }

    #[test]
    fn arrays_sort_by_min_ascending_and_max_descending() {
        let docs = vec![doc! {"_id": 1, "a": [1, 10]}, doc! {"_id": 2, "a": [5]}];
        let mut asc = docs.clone();
        SortSpec::parse(&doc! {"a": 1})
            .expect("valid")
            .sort(&mut asc);
        assert_eq!(ids(&asc), vec![1, 2]);
        let mut desc = docs;
        SortSpec::parse(&doc! {"a": -1})
            .expect("valid")
            .sort(&mut desc);
        assert_eq!(ids(&desc), vec![1, 2]);
    }

    #[test]
    fn natural_order_can_be_reversed() {
        let mut docs = vec![doc! {"_id": 1}, doc! {"_id": 2}, doc! {"_id": 3}];
        SortSpec::parse(&doc! {"$natural": -1})
            .expect("valid")
            .sort(&mut docs);
        assert_eq!(ids(&docs), vec![3, 2, 1]);
        SortSpec::parse(&doc! {"$natural": 1})
            .expect("valid")
            .sort(&mut docs);
        assert_eq!(ids(&docs), vec![3, 2, 1]);
    }

    #[test]
    fn dotted_paths_and_bad_directions() {
        let mut docs = vec![
            doc! {"_id": 1, "a": {"b": 9}},
            doc! {"_id": 2, "a": {"b": 3}},
        ];
        SortSpec::parse(&doc! {"a.b": 1})
            .expect("valid")
            .sort(&mut docs);
        assert_eq!(ids(&docs), vec![2, 1]);
        assert_eq!(
            SortSpec::parse(&doc! {"a": 2}).map_err(|e| e.code),
            Err(15975)
        );
    }
}
