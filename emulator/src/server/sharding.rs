//! The sharded persona's shard layer: N logical shards behind the routers, each with an overload
//! model of its own, shard keys and chunk ownership per collection, and which shards a request
//! targets.
//!
//! Data placement is logical. Every document stays in the one shared store; a shard "owns" a
//! document when the document's shard key value falls in a chunk that shard owns. Ownership
//! decides only which shards' models a router charges for a request (module `routing`) and how
//! `dbStats` splits its figures per shard. `moveChunk` changes ownership and moves no data;
//! there is no balancer, no migration, no orphan.
//!
//! Shard keys are single fields, as `shardCollection` gives them:
//!
//! * `{field: "hashed"}`: the value's stable hash (numbers of equal value hash alike, whatever
//!   their BSON type, as mongod's hashed index does) picks one of
//!   [`HASHED_CHUNKS_PER_SHARD`] × N hash ranges; the ranges are dealt to the shards
//!   round-robin at `shardCollection`, and `moveChunk` can reassign any of them.
//! * `{field: 1}`: ranged. One chunk (MinKey to MaxKey) on the database's primary shard until
//!   `split` cuts it; `moveChunk` reassigns the chunk holding a value.
//!
//! A document without the field has the value null, as mongos treats a missing shard key.
//! Collections not sharded live on their database's primary shard: shard 0 unless
//! `enableSharding` named another with `primaryShard`. Compound shard keys are refused.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bson::{doc, Bson, Document};

use super::error::{codes, CommandError};
use super::lock;
use crate::engine::compare_bson;
use crate::model::Model;

/// Hash ranges per shard a hashed shard key starts with (mongos's default for an empty
/// collection is two chunks per shard).
pub(crate) const HASHED_CHUNKS_PER_SHARD: usize = 2;
/// Most chunks one ranged collection may be split into (a bound on the catalog's memory).
const MAX_CHUNKS_PER_COLLECTION: usize = 10_000;
/// Most sharded collections (a bound on the catalog's memory).
const MAX_SHARDED_COLLECTIONS: usize = 10_000;
/// Most databases with a primary shard set by `enableSharding`.
const MAX_DATABASES: usize = 10_000;
/// Most values an `$in` may list before targeting gives up and scatters (targeting work per
/// request stays bounded).
const MAX_TARGETED_VALUES: usize = 1000;
/// mongos's NamespaceNotSharded.
const NAMESPACE_NOT_SHARDED: i32 = 118;
/// mongos's ShardNotFound.
const SHARD_NOT_FOUND: i32 = 70;
/// mongos's AlreadyInitialized (the collection is sharded with another key).
const ALREADY_INITIALIZED: i32 = 23;

/// How a router's retries and a shard's rejections went, per shard (`serverStatus`
/// `labOverloadShards[i].routing`), in the spirit of mongos's per-shard `shardingStatistics`.
#[derive(Debug, Default)]
pub(crate) struct RoutingStats {
    /// Requests (child requests of client commands) the routers sent to the shard, retries
    /// included.
    pub(crate) requests: AtomicU64,
    /// Overload errors (462, 433 and random rejections) the shard answered.
    pub(crate) overload_errors: AtomicU64,
    /// Retries the routers sent after an overload error.
    pub(crate) overload_retries: AtomicU64,
    /// Errors the routers gave up on (passed on to the client as an error or write errors).
    pub(crate) failed: AtomicU64,
}

impl RoutingStats {
    pub(crate) fn to_document(&self) -> Document {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        doc! {
            "requests": get(&self.requests),
            "overloadErrors": get(&self.overload_errors),
            "overloadRetries": get(&self.overload_retries),
            "failed": get(&self.failed),
        }
    }
}

/// One logical shard.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) index: usize,
    /// `shard0`, `shard1`, ...: the name `moveChunk`'s `to` and `listShards` use.
    pub(crate) name: String,
    /// This shard's resources: every request a router sends it goes through this model.
    pub(crate) model: Arc<Model>,
    pub(crate) stats: RoutingStats,
}

/// The name of shard `index`.
pub(crate) fn shard_name(index: usize) -> String {
    format!("shard{index}")
}

