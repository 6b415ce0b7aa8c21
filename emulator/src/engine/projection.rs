//! Projections: `find`'s `projection`, `findAndModify`'s `fields`, and the `$project`,
//! `$unset` and `$addFields`/`$set` stages.

use bson::{Bson, Document};

use super::expression::{eval_opt, is_truthy};
use super::limits::MAX_DEPTH;
use super::path::set_dotted;
use super::query::{is_operator_doc, match_document, match_value};
use super::{EngineError, EngineResult};

#[derive(Debug, Clone, PartialEq)]
enum Spec {
    Include,
    Exclude,
    Expr(Bson),
    Nested(Node),
    /// find's `{$slice: n}` / `{$slice: [skip, limit]}`.
    Slice(i64, Option<i64>),
    /// find's `{$elemMatch: query}`.
    ElemMatch(Document),
    /// find's `{"field.$": 1}`: the first array element the query matched.
    Positional,
}

type Node = Vec<(String, Spec)>;

/// A parsed projection.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Projection {
    node: Node,
    inclusion: bool,
}

fn node_get<'a>(node: &'a Node, key: &str) -> Option<&'a Spec> {
    node.iter().find(|(k, _)| k == key).map(|(_, s)| s)
}

fn insert_path(node: &mut Node, path: &str, spec: Spec) -> EngineResult<()> {
    if path.split('.').count() > MAX_DEPTH {
        return Err(EngineError::overflow(format!(
            "projection path '{path}' has more than {MAX_DEPTH} components"
        )));
    }
    insert_path_parts(node, path, spec)
}

fn insert_path_parts(node: &mut Node, path: &str, spec: Spec) -> EngineResult<()> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    if head.is_empty() || head.starts_with('$') {
        return Err(EngineError::location(
            16410,
            format!("FieldPath field names may not start with '$' or be empty: '{path}'"),
        ));
    }
    let pos = node.iter().position(|(k, _)| k == head);
    match rest {
        None => {
            if pos.is_some() {
                return Err(EngineError::location(
                    31250,
                    format!("Path collision at {path}"),
                ));
            }
            node.push((head.to_owned(), spec));
        }
        Some(rest) => {
            let idx = match pos {
                Some(i) => i,
                None => {
                    node.push((head.to_owned(), Spec::Nested(Vec::new())));
                    node.len() - 1
                }
            };
            match node.get_mut(idx) {
                Some((_, Spec::Nested(child))) => insert_path_parts(child, rest, spec)?,
                _ => {
                    return Err(EngineError::location(
                        31250,
                        format!("Path collision at {path}"),
                    ))
                }
            }
        }
    }
    Ok(())
}

fn parse_node(spec: &Document, find_mode: bool, top: bool, node: &mut Node) -> EngineResult<()> {
    for (key, value) in spec {
        let parsed = match value {
            Bson::Boolean(b) => {
                if *b {
                    Spec::Include
                } else {
                    Spec::Exclude
                }
            }
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                if is_truthy(value) {
                    Spec::Include
                } else {
                    Spec::Exclude
                }
            }
            Bson::Document(d) if d.is_empty() => {
                return Err(EngineError::location(
                    51270,
                    "An empty sub-projection is not a valid value. Found empty object at path",
                ));
            }
            Bson::Document(d) if is_operator_doc(d) => {
                match (find_mode, d.keys().next().map(String::as_str)) {
                    (true, Some("$slice")) => parse_slice(d.get("$slice").unwrap_or(&Bson::Null))?,
                    (true, Some("$elemMatch")) => match d.get("$elemMatch") {
                        Some(Bson::Document(q)) => Spec::ElemMatch(q.clone()),
                        _ => {
                            return Err(EngineError::bad_value(
                                "elemMatch: Invalid argument, object required.",
                            ))
                        }
                    },
                    _ => Spec::Expr(value.clone()),
                }
            }
            Bson::Document(d) => {
                let mut child = Vec::new();
                parse_node(d, find_mode, false, &mut child)?;
                Spec::Nested(child)
            }
            other => Spec::Expr(other.clone()),
        };
        let _ = top;
        if find_mode && (key == "$" || key.ends_with(".$")) {
            let field = key.strip_suffix(".$").unwrap_or("");
            if field.is_empty() || field.split('.').any(|p| p == "$") || !is_truthy(value) {
                return Err(EngineError::bad_value(format!(
                    "Invalid positional projection: '{key}'"
                )));
            }
            insert_path(node, field, Spec::Positional)?;
            continue;
        }
        if key.split('.').any(|p| p == "$") {
            return Err(EngineError::bad_value(format!(
                "Positional projection '{key}' must be the last component"
            )));
        }
        insert_path(node, key, parsed)?;
    }
    Ok(())
}

