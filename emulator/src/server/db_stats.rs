//! `dbStats` (mongosh's `db.stats()`): a database's collections, views, documents and sizes.
//!
//! Sizes are estimates, as `$collStats` gives them: a document's size is its BSON size, a
//! collection's storage size its data size (no compression, no free space), and an index's
//! size one entry per document: the BSON size of the document's key values plus 8 bytes of
//! record id. `fsUsedSize` and `fsTotalSize` are not reported (the store is in memory).
//!
//! On a mongod the reply is mongod's shape. On a router it is mongos's: the figures of every
//! shard under `raw` (keyed `<shard>/<host>`), each computed from the documents that shard owns
//! (module `sharding`), and their sums at the top.

use bson::{doc, Bson, Document};

use super::error::{codes, CommandError};
use super::sharding::Sharding;
use crate::engine::Store;

/// The figures of one database (on one shard, or in all).
#[derive(Debug, Default, Clone, PartialEq)]
struct Figures {
    collections: i64,
    views: i64,
    objects: i64,
    data_size: i64,
    indexes: i64,
    index_size: i64,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.collections += other.collections;
        self.views += other.views;
        self.objects += other.objects;
        self.data_size += other.data_size;
        self.indexes += other.indexes;
        self.index_size += other.index_size;
    }

    fn to_document(&self, db: &str, scale: i64) -> Document {
        let avg = if self.objects > 0 {
            self.data_size as f64 / self.objects as f64
        } else {
            0.0
        };
        let storage = self.data_size;
        doc! {
            "db": db,
            "collections": self.collections,
            "views": self.views,
            "objects": self.objects,
            "avgObjSize": avg,
            "dataSize": self.data_size / scale,
            "storageSize": storage / scale,
            "indexes": self.indexes,
            "indexSize": self.index_size / scale,
            "totalSize": (storage + self.index_size) / scale,
            "scaleFactor": scale,
        }
    }
}

/// `scale`: a number of at least 1 (fractions are dropped, as mongod does).
fn parse_scale(body: &Document) -> Result<i64, CommandError> {
    let scale = match body.get("scale") {
        None => 1,
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(d)) if d.is_finite() => d.trunc().clamp(-1e18, 1e18) as i64,
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "dbStats: 'scale' must be a number",
            ))
        }
    };
    if scale < 1 {
        return Err(CommandError::new(
            codes::BAD_VALUE,
            "dbStats: scale has to be >= 1",
        ));
    }
    Ok(scale)
}

fn bson_size(value: &Bson) -> i64 {
    bson::to_vec(&doc! { "": value.clone() })
        .map(|v| v.len() as i64)
        .unwrap_or(0)
}

/// Where the documents of each collection go: shard count and owner of one document.
type Partition<'a> = Option<(&'a Sharding, usize)>;

/// The figures of `db`, per part (one part on a mongod, one per shard on a router).
fn figures(
    store: &Store,
    db: &str,
    partition: Partition<'_>,
) -> Result<Vec<Figures>, CommandError> {
    let parts = partition.map_or(1, |(_, n)| n.max(1));
    let mut out = vec![Figures::default(); parts];
    let primary = partition
        .map_or(0, |(s, _)| s.primary_of(db))
        .min(parts - 1);
    for listed in store.list_collections(db, None, true)? {
        let name = listed.get_str("name").unwrap_or_default().to_string();
        if listed.get_str("type") == Ok("view") {
            out[primary].views += 1;
            continue;
        }
        let index_keys: Vec<Document> = store
            .list_indexes(db, &name)
            .unwrap_or_default()
            .iter()
            .filter_map(|spec| spec.get_document("key").ok().cloned())
            .collect();
        let mut holds = vec![false; parts];
        let holders = match partition {
            Some((s, _)) => s.holders(db, &name),
            None => vec![0],
        };
        for h in holders {
            if let Some(slot) = holds.get_mut(h) {
                *slot = true;
            }
        }
        for doc in store.documents(db, &name) {
            let part = match partition {
                Some((s, _)) => s.owner_of_document(db, &name, doc).min(parts - 1),
                None => 0,
            };
            let f = &mut out[part];
            f.objects += 1;
            f.data_size += bson::to_vec(doc).map(|v| v.len() as i64).unwrap_or(0);
            for key in &index_keys {
                let entry: i64 = key
                    .keys()
                    .map(|field| {
                        crate::engine::path_value(doc, field)
                            .map(bson_size)
                            .unwrap_or(1)
                    })
                    .sum();
                f.index_size += entry + 8;
            }
        }
        for (part, held) in holds.iter().enumerate() {
            if *held {
                out[part].collections += 1;
                out[part].indexes += index_keys.len() as i64;
            }
        }
    }
    Ok(out)
}

/// `dbStats` on a mongod.
pub(crate) fn run(store: &Store, db: &str, body: &Document) -> Result<Document, CommandError> {
    let scale = parse_scale(body)?;
    let all = figures(store, db, None)?;
    let mut reply = all
        .first()
        .cloned()
        .unwrap_or_default()
        .to_document(db, scale);
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// `dbStats` on a router: every shard's figures under `raw`, their sums at the top.
pub(crate) fn run_on_router(
    store: &Store,
    sharding: &Sharding,
    db: &str,
    body: &Document,
) -> Result<Document, CommandError> {
    let scale = parse_scale(body)?;
    let per_shard = figures(store, db, Some((sharding, sharding.shards.len())))?;
    let mut raw = Document::new();
    let mut total = Figures::default();
    for (shard, f) in sharding.shards.iter().zip(&per_shard) {
        let mut d = f.to_document(db, scale);
        d.insert("ok", 1.0);
        raw.insert(format!("{0}/{0}.emulated:27018", shard.name), d);
        total.add(f);
    }
    // A collection or view is one however many shards hold part of it.
    let logical = figures(store, db, None)?;
    if let Some(l) = logical.first() {
        total.collections = l.collections;
        total.views = l.views;
    }
    let mut reply = doc! { "raw": raw };
    reply.extend(total.to_document(db, scale));
    reply.insert("ok", 1.0);
    Ok(reply)
}