/// How a collection's documents map to shards.
#[derive(Debug, Clone, PartialEq)]
enum Placement {
    /// Hash range `hash % owners.len()` is owned by `owners[range]`.
    Hashed { owners: Vec<usize> },
    /// Chunk `i` holds values from `splits[i - 1]` (MinKey for the first) up to, not
    /// including, `splits[i]` (MaxKey for the last); `owners[i]` owns it. `splits` is sorted
    /// and `owners.len() == splits.len() + 1`.
    Ranged {
        splits: Vec<Bson>,
        owners: Vec<usize>,
    },
}

/// A sharded collection's key and chunks.
#[derive(Debug, Clone, PartialEq)]
struct ShardKey {
    /// The key's field (a dotted path is allowed).
    field: String,
    placement: Placement,
}

impl ShardKey {
    fn pattern(&self) -> Document {
        match self.placement {
            Placement::Hashed { .. } => doc! { self.field.clone(): "hashed" },
            Placement::Ranged { .. } => doc! { self.field.clone(): 1i32 },
        }
    }

    /// The shard owning the chunk that holds `value`.
    fn owner(&self, value: &Bson) -> usize {
        match &self.placement {
            Placement::Hashed { owners } => owners
                .get(hash_range(value, owners.len()))
                .copied()
                .unwrap_or(0),
            Placement::Ranged { splits, owners } => {
                owners.get(chunk_of(splits, value)).copied().unwrap_or(0)
            }
        }
    }

    /// Shards owning a chunk that may hold values between `low` and `high` (either open).
    /// Hashed keys cannot target ranges: every owner.
    fn owners_between(&self, low: Option<&Bson>, high: Option<&Bson>) -> Vec<usize> {
        match &self.placement {
            Placement::Hashed { owners } => sorted_unique(owners.clone()),
            Placement::Ranged { splits, owners } => {
                let first = low.map_or(0, |v| chunk_of(splits, v));
                let last = high.map_or(owners.len().saturating_sub(1), |v| chunk_of(splits, v));
                if first > last {
                    return Vec::new();
                }
                sorted_unique(owners.get(first..=last).unwrap_or_default().to_vec())
            }
        }
    }

    /// `[{min, max, shard}]` of every chunk (hash ranges for hashed keys), for `labShardingState`.
    fn chunks_document(&self) -> Vec<Bson> {
        match &self.placement {
            Placement::Hashed { owners } => owners
                .iter()
                .enumerate()
                .map(|(range, owner)| {
                    Bson::Document(doc! {
                        "hashRange": range as i64,
                        "of": owners.len() as i64,
                        "shard": shard_name(*owner),
                    })
                })
                .collect(),
            Placement::Ranged { splits, owners } => owners
                .iter()
                .enumerate()
                .map(|(i, owner)| {
                    let min = match i {
                        0 => Bson::MinKey,
                        _ => splits.get(i - 1).cloned().unwrap_or(Bson::MinKey),
                    };
                    let max = splits.get(i).cloned().unwrap_or(Bson::MaxKey);
                    Bson::Document(doc! {
                        "min": { self.field.clone(): min },
                        "max": { self.field.clone(): max },
                        "shard": shard_name(*owner),
                    })
                })
                .collect(),
        }
    }
}

/// The chunk holding `value`: how many split points are at or below it.
fn chunk_of(splits: &[Bson], value: &Bson) -> usize {
    splits.partition_point(|s| compare_bson(s, value) != std::cmp::Ordering::Greater)
}