fn parse_slice(arg: &Bson) -> EngineResult<Spec> {
    let as_int = |v: &Bson| match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.is_finite() => Some(f.trunc() as i64),
        _ => None,
    };
    match arg {
        Bson::Array(items) if items.len() == 2 => {
            let (Some(skip), Some(limit)) = (as_int(&items[0]), as_int(&items[1])) else {
                return Err(EngineError::location(
                    28724,
                    "First argument to $slice must be an array",
                ));
            };
            if limit <= 0 {
                return Err(EngineError::location(
                    28724,
                    "$slice limit must be positive",
                ));
            }
            Ok(Spec::Slice(skip, Some(limit)))
        }
        other => match as_int(other) {
            Some(n) => Ok(Spec::Slice(n, None)),
            None => Err(EngineError::location(
                28667,
                "$slice only supports numbers and [skip, limit] arrays",
            )),
        },
    }
}

/// Classifies a node: (has inclusion-like leaves, first excluded path, first included path).
fn classify(node: &Node, prefix: &str, top: bool, acc: &mut (Option<String>, Option<String>)) {
    for (key, spec) in node {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match spec {
            Spec::Include | Spec::Expr(_) | Spec::ElemMatch(_) | Spec::Positional => {
                if !(top && key == "_id") {
                    acc.1.get_or_insert(path);
                }
            }
            Spec::Exclude => {
                if !(top && key == "_id") {
                    acc.0.get_or_insert(path);
                }
            }
            Spec::Nested(child) => classify(child, &path, false, acc),
            Spec::Slice(..) => {}
        }
    }
}

impl Projection {
    /// Parses a projection. `find_mode` enables find's `$slice`/`$elemMatch` forms; in
    /// aggregation they are expressions.
    pub(crate) fn parse(spec: &Document, find_mode: bool) -> EngineResult<Self> {
        let mut node = Vec::new();
        parse_node(spec, find_mode, true, &mut node)?;
        let mut acc = (None, None);
        classify(&node, "", true, &mut acc);
        let inclusion = match acc {
            (Some(excluded), Some(_)) => {
                return Err(EngineError::location(
                    31254,
                    format!("Cannot do exclusion on field {excluded} in inclusion projection"),
                ));
            }
            (None, Some(_)) => true,
            (Some(_), None) => false,
            // Only `_id` and/or `$slice`: `{_id: 1}` is an inclusion, `{_id: 0}` an exclusion.
            (None, None) => matches!(node_get(&node, "_id"), Some(Spec::Include | Spec::Expr(_))),
        };
        Ok(Projection { node, inclusion })
    }

    /// Builds an exclusion projection from `$unset`'s field list.
    pub(crate) fn unset(fields: &[String]) -> EngineResult<Self> {
        let mut node = Vec::new();
        for f in fields {
            insert_path(&mut node, f, Spec::Exclude)?;
        }
        Ok(Projection {
            node,
            inclusion: false,
        })
    }

    /// Applies the projection to `doc`.
    pub(crate) fn apply(&self, doc: &Document) -> EngineResult<Document> {
        self.apply_with_query(doc, None)
    }

    /// Applies the projection; `query` resolves a positional (`"field.$"`) projection.
    pub(crate) fn apply_with_query(
        &self,
        doc: &Document,
        query: Option<&Document>,
    ) -> EngineResult<Document> {
        if self.inclusion {
            let cx = Cx { root: doc, query };
            let mut out = include_node(&self.node, doc, &cx, Some(""))?;
            // `_id` is included unless explicitly excluded, and stays first.
            let id = match node_get(&self.node, "_id") {
                None => doc.get("_id").cloned(),
                // A computed `_id` is appended with the other computed fields; move it up.
                Some(_) => out.remove("_id"),
            };
            if let Some(id) = id {
                let mut with_id = Document::new();
                with_id.insert("_id", id);
                with_id.extend(out);
                out = with_id;
            }
            Ok(out)
        } else {
            exclude_node(&self.node, doc, doc)
        }
    }
}

/// What a projection needs beyond the current sub-document.
struct Cx<'a> {
    root: &'a Document,
    query: Option<&'a Document>,
}

