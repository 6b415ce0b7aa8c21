//! Dotted field paths: reading values the way the query layer sees them.

use bson::{Bson, Document};

use super::limits::MAX_DEPTH;

/// A value reached by a dotted path, as the query layer sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Found<'a> {
    /// The value at the path. `from_array` marks elements contributed by implicitly unwinding
    /// an array found at the end of the path (they count for equality and comparisons, but not
    /// for `$size`, `$elemMatch` or `$type: "array"`).
    Present { value: &'a Bson, from_array: bool },
    /// The path ends in a document that lacks the field (matches `null` and `$exists: false`).
    Missing,
}

/// Parses an array index path component (`"0"`, `"12"`); leading zeros and signs are not
/// indexes, as in mongod.
pub(crate) fn array_index(part: &str) -> Option<usize> {
    if part.is_empty()
        || (part.len() > 1 && part.starts_with('0'))
        || !part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    part.parse().ok()
}

/// Every value `path` reaches in `doc`: documents are descended, arrays are traversed element by
/// element (documents only) and by numeric index, and a terminal array contributes itself and
/// its elements.
pub(crate) fn lookup<'a>(doc: &'a Document, path: &str) -> Vec<Found<'a>> {
    let parts: Vec<&str> = path.split('.').collect();
    // No stored document nests this deep, and the walk recurses once per component.
    if parts.len() > 2 * MAX_DEPTH {
        return vec![Found::Missing];
    }
    let mut out = Vec::new();
    lookup_in_doc(doc, &parts, &mut out);
    out
}

fn lookup_in_doc<'a>(doc: &'a Document, parts: &[&str], out: &mut Vec<Found<'a>>) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    match doc.get(*first) {
        Some(v) => descend(v, rest, out),
        None => out.push(Found::Missing),
    }
}

fn descend<'a>(v: &'a Bson, rest: &[&str], out: &mut Vec<Found<'a>>) {
    let Some((first, tail)) = rest.split_first() else {
        out.push(Found::Present {
            value: v,
            from_array: false,
        });
        if let Bson::Array(items) = v {
            out.extend(items.iter().map(|value| Found::Present {
                value,
                from_array: true,
            }));
        }
        return;
    };
    match v {
        Bson::Document(d) => lookup_in_doc(d, rest, out),
        Bson::Array(items) => {
            let before = out.len();
            if let Some(item) = array_index(first).and_then(|i| items.get(i)) {
                descend(item, tail, out);
            }
            for item in items {
                if let Bson::Document(d) = item {
                    lookup_in_doc(d, rest, out);
                }
            }
            if out.len() == before {
                out.push(Found::Missing);
            }
        }
        _ => out.push(Found::Missing),
    }
}

/// The single value at `path` without array traversal other than numeric indexes (what `$set`
/// targets and what `_id` lookups use).
pub(crate) fn get_exact<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for part in parts {
        cur = match cur {
            Bson::Document(d) => d.get(part)?,
            Bson::Array(a) => a.get(array_index(part)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Values at `path` for `distinct` and sort keys: like [`lookup`] but without the terminal
/// array itself (its elements stand for it) and without missing markers.
pub(crate) fn lookup_unwound<'a>(doc: &'a Document, path: &str) -> Vec<&'a Bson> {
    lookup(doc, path)
        .into_iter()
        .filter_map(|f| match f {
            Found::Present {
                value: Bson::Array(_),
                from_array: false,
            } => None,
            Found::Present { value, .. } => Some(value),
            Found::Missing => None,
        })
        .collect()
}

/// Sets a dotted path through documents, creating (or replacing non-document) intermediates.
pub(crate) fn set_dotted(doc: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            doc.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            if !matches!(doc.get(head), Some(Bson::Document(_))) {
                doc.insert(head.to_owned(), Document::new());
            }
            if let Some(Bson::Document(child)) = doc.get_mut(head) {
                set_dotted(child, rest, value);
            }
        }
    }
}

pub(crate) fn remove_dotted(doc: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            doc.remove(path);
        }
        Some((head, rest)) => {
            if let Some(Bson::Document(child)) = doc.get_mut(head) {
                remove_dotted(child, rest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn present(found: &[Found<'_>]) -> Vec<Bson> {
        found
            .iter()
            .filter_map(|f| match f {
                Found::Present { value, .. } => Some((*value).clone()),
                Found::Missing => None,
            })
            .collect()
    }

    #[test]
    fn lookup_traverses_arrays_of_documents() {
        let d = doc! {"a": [{"b": 1}, {"b": [2, 3]}, 5]};
        assert_eq!(
            present(&lookup(&d, "a.b")),
            vec![
                Bson::Int32(1),
                Bson::Array(vec![2.into(), 3.into()]),
                2.into(),
                3.into()
            ]
        );
    }

    #[test]
    fn lookup_uses_numeric_indexes() {
        let d = doc! {"a": [{"b": 1}, {"b": 2}]};
        assert_eq!(present(&lookup(&d, "a.1.b")), vec![Bson::Int32(2)]);
        assert_eq!(get_exact(&d, "a.0.b"), Some(&Bson::Int32(1)));
        assert_eq!(get_exact(&d, "a.01.b"), None);
    }

    #[test]
    fn missing_fields_are_reported() {
        let d = doc! {"a": {"c": 1}};
        assert!(matches!(lookup(&d, "a.b")[..], [Found::Missing]));
        assert!(matches!(lookup(&d, "x")[..], [Found::Missing]));
    }
}