fn sorted_unique(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

/// FNV-1a over bytes: stable across runs and platforms (std's hasher is not).
fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// A stable hash of a shard key value. Numbers of equal value hash alike whatever their type
/// (`1`, `1i64` and `1.0` are one shard key value to a query, so they must land on one shard).
fn value_hash(value: &Bson) -> u64 {
    let integral = match value {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e18 => Some(*d as i64),
        _ => None,
    };
    if let Some(i) = integral {
        return fnv1a(&i.to_le_bytes(), fnv1a(b"int", FNV_OFFSET));
    }
    match value {
        Bson::Double(d) => fnv1a(&d.to_bits().to_le_bytes(), fnv1a(b"double", FNV_OFFSET)),
        Bson::String(s) => fnv1a(s.as_bytes(), fnv1a(b"string", FNV_OFFSET)),
        Bson::Null | Bson::Undefined => fnv1a(b"null", FNV_OFFSET),
        other => {
            // Any other type: its BSON encoding inside a one-field document.
            let bytes = bson::to_vec(&doc! { "": other.clone() }).unwrap_or_default();
            fnv1a(&bytes, fnv1a(b"bson", FNV_OFFSET))
        }
    }
}

fn hash_range(value: &Bson, ranges: usize) -> usize {
    if ranges == 0 {
        return 0;
    }
    (value_hash(value) % ranges as u64) as usize
}

/// What a query's filter says about the shard key field.
#[derive(Debug, Clone, PartialEq)]
enum KeyConstraint {
    /// Nothing usable: every shard owning a chunk.
    Any,
    /// The field equals one of these values.
    Values(Vec<Bson>),
    /// The field lies between these (inclusive or not: targeting stays conservative).
    Range {
        low: Option<Bson>,
        high: Option<Bson>,
    },
}

/// Reads the constraint a filter puts on `field` at its top level (`field: v`,
/// `field: {$eq | $in | $gt | $gte | $lt | $lte: ...}`). Other operators on the field narrow
/// the match further, so ignoring them keeps targeting correct (it may target more shards
/// than needed, never fewer).
fn constraint(filter: &Document, field: &str) -> KeyConstraint {
    let Some(value) = filter.get(field) else {
        return KeyConstraint::Any;
    };
    match value {
        Bson::RegularExpression(_) => KeyConstraint::Any,
        Bson::Document(ops) if ops.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if let Some(v) = ops.get("$eq") {
                return match v {
                    Bson::RegularExpression(_) => KeyConstraint::Any,
                    v => KeyConstraint::Values(vec![v.clone()]),
                };
            }
            if let Some(Bson::Array(list)) = ops.get("$in") {
                let plain = list.len() <= MAX_TARGETED_VALUES
                    && list
                        .iter()
                        .all(|v| !matches!(v, Bson::RegularExpression(_)));
                return if plain {
                    KeyConstraint::Values(list.clone())
                } else {
                    KeyConstraint::Any
                };
            }
            let low = ops.get("$gt").or_else(|| ops.get("$gte")).cloned();
            let high = ops.get("$lt").or_else(|| ops.get("$lte")).cloned();
            if low.is_none() && high.is_none() {
                KeyConstraint::Any
            } else {
                KeyConstraint::Range { low, high }
            }
        }
        v => KeyConstraint::Values(vec![v.clone()]),
    }
}

/// Which shards the routers sent a cursor's first batch from, so its getMores go there too.
/// Bounded: the oldest entries are forgotten (their getMores then go to every shard).
#[derive(Debug, Default)]
struct CursorShards {
    order: VecDeque<i64>,
    shards: HashMap<i64, Vec<usize>>,
}

/// The shard layer of a sharded deployment (held by `Shared` for `Topology::Sharded`).
#[derive(Debug)]
pub(crate) struct Sharding {
    pub(crate) shards: Vec<Shard>,
    catalog: Mutex<Catalog>,
    cursors: Mutex<CursorShards>,
    max_cursors: usize,
}

#[derive(Debug, Default)]
struct Catalog {
    /// Primary shard by database (absent: shard 0).
    primaries: BTreeMap<String, usize>,
    /// Shard key by namespace (`db.coll`).
    collections: BTreeMap<String, ShardKey>,
}

/// Splits `db.coll` (the collection part may contain dots).
fn split_namespace(ns: &str) -> Option<(&str, &str)> {
    let (db, coll) = ns.split_once('.')?;
    (!db.is_empty() && !coll.is_empty()).then_some((db, coll))
}

/// The namespace string a sharding command names (`shardCollection: "db.coll"`), checked.
fn namespace_arg<'a>(body: &'a Document, name: &str) -> Result<(&'a str, &'a str), CommandError> {
    match body.get(name) {
        Some(Bson::String(ns)) => split_namespace(ns).ok_or_else(|| {
            CommandError::new(
                codes::INVALID_NAMESPACE,
                format!("{name}: invalid namespace {ns:?} (expected \"<database>.<collection>\")"),
            )
        }),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{name}' must be a namespace string \"<database>.<collection>\""
        ))),
        None => Err(CommandError::new(
            codes::IDL_MISSING_FIELD,
            format!("{name}: the namespace is missing"),
        )),
    }
}