/// `prefix` is the dotted path of `doc` from the root while only documents were traversed
/// (a positional projection needs it), `None` below an array.
fn include_node(
    node: &Node,
    doc: &Document,
    cx: &Cx<'_>,
    prefix: Option<&str>,
) -> EngineResult<Document> {
    let mut out = Document::new();
    for (key, value) in doc {
        let Some(spec) = node_get(node, key) else {
            continue;
        };
        match spec {
            Spec::Include => {
                out.insert(key.clone(), value.clone());
            }
            Spec::Nested(child) => match value {
                Bson::Document(d) => {
                    let path = prefix.map(|p| {
                        if p.is_empty() {
                            key.clone()
                        } else {
                            format!("{p}.{key}")
                        }
                    });
                    out.insert(key.clone(), include_node(child, d, cx, path.as_deref())?);
                }
                Bson::Array(items) => {
                    out.insert(key.clone(), include_array(child, items, cx)?);
                }
                _ => {}
            },
            Spec::Slice(skip, limit) => {
                out.insert(key.clone(), slice(value, *skip, *limit));
            }
            Spec::ElemMatch(q) => {
                if let Some(hit) = elem_match(value, q)? {
                    out.insert(key.clone(), Bson::Array(vec![hit]));
                }
            }
            Spec::Positional => {
                let path = prefix.map(|p| {
                    if p.is_empty() {
                        key.clone()
                    } else {
                        format!("{p}.{key}")
                    }
                });
                if let Some(hit) = positional_element(value, path.as_deref(), cx)? {
                    out.insert(key.clone(), Bson::Array(vec![hit]));
                }
            }
            Spec::Exclude | Spec::Expr(_) => {}
        }
    }
    // Computed fields, and nested specs with computed fields whose parent is missing.
    for (key, spec) in node {
        match spec {
            Spec::Expr(e) => match eval_opt(e, cx.root)? {
                Some(v) => {
                    out.insert(key.clone(), v);
                }
                None => {
                    out.remove(key);
                }
            },
            Spec::Nested(child) if !doc.contains_key(key) && has_expr(child) => {
                out.insert(
                    key.clone(),
                    include_node(child, &Document::new(), cx, None)?,
                );
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The first element of the array at `path` that makes the query match when it is the
/// array's only element (what the positional `$` projection returns).
fn positional_element(value: &Bson, path: Option<&str>, cx: &Cx<'_>) -> EngineResult<Option<Bson>> {
    let Bson::Array(items) = value else {
        return Ok(Some(value.clone()));
    };
    let (Some(path), Some(query)) = (path, cx.query) else {
        return Err(EngineError::location(
            51246,
            "positional operator '.$' couldn't find a matching element in the array",
        ));
    };
    for item in items {
        let mut probe = cx.root.clone();
        set_dotted(&mut probe, path, Bson::Array(vec![item.clone()]));
        if match_document(query, &probe)? {
            return Ok(Some(item.clone()));
        }
    }
    Err(EngineError::location(
        51246,
        "Executor error during find command :: caused by :: positional operator '.$' couldn't find a matching element in the array",
    ))
}

fn has_expr(node: &Node) -> bool {
    node.iter().any(|(_, s)| match s {
        Spec::Expr(_) => true,
        Spec::Nested(c) => has_expr(c),
        _ => false,
    })
}

fn include_array(node: &Node, items: &[Bson], cx: &Cx<'_>) -> EngineResult<Bson> {
    let mut out = Vec::new();
    for item in items {
        match item {
            Bson::Document(d) => out.push(Bson::Document(include_node(node, d, cx, None)?)),
            Bson::Array(inner) => out.push(include_array(node, inner, cx)?),
            _ if has_expr(node) => out.push(Bson::Document(include_node(
                node,
                &Document::new(),
                cx,
                None,
            )?)),
            _ => {}
        }
    }
    Ok(Bson::Array(out))
}

fn exclude_node(node: &Node, doc: &Document, root: &Document) -> EngineResult<Document> {
    let mut out = Document::new();
    for (key, value) in doc {
        match node_get(node, key) {
            None | Some(Spec::Include) => {
                out.insert(key.clone(), value.clone());
            }
            Some(Spec::Exclude) => {}
            Some(Spec::Nested(child)) => {
                let projected = match value {
                    Bson::Document(d) => Bson::Document(exclude_node(child, d, root)?),
                    Bson::Array(items) => exclude_array(child, items, root)?,
                    other => other.clone(),
                };
                out.insert(key.clone(), projected);
            }
            Some(Spec::Slice(skip, limit)) => {
                out.insert(key.clone(), slice(value, *skip, *limit));
            }
            Some(Spec::ElemMatch(_)) | Some(Spec::Expr(_)) | Some(Spec::Positional) => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(out)
}

fn exclude_array(node: &Node, items: &[Bson], root: &Document) -> EngineResult<Bson> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(match item {
            Bson::Document(d) => Bson::Document(exclude_node(node, d, root)?),
            Bson::Array(inner) => exclude_array(node, inner, root)?,
            other => other.clone(),
        });
    }
    Ok(Bson::Array(out))
}

fn slice(value: &Bson, skip: i64, limit: Option<i64>) -> Bson {
    let Bson::Array(items) = value else {
        return value.clone();
    };
    let len = items.len() as i64;
    let (start, count) = match limit {
        // `{$slice: n}`: first n, or last |n| when negative.
        None if skip >= 0 => (0, skip),
        None => ((len + skip).max(0), len),
        Some(l) => {
            let start = if skip >= 0 {
                skip.min(len)
            } else {
                (len + skip).max(0)
            };
            (start, l)
        }
    };
    let start = usize::try_from(start).unwrap_or(0);
    let count = usize::try_from(count).unwrap_or(0);
    Bson::Array(items.iter().skip(start).take(count).cloned().collect())
}

fn elem_match(value: &Bson, query: &Document) -> EngineResult<Option<Bson>> {
    let Bson::Array(items) = value else {
        return Ok(None);
    };
    for item in items {
        let hit = match item {
            Bson::Document(d) if !is_operator_doc(query) => match_document(query, d)?,
            other if is_operator_doc(query) => match_value(other, &Bson::Document(query.clone()))?,
            _ => false,
        };
        if hit {
            return Ok(Some(item.clone()));
        }
    }
    Ok(None)
}

/// `$addFields` / `$set`: evaluates every expression against the input document, then sets the
/// results (dotted paths and nested literal documents address sub-fields; `$$REMOVE` removes).
pub(crate) fn add_fields(doc: &Document, spec: &Document) -> EngineResult<Document> {
    let mut node = Vec::new();
    for (key, value) in spec {
        let parsed = match value {
            Bson::Document(d) if !d.is_empty() && !is_operator_doc(d) => {
                let mut child = Vec::new();
                nested_exprs(d, &mut child)?;
                Spec::Nested(child)
            }
            other => Spec::Expr(other.clone()),
        };
        insert_path(&mut node, key, parsed)?;
    }
    let mut out = doc.clone();
    set_node(&node, &mut out, doc)?;
    Ok(out)
}

fn nested_exprs(d: &Document, node: &mut Node) -> EngineResult<()> {
    for (k, v) in d {
        let parsed = match v {
            Bson::Document(inner) if !inner.is_empty() && !is_operator_doc(inner) => {
                let mut child = Vec::new();
                nested_exprs(inner, &mut child)?;
                Spec::Nested(child)
            }
            other => Spec::Expr(other.clone()),
        };
        insert_path(node, k, parsed)?;
    }
    Ok(())
}

fn set_node(node: &Node, target: &mut Document, root: &Document) -> EngineResult<()> {
    for (key, spec) in node {
        match spec {
            Spec::Expr(e) => match eval_opt(e, root)? {
                Some(v) => {
                    target.insert(key.clone(), v);
                }
                None => {
                    target.remove(key);
                }
            },
            Spec::Nested(child) => match target.get_mut(key) {
                Some(Bson::Document(d)) => set_node(child, d, root)?,
                Some(Bson::Array(items)) => {
                    for item in items.iter_mut() {
                        if let Bson::Document(d) = item {
                            set_node(child, d, root)?;
                        } else {
                            let mut fresh = Document::new();
                            set_node(child, &mut fresh, root)?;
                            *item = Bson::Document(fresh);
                        }
                    }
                }
                _ => {
                    let mut fresh = Document::new();
                    set_node(child, &mut fresh, root)?;
                    target.insert(key.clone(), fresh);
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// `$replaceRoot`'s `newRoot` / `$replaceWith`: the expression must evaluate to a document.
pub(crate) fn replace_root(doc: &Document, expr: &Bson) -> EngineResult<Document> {
    match eval_opt(expr, doc)? {
        Some(Bson::Document(d)) => Ok(d),
        other => Err(EngineError::location(
            40228,
            format!(
                "'newRoot' expression must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'.",
                other.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "MISSING".into()),
                other.as_ref().map(super::value::bson_type_name).unwrap_or("missing")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn project(spec: Document, d: Document) -> EngineResult<Document> {
        Projection::parse(&spec, true)?.apply(&d)
    }

    #[test]
    fn inclusion_keeps_id_and_listed_fields_in_document_order() {
        let d = doc! {"_id": 1, "a": 1, "b": 2, "c": 3};
        assert_eq!(
            project(doc! {"c": 1, "a": 1}, d.clone()),
            Ok(doc! {"_id": 1, "a": 1, "c": 3})
        );
        assert_eq!(project(doc! {"a": 1, "_id": 0}, d), Ok(doc! {"a": 1}));
    }

    #[test]
    fn exclusion_removes_listed_fields() {
        let d = doc! {"_id": 1, "a": {"x": 1, "y": 2}, "b": 2};
        assert_eq!(
            project(doc! {"b": 0, "a.x": 0}, d.clone()),
            Ok(doc! {"_id": 1, "a": {"y": 2}})
        );
        assert_eq!(
            project(doc! {"_id": 0}, d),
            Ok(doc! {"a": {"x": 1, "y": 2}, "b": 2})
        );
    }

    #[test]
    fn dotted_inclusion_projects_through_arrays() {
        let d = doc! {"_id": 1, "a": [{"x": 1, "y": 2}, {"y": 3}, 5], "z": 1};
        assert_eq!(
            project(doc! {"a.y": 1}, d),
            Ok(doc! {"_id": 1, "a": [{"y": 2}, {"y": 3}]})
        );
    }

    #[test]
    fn computed_id_stays_first() {
        let d = doc! {"_id": 1, "a": 5, "b": 2};
        let p = Projection::parse(&doc! {"b": 1, "_id": "$a"}, false).expect("valid");
        assert_eq!(p.apply(&d), Ok(doc! {"_id": 5, "b": 2}));
    }

    #[test]
    fn mixing_inclusion_and_exclusion_is_rejected() {
        let err = project(doc! {"a": 1, "b": 0}, doc! {}).expect_err("mixed");
        assert_eq!(err.code, 31254);
    }

    #[test]
    fn computed_fields_and_slice() {
        let d = doc! {"_id": 1, "a": 2, "arr": [1, 2, 3, 4]};
        assert_eq!(
            project(doc! {"twice": {"$multiply": ["$a", 2]}}, d.clone()),
            Ok(doc! {"_id": 1, "twice": 4})
        );
        assert_eq!(
            project(doc! {"arr": {"$slice": 2}}, d.clone()),
            Ok(doc! {"_id": 1, "a": 2, "arr": [1, 2]})
        );
        assert_eq!(
            project(doc! {"arr": {"$slice": -1}, "a": 1}, d.clone()),
            Ok(doc! {"_id": 1, "a": 2, "arr": [4]})
        );
        assert_eq!(
            project(doc! {"arr": {"$slice": [1, 2]}, "_id": 0}, d),
            Ok(doc! {"a": 2, "arr": [2, 3]})
        );
    }

    #[test]
    fn elem_match_projection_returns_first_match() {
        let d = doc! {"_id": 1, "s": [{"k": 1}, {"k": 2}, {"k": 2, "n": 1}], "o": 1};
        assert_eq!(
            project(doc! {"s": {"$elemMatch": {"k": 2}}}, d),
            Ok(doc! {"_id": 1, "s": [{"k": 2}]})
        );
    }

    #[test]
    fn positional_projection_returns_the_matched_element() {
        let d = doc! {"_id": 1, "grades": [70, 90, 95], "x": 1};
        let p = Projection::parse(&doc! {"grades.$": 1}, true).expect("valid");
        let out = p
            .apply_with_query(&d, Some(&doc! {"grades": {"$gte": 85}}))
            .expect("matched");
        assert_eq!(out, doc! {"_id": 1, "grades": [90]});
        assert_eq!(p.apply_with_query(&d, None).map_err(|e| e.code), Err(51246));
        assert_eq!(
            Projection::parse(&doc! {"a.$.b": 1}, true).map_err(|e| e.code),
            Err(2)
        );
    }

    #[test]
    fn add_fields_sets_nested_paths_and_removes() {
        let d = doc! {"_id": 1, "a": {"b": 1}, "c": 5};
        let out =
            add_fields(&d, &doc! {"a.d": "$c", "c": "$$REMOVE", "e": {"f": 1}}).expect("valid");
        assert_eq!(out, doc! {"_id": 1, "a": {"b": 1, "d": 5}, "e": {"f": 1}});
    }
}