/// The single value a `{field: value}` document (split's `middle`, moveChunk's `find`) gives
/// for the key's field.
fn key_value<'a>(
    doc: Option<&'a Bson>,
    what: &str,
    key: &ShardKey,
) -> Result<&'a Bson, CommandError> {
    let Some(Bson::Document(d)) = doc else {
        return Err(CommandError::type_mismatch(format!(
            "'{what}' must be a document {{{}: <value>}}",
            key.field
        )));
    };
    if d.len() != 1 {
        return Err(CommandError::bad_value(format!(
            "'{what}' must name exactly the shard key field {:?}, got {d}",
            key.field
        )));
    }
    d.get(&key.field).ok_or_else(|| {
        CommandError::bad_value(format!(
            "'{what}' {d} does not name the shard key field {:?}",
            key.field
        ))
    })
}

impl Sharding {
    /// A shard layer of `models.len()` shards.
    pub(crate) fn new(models: Vec<Arc<Model>>, max_cursors: usize) -> Sharding {
        Sharding {
            shards: models
                .into_iter()
                .enumerate()
                .map(|(index, model)| Shard {
                    index,
                    name: shard_name(index),
                    model,
                    stats: RoutingStats::default(),
                })
                .collect(),
            catalog: Mutex::new(Catalog::default()),
            cursors: Mutex::new(CursorShards::default()),
            max_cursors: max_cursors.max(1),
        }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.shards.len()).collect()
    }

    fn shard_index(&self, name: &str) -> Option<usize> {
        self.shards.iter().find(|s| s.name == name).map(|s| s.index)
    }

    fn primary(catalog: &Catalog, db: &str) -> usize {
        catalog.primaries.get(db).copied().unwrap_or(0)
    }

    /// The database's primary shard (where its unsharded collections live).
    pub(crate) fn primary_of(&self, db: &str) -> usize {
        Self::primary(&lock(&self.catalog), db)
    }

    /// The shard owning `doc` of `db.coll`.
    pub(crate) fn owner_of_document(&self, db: &str, coll: &str, doc: &Document) -> usize {
        let catalog = lock(&self.catalog);
        match catalog.collections.get(&format!("{db}.{coll}")) {
            Some(key) => {
                let value = crate::engine::path_value(doc, &key.field).unwrap_or(&Bson::Null);
                key.owner(value)
            }
            None => Self::primary(&catalog, db),
        }
    }

    /// Shards that may hold documents of `db.coll` matching `filter` (None: no filter).
    /// `simple_collation` is false when the command compares strings under a collation, which
    /// makes string equality on the key unusable for targeting (mongos scatters then too).
    pub(crate) fn targets_for_filter(
        &self,
        db: &str,
        coll: &str,
        filter: Option<&Document>,
        simple_collation: bool,
    ) -> Vec<usize> {
        let catalog = lock(&self.catalog);
        let Some(key) = catalog.collections.get(&format!("{db}.{coll}")) else {
            return vec![Self::primary(&catalog, db)];
        };
        match filter {
            None => key.owners_between(None, None),
            Some(f) => Self::filter_targets(key, f, simple_collation, 0),
        }
    }

    /// Targets of `filter`: its own constraint on the key intersected with each `$and`
    /// clause's. `depth` bounds the recursion through nested `$and`s.
    fn filter_targets(
        key: &ShardKey,
        filter: &Document,
        simple_collation: bool,
        depth: usize,
    ) -> Vec<usize> {
        let mut targets = match constraint(filter, &key.field) {
            KeyConstraint::Any => key.owners_between(None, None),
            KeyConstraint::Values(values) => {
                let strings = values
                    .iter()
                    .any(|v| matches!(v, Bson::String(_) | Bson::Symbol(_)));
                if strings && !simple_collation {
                    key.owners_between(None, None)
                } else {
                    sorted_unique(values.iter().map(|v| key.owner(v)).collect())
                }
            }
            KeyConstraint::Range { low, high } => key.owners_between(low.as_ref(), high.as_ref()),
        };
        if depth < 8 {
            if let Some(Bson::Array(clauses)) = filter.get("$and") {
                for clause in clauses.iter().filter_map(Bson::as_document) {
                    let narrowed = Self::filter_targets(key, clause, simple_collation, depth + 1);
                    targets.retain(|t| narrowed.contains(t));
                }
            }
        }
        targets
    }

    /// Every shard holding part of `db.coll`: the owners of its chunks, or the primary shard.
    pub(crate) fn holders(&self, db: &str, coll: &str) -> Vec<usize> {
        self.targets_for_filter(db, coll, None, true)
    }

    /// Every shard.
    pub(crate) fn every_shard(&self) -> Vec<usize> {
        self.all()
    }

    /// Remembers which shards a cursor's first batch came from.
    pub(crate) fn remember_cursor(&self, id: i64, shards: Vec<usize>) {
        let mut c = lock(&self.cursors);
        while c.order.len() >= self.max_cursors {
            match c.order.pop_front() {
                Some(old) => {
                    c.shards.remove(&old);
                }
                None => break,
            }
        }
        if c.shards.insert(id, shards).is_none() {
            c.order.push_back(id);
        }
    }

    /// The shards of a cursor (every shard when it is not known: forgotten or never opened here).
    pub(crate) fn cursor_targets(&self, id: i64) -> Vec<usize> {
        lock(&self.cursors)
            .shards
            .get(&id)
            .cloned()
            .unwrap_or_else(|| self.all())
    }

    /// Forgets a finished or killed cursor.
    pub(crate) fn forget_cursor(&self, id: i64) {
        let mut c = lock(&self.cursors);
        if c.shards.remove(&id).is_some() {
            c.order.retain(|i| *i != id);
        }
    }

    /// Forgets the sharding of a dropped collection (or of every collection of a dropped
    /// database when `coll` is None), as mongos drops its routing table.
    pub(crate) fn forget_collection(&self, db: &str, coll: Option<&str>) {
        let mut catalog = lock(&self.catalog);
        match coll {
            Some(c) => {
                catalog.collections.remove(&format!("{db}.{c}"));
            }
            None => {
                let prefix = format!("{db}.");
                catalog.collections.retain(|ns, _| !ns.starts_with(&prefix));
                catalog.primaries.remove(db);
            }
        }
    }

    /// `{enableSharding: "<db>", primaryShard: "<shard name>"}` (primaryShard optional).
    pub(crate) fn enable_sharding(&self, body: &Document) -> Result<Document, CommandError> {
        let db = match body.get("enableSharding") {
            Some(Bson::String(db)) if !db.is_empty() && !db.contains('.') => db.clone(),
            Some(Bson::String(db)) => {
                return Err(CommandError::new(
                    codes::INVALID_NAMESPACE,
                    format!("enableSharding: invalid database name {db:?}"),
                ))
            }
            _ => {
                return Err(CommandError::type_mismatch(
                    "'enableSharding' must be a database name",
                ))
            }
        };
        let primary = match body.get("primaryShard") {
            None => None,
            Some(Bson::String(name)) => Some(self.shard_index(name).ok_or_else(|| {
                CommandError::new(
                    SHARD_NOT_FOUND,
                    format!("enableSharding: no shard named {name:?} ({})", self.names()),
                )
            })?),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "'primaryShard' must be a shard name",
                ))
            }
        };
        let mut catalog = lock(&self.catalog);
        if let Some(p) = primary {
            if !catalog.primaries.contains_key(&db) && catalog.primaries.len() >= MAX_DATABASES {
                return Err(CommandError::new(
                    codes::OPERATION_FAILED,
                    format!(
                        "enableSharding: the emulator keeps at most {MAX_DATABASES} primary shards"
                    ),
                ));
            }
            catalog.primaries.insert(db, p);
        }
        Ok(doc! { "ok": 1.0 })
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.shards.iter().map(|s| s.name.as_str()).collect();
        format!("the shards are {}", names.join(", "))
    }

    /// Checks `shardCollection`'s `key`: one field, `1` or `"hashed"`.
    fn parse_key(&self, key: Option<&Bson>, primary: usize) -> Result<ShardKey, CommandError> {
        let Some(Bson::Document(key)) = key else {
            return Err(CommandError::type_mismatch(
                "shardCollection: 'key' must be a document such as {x: 1} or {x: \"hashed\"}",
            ));
        };
        let mut fields = key.iter();
        let Some((field, kind)) = fields.next() else {
            return Err(CommandError::bad_value(
                "shardCollection: 'key' must name a field",
            ));
        };
        if fields.next().is_some() {
            return Err(CommandError::bad_value(format!(
                "shardCollection: compound shard keys such as {key} are not supported by the \
                 emulator (use one field, ranged or hashed)"
            )));
        }
        if field.is_empty() || field.starts_with('$') || field.split('.').any(str::is_empty) {
            return Err(CommandError::bad_value(format!(
                "shardCollection: {field:?} is not a valid shard key field"
            )));
        }
        let one = match kind {
            Bson::Int32(1) | Bson::Int64(1) => true,
            Bson::Double(d) => *d == 1.0,
            _ => false,
        };
        let placement = match kind {
            Bson::String(s) if s == "hashed" => {
                let n = self.shards.len().max(1);
                Placement::Hashed {
                    owners: (0..n * HASHED_CHUNKS_PER_SHARD).map(|i| i % n).collect(),
                }
            }
            _ if one => Placement::Ranged {
                splits: Vec::new(),
                owners: vec![primary],
            },
            other => {
                return Err(CommandError::bad_value(format!(
                    "shardCollection: unsupported shard key pattern {{{field}: {other}}} (values \
                     must be 1 or \"hashed\")"
                )))
            }
        };
        Ok(ShardKey {
            field: field.clone(),
            placement,
        })
    }

    /// `{shardCollection: "db.coll", key: {field: 1 | "hashed"}}`. Returns the namespace to
    /// create when it does not exist yet (mongos creates it), and the reply.
    pub(crate) fn shard_collection(
        &self,
        body: &Document,
    ) -> Result<((String, String), Document), CommandError> {
        let (db, coll) = namespace_arg(body, "shardCollection")?;
        if db == "admin" || db == "local" || db == "config" {
            return Err(CommandError::new(
                codes::ILLEGAL_OPERATION,
                format!("shardCollection: collections of the {db} database cannot be sharded"),
            ));
        }
        let ns = format!("{db}.{coll}");
        let mut catalog = lock(&self.catalog);
        let key = self.parse_key(body.get("key"), Self::primary(&catalog, db))?;
        if let Some(existing) = catalog.collections.get(&ns) {
            if existing.field == key.field
                && std::mem::discriminant(&existing.placement)
                    == std::mem::discriminant(&key.placement)
            {
                // Already sharded on this key: mongos answers ok.
                return Ok((
                    (db.to_string(), coll.to_string()),
                    doc! { "collectionsharded": ns, "ok": 1.0 },
                ));
            }
            return Err(CommandError::new(
                ALREADY_INITIALIZED,
                format!(
                    "sharding already enabled for collection {ns} with options {{ key: {} }}",
                    existing.pattern()
                ),
            ));
        }
        if catalog.collections.len() >= MAX_SHARDED_COLLECTIONS {
            return Err(CommandError::new(
                codes::OPERATION_FAILED,
                format!("shardCollection: the emulator keeps at most {MAX_SHARDED_COLLECTIONS} sharded collections"),
            ));
        }
        catalog.collections.insert(ns.clone(), key);
        Ok((
            (db.to_string(), coll.to_string()),
            doc! { "collectionsharded": ns, "ok": 1.0 },
        ))
    }

    fn sharded_key(
        catalog: &Catalog,
        name: &str,
        db: &str,
        coll: &str,
    ) -> Result<ShardKey, CommandError> {
        catalog
            .collections
            .get(&format!("{db}.{coll}"))
            .cloned()
            .ok_or_else(|| {
                CommandError::new(
                    NAMESPACE_NOT_SHARDED,
                    format!("{name}: {db}.{coll} is not sharded (run shardCollection first)"),
                )
            })
    }

    /// `{split: "db.coll", middle: {field: value}}`: cuts the chunk holding `value` at it (both
    /// halves keep the chunk's owner). Ranged keys only.
    pub(crate) fn split(&self, body: &Document) -> Result<Document, CommandError> {
        let (db, coll) = namespace_arg(body, "split")?;
        let mut catalog = lock(&self.catalog);
        let key = Self::sharded_key(&catalog, "split", db, coll)?;
        if body.contains_key("find") || body.contains_key("bounds") {
            return Err(CommandError::bad_value(
                "split: only 'middle' is supported by the emulator (it keeps no chunk sizes to \
                 find a median with 'find' or 'bounds')",
            ));
        }
        let value = key_value(body.get("middle"), "middle", &key)?;
        if matches!(value, Bson::MinKey | Bson::MaxKey) {
            return Err(CommandError::bad_value(
                "split: cannot split at MinKey or MaxKey",
            ));
        }
        let Placement::Ranged { splits, owners } = &key.placement else {
            return Err(CommandError::bad_value(format!(
                "split: {db}.{coll} has a hashed shard key; the emulator splits ranged keys only \
                 (hash ranges are fixed at shardCollection; use moveChunk to place them)"
            )));
        };
        let at = chunk_of(splits, value);
        if at > 0
            && splits
                .get(at - 1)
                .is_some_and(|s| compare_bson(s, value) == std::cmp::Ordering::Equal)
        {
            return Err(CommandError::bad_value(format!(
                "split: {{{}: {value}}} is already a chunk boundary",
                key.field
            )));
        }
        if owners.len() >= MAX_CHUNKS_PER_COLLECTION {
            return Err(CommandError::new(
                codes::OPERATION_FAILED,
                format!("split: the emulator keeps at most {MAX_CHUNKS_PER_COLLECTION} chunks per collection"),
            ));
        }
        let owner = owners.get(at).copied().unwrap_or(0);
        let mut splits = splits.clone();
        let mut owners = owners.clone();
        splits.insert(at, value.clone());
        owners.insert(at, owner);
        if let Some(entry) = catalog.collections.get_mut(&format!("{db}.{coll}")) {
            entry.placement = Placement::Ranged { splits, owners };
        }
        Ok(doc! { "ok": 1.0 })
    }

    /// `{moveChunk: "db.coll", find: {field: value}, to: "<shard name>"}`: the chunk (or hash
    /// range) holding `value` becomes `to`'s. Ownership only: no data moves.
    pub(crate) fn move_chunk(&self, body: &Document) -> Result<Document, CommandError> {
        let (db, coll) = namespace_arg(body, "moveChunk")?;
        let mut catalog = lock(&self.catalog);
        let key = Self::sharded_key(&catalog, "moveChunk", db, coll)?;
        if body.contains_key("bounds") {
            return Err(CommandError::bad_value(
                "moveChunk: only 'find' is supported by the emulator",
            ));
        }
        let value = key_value(body.get("find"), "find", &key)?;
        let to = match body.get("to") {
            Some(Bson::String(name)) => self.shard_index(name).ok_or_else(|| {
                CommandError::new(
                    SHARD_NOT_FOUND,
                    format!("moveChunk: no shard named {name:?} ({})", self.names()),
                )
            })?,
            _ => {
                return Err(CommandError::type_mismatch(
                    "moveChunk: 'to' must be a shard name",
                ))
            }
        };
        let placement = match key.placement {
            Placement::Hashed { mut owners } => {
                let range = hash_range(value, owners.len());
                if let Some(o) = owners.get_mut(range) {
                    *o = to;
                }
                Placement::Hashed { owners }
            }
            Placement::Ranged { splits, mut owners } => {
                let chunk = chunk_of(&splits, value);
                if let Some(o) = owners.get_mut(chunk) {
                    *o = to;
                }
                Placement::Ranged { splits, owners }
            }
        };
        if let Some(entry) = catalog.collections.get_mut(&format!("{db}.{coll}")) {
            entry.placement = placement;
        }
        Ok(doc! { "millis": 0i64, "ok": 1.0 })
    }

    /// `{listShards: 1}`: every shard by name. The hosts are placeholders: a shard has no
    /// listener of its own (clients reach data through the routers only).
    pub(crate) fn list_shards(&self) -> Document {
        let shards: Vec<Bson> = self
            .shards
            .iter()
            .map(|s| {
                Bson::Document(doc! {
                    "_id": s.name.clone(),
                    "host": format!("{0}/{0}.emulated:27018", s.name),
                    "state": 1i32,
                })
            })
            .collect();
        doc! { "shards": shards, "ok": 1.0 }
    }

    /// `{labShardingState: 1}` (lab-only): primary shards and every sharded collection's key and
    /// chunks with their owners.
    pub(crate) fn state_document(&self) -> Document {
        let catalog = lock(&self.catalog);
        let primaries: Document = catalog
            .primaries
            .iter()
            .map(|(db, p)| (db.clone(), Bson::String(shard_name(*p))))
            .collect();
        let collections: Vec<Bson> = catalog
            .collections
            .iter()
            .map(|(ns, key)| {
                Bson::Document(doc! {
                    "ns": ns.clone(),
                    "key": key.pattern(),
                    "chunks": key.chunks_document(),
                })
            })
            .collect();
        let shards: Vec<Bson> = self
            .shards
            .iter()
            .map(|s| Bson::String(s.name.clone()))
            .collect();
        doc! {
            "shards": shards,
            "primaries": primaries,
            "collections": collections,
            "ok": 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(n: usize) -> Sharding {
        Sharding::new((0..n).map(|_| Model::disabled()).collect(), 100)
    }

    #[test]
    fn equal_numbers_hash_alike_and_values_spread() {
        assert_eq!(value_hash(&Bson::Int32(7)), value_hash(&Bson::Int64(7)));
        assert_eq!(value_hash(&Bson::Int32(7)), value_hash(&Bson::Double(7.0)));
        assert_ne!(value_hash(&Bson::Int32(7)), value_hash(&Bson::Int32(8)));
        let mut per_range = [0usize; 4];
        for i in 0..400i64 {
            per_range[hash_range(&Bson::Int64(i), 4)] += 1;
        }
        assert!(per_range.iter().all(|c| *c > 50), "{per_range:?}");
    }

    #[test]
    fn ranged_chunks_split_and_move() {
        let s = layer(2);
        s.shard_collection(&doc! { "shardCollection": "d.c", "key": { "x": 1 } })
            .unwrap();
        assert_eq!(s.owner_of_document("d", "c", &doc! { "x": 5 }), 0);
        s.split(&doc! { "split": "d.c", "middle": { "x": 0 } })
            .unwrap();
        s.move_chunk(&doc! { "moveChunk": "d.c", "find": { "x": 3 }, "to": "shard1" })
            .unwrap();
        assert_eq!(s.owner_of_document("d", "c", &doc! { "x": -1 }), 0);
        assert_eq!(s.owner_of_document("d", "c", &doc! { "x": 0 }), 1);
        assert_eq!(s.owner_of_document("d", "c", &doc! { "x": 1.5 }), 1);
        let f = doc! { "x": { "$gte": 1, "$lt": 9 } };
        assert_eq!(s.targets_for_filter("d", "c", Some(&f), true), vec![1]);
        let f = doc! { "x": { "$lt": 9 } };
        assert_eq!(s.targets_for_filter("d", "c", Some(&f), true), vec![0, 1]);
        let f = doc! { "$and": [ { "x": { "$gt": -5 } }, { "x": -3 } ] };
        assert_eq!(s.targets_for_filter("d", "c", Some(&f), true), vec![0]);
        let f = doc! { "x": { "$in": [-1, 1] } };
        assert_eq!(s.targets_for_filter("d", "c", Some(&f), true), vec![0, 1]);
        let f = doc! { "y": 1 };
        assert_eq!(s.targets_for_filter("d", "c", Some(&f), true), vec![0, 1]);
    }

    #[test]
    fn unsharded_collections_live_on_the_primary_shard() {
        let s = layer(3);
        assert_eq!(s.targets_for_filter("d", "c", None, true), vec![0]);
        s.enable_sharding(&doc! { "enableSharding": "d", "primaryShard": "shard2" })
            .unwrap();
        assert_eq!(s.targets_for_filter("d", "c", None, true), vec![2]);
        assert_eq!(s.owner_of_document("d", "c", &doc! { "x": 1 }), 2);
    }
}
