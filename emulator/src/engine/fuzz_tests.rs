//! Randomized no-panic tests: random BSON thrown at matching, updates, projections and
//! pipelines must produce results or errors, never panics. Seeds are fixed so failures
//! reproduce.

use bson::{doc, oid::ObjectId, Binary, Bson, Document, Regex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const FIELDS: &[&str] = &[
    "a", "b", "_id", "a.b", "a.0", "a.$", "a.$[]", "a.$[x]", "x", "", "a..b", "0", "$bad", "b.c.d",
];

const QUERY_OPS: &[&str] = &[
    "$eq",
    "$ne",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$exists",
    "$type",
    "$not",
    "$regex",
    "$options",
    "$elemMatch",
    "$size",
    "$all",
    "$mod",
    "$foo",
    "$and",
    "$or",
    "$nor",
    "$expr",
    "$comment",
];

/// Every update operator the engine knows, plus array-update modifiers and an unknown name.
fn update_ops() -> Vec<&'static str> {
    let modifiers = ["$each", "$slice", "$sort", "$position", "$nope"];
    update::OPERATORS.iter().copied().chain(modifiers).collect()
}

const EXPR_OPS: &[&str] = &[
    "$switch",
    "$reduce",
    "$regexMatch",
    "$trim",
    "$pow",
    "$ln",
    "$year",
    "$dayOfWeek",
    "$dateToString",
    "$floor",
    "$round",
    "$toInt",
    "$toLong",
    "$slice",
    "$range",
    "$split",
    "$substrCP",
    "$indexOfArray",
    "$objectToArray",
    "$arrayToObject",
    "$setUnion",
    "$getField",
    "$setField",
    "$unsetField",
    "$rand",
    "$reverseArray",
    "$add",
    "$subtract",
    "$multiply",
    "$divide",
    "$mod",
    "$abs",
    "$concat",
    "$toUpper",
    "$toLower",
    "$eq",
    "$gt",
    "$and",
    "$or",
    "$not",
    "$cond",
    "$ifNull",
    "$size",
    "$arrayElemAt",
    "$literal",
    "$in",
    "$map",
    "$filter",
    "$let",
    "$sum",
    "$first",
    "$mergeObjects",
    "$type",
    "$toString",
];

const STAGES: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$group",
    "$sort",
    "$skip",
    "$limit",
    "$count",
    "$unwind",
    "$replaceRoot",
    "$replaceWith",
    "$sortByCount",
    "$lookup",
    "$facet",
    "$sample",
    "$documents",
    "$out",
    "$merge",
    "$bucket",
    "$bogus",
];

/// Iteration count: the default keeps the suite fast; `ENGINE_FUZZ_SCALE=<n>` multiplies it
/// for longer local runs, and `ENGINE_FUZZ_SEED=<n>` varies the seeds.
fn iterations(default: usize) -> usize {
    let scale = std::env::var("ENGINE_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1);
    default.saturating_mul(scale.max(1))
}

fn rng_for(base: u64) -> StdRng {
    let extra = std::env::var("ENGINE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    StdRng::seed_from_u64(base ^ extra)
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

fn scalar(rng: &mut StdRng) -> Bson {
    match rng.random_range(0..16) {
        0 => Bson::Null,
        1 => Bson::Int32(rng.random_range(-3..4)),
        2 => Bson::Int64(if rng.random_bool(0.1) {
            i64::MAX
        } else {
            rng.random_range(-3..4)
        }),
        3 => Bson::Double(match rng.random_range(0..4) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -0.0,
            _ => rng.random_range(-3.0..3.0),
        }),
        4 => {
            Bson::String(pick(rng, &["", "a", "$a", "$$ROOT", "$a.b", "^a", "(", "abc"]).to_owned())
        }
        5 => Bson::Boolean(rng.random()),
        6 => Bson::ObjectId(ObjectId::new()),
        7 => Bson::RegularExpression(Regex {
            pattern: pick(rng, &["a", "^$", "[", ".*"]).to_owned(),
            options: "i".into(),
        }),
        8 => Bson::MinKey,
        9 => Bson::MaxKey,
        10 => Bson::Int32(i32::MAX),
        11 => Bson::Binary(Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![1, 2],
        }),
        12 => Bson::DateTime(bson::DateTime::from_millis(rng.random_range(-5..5))),
        13 => Bson::Undefined,
        14 => Bson::Int32(1),
        _ => Bson::String(pick(rng, &["string", "number", "array", "int", "x"]).to_owned()),
    }
}

/// A random value; `ops` are the operator names that may appear as keys.
fn value(rng: &mut StdRng, depth: u32, ops: &[&str]) -> Bson {
    if depth == 0 {
        return scalar(rng);
    }
    match rng.random_range(0..6) {
        0 | 1 => scalar(rng),
        2 => Bson::Array(
            (0..rng.random_range(0..4))
                .map(|_| value(rng, depth - 1, ops))
                .collect(),
        ),
        3 => Bson::Document(document(rng, depth - 1, ops)),
        _ => {
            let mut d = Document::new();
            d.insert(pick(rng, ops), value(rng, depth - 1, ops));
            Bson::Document(d)
        }
    }
}

fn document(rng: &mut StdRng, depth: u32, ops: &[&str]) -> Document {
    let mut d = Document::new();
    for _ in 0..rng.random_range(0..4) {
        let key = if rng.random_bool(0.3) {
            pick(rng, ops)
        } else {
            pick(rng, FIELDS)
        };
        d.insert(key, value(rng, depth, ops));
    }
    d
}

fn stored_doc(rng: &mut StdRng) -> Document {
    let mut d = Document::new();
    d.insert("_id", rng.random_range(0..5));
    for k in ["a", "b", "x"] {
        if rng.random_bool(0.7) {
            d.insert(k, value(rng, 3, &["c", "b", "0"]));
        }
    }
    d
}

#[test]
fn matching_random_filters_never_panics() {
    let mut rng = rng_for(0x5eed_0001);
    for _ in 0..iterations(4000) {
        let filter = document(&mut rng, 3, QUERY_OPS);
        let doc = stored_doc(&mut rng);
        let _ = matches(&filter, &doc);
    }
}

#[test]
fn updates_with_random_operators_never_panic() {
    let mut rng = rng_for(0x5eed_0002);
    let update_ops = update_ops();
    for _ in 0..iterations(4000) {
        let mut doc = stored_doc(&mut rng);
        let update = if rng.random_bool(0.8) {
            let mut u = Document::new();
            for _ in 0..rng.random_range(1..3) {
                u.insert(pick(&mut rng, &update_ops), value(&mut rng, 3, &update_ops));
            }
            UpdateModification::Document(u)
        } else {
            UpdateModification::Pipeline(
                (0..rng.random_range(0..3))
                    .map(|_| {
                        let mut s = Document::new();
                        s.insert(pick(&mut rng, STAGES), value(&mut rng, 2, EXPR_OPS));
                        s
                    })
                    .collect(),
            )
        };
        let filters = [document(&mut rng, 2, QUERY_OPS)];
        let query = document(&mut rng, 2, QUERY_OPS);
        let ctx = UpdateContext {
            is_insert: rng.random(),
            array_filters: &filters,
            query: Some(&query),
        };
        let _ = apply_update(&mut doc, &update, &ctx);
    }
}

#[test]
fn random_pipelines_and_finds_never_panic() {
    let mut rng = rng_for(0x5eed_0003);
    let update_ops = update_ops();
    for round in 0..iterations(600) {
        let mut store = Store::new();
        let docs: Vec<Document> = (0..rng.random_range(0..6))
            .map(|_| stored_doc(&mut rng))
            .collect();
        store.insert("db", "c", docs, false);
        let pipeline: Vec<Document> = (0..rng.random_range(1..4))
            .map(|_| {
                let mut s = Document::new();
                let ops: &[&str] = if rng.random_bool(0.5) {
                    EXPR_OPS
                } else {
                    QUERY_OPS
                };
                s.insert(pick(&mut rng, STAGES), value(&mut rng, 3, ops));
                s
            })
            .collect();
        let _ = store.aggregate("db", "c", &pipeline);
        let spec = FindSpec {
            filter: document(&mut rng, 2, QUERY_OPS),
            sort: Some(document(&mut rng, 1, &["$meta"])),
            projection: Some(document(
                &mut rng,
                2,
                &["$slice", "$elemMatch", "$add", "$literal"],
            )),
            skip: rng.random_range(0..3),
            limit: Some(rng.random_range(-3..3)),
        };
        let _ = store.find("db", "c", &spec);
        let stmt = UpdateStatement {
            filter: document(&mut rng, 2, QUERY_OPS),
            update: UpdateModification::Document(document(&mut rng, 2, &update_ops)),
            upsert: rng.random(),
            multi: rng.random(),
            array_filters: vec![],
            sort: None,
        };
        let _ = store.update("db", "c", &[stmt], round % 2 == 0);
        let _ = store.distinct("db", "c", pick(&mut rng, FIELDS), &Document::new());
        let fam = FindAndModifySpec {
            query: document(&mut rng, 2, QUERY_OPS),
            sort: Some(document(&mut rng, 1, &["$natural"])),
            remove: rng.random_bool(0.3),
            update: rng
                .random_bool(0.7)
                .then(|| UpdateModification::Document(document(&mut rng, 2, &update_ops))),
            return_new: rng.random(),
            upsert: rng.random(),
            fields: Some(document(&mut rng, 1, &["$slice", "$elemMatch"])),
            array_filters: vec![],
        };
        let _ = store.find_and_modify("db", "c", &fam);
        let vars = document(&mut rng, 1, EXPR_OPS);
        let filter = document(&mut rng, 2, QUERY_OPS);
        let _ = with_variables(&vars, || store.count("db", "c", &filter, 0, 0));
        let _ = store.delete(
            "db",
            "c",
            &[DeleteStatement {
                filter: document(&mut rng, 2, QUERY_OPS),
                just_one: rng.random(),
            }],
            true,
        );
        let _ = evaluate(&value(&mut rng, 3, EXPR_OPS), &stored_doc(&mut rng));
    }
}

/// Keys of collation, `collMod` and view options, mixed with junk, for the test below.
const OPTION_KEYS: &[&str] = &[
    "locale",
    "strength",
    "caseLevel",
    "caseFirst",
    "numericOrdering",
    "alternate",
    "backwards",
    "validator",
    "validationLevel",
    "validationAction",
    "index",
    "keyPattern",
    "name",
    "prepareUnique",
    "unique",
    "hidden",
    "viewOn",
    "pipeline",
    "clusteredIndex",
    "timeseries",
    "timeField",
    "bogus",
];

#[test]
fn collations_views_and_coll_mod_never_panic() {
    let mut rng = rng_for(0x5eed_0005);
    for _ in 0..iterations(400) {
        let mut store = Store::new();
        let docs: Vec<Document> = (0..rng.random_range(0..6))
            .map(|_| stored_doc(&mut rng))
            .collect();
        store.insert("db", "c", docs, false);
        let _ = store.create_indexes("db", "c", &[doc! {"key": {"a": 1}, "name": "a_1"}]);
        // Random collations, applied to a find and a distinct when they parse.
        let mut spec = document(&mut rng, 1, OPTION_KEYS);
        if rng.random_bool(0.7) {
            spec.insert("locale", pick(&mut rng, &["en", "simple", "", "fr_CA"]));
        }
        if let Ok(Some(collation)) = Collation::parse(&spec) {
            let filter = document(&mut rng, 2, QUERY_OPS);
            let find = FindSpec {
                filter,
                sort: Some(doc! {"a": 1}),
                ..Default::default()
            };
            let _ = with_collation(Some(&collation), || store.find("db", "c", &find));
            let _ = with_collation(Some(&collation), || {
                store.distinct("db", "c", pick(&mut rng, FIELDS), &Document::new())
            });
            let a = scalar(&mut rng);
            let b = scalar(&mut rng);
            let _ = with_collation(Some(&collation), || compare_bson(&a, &b));
        }
        // Random collMod specs, then writes that meet whatever they set.
        let _ = store.modify_collection("db", "c", &document(&mut rng, 2, OPTION_KEYS));
        let _ = store.insert("db", "c", vec![stored_doc(&mut rng)], true);
        // Random views (possibly chained or cyclic) and reads through them.
        for name in ["v1", "v2"] {
            let mut options = document(&mut rng, 1, OPTION_KEYS);
            if rng.random_bool(0.8) {
                options.insert("viewOn", pick(&mut rng, &["c", "v1", "v2", ""]));
            }
            let _ = store.create_collection("db", name, &options);
        }
        if let Ok(Some(view)) = store.resolve_view("db", "v2") {
            let _ = store.aggregate("db", &view.source, &view.pipeline);
        }
        let _ = store.list_collections("db", None, false);
    }
}

#[test]
fn deeply_nested_input_is_rejected_not_overflowing() {
    let mut filter = Document::new();
    filter.insert("a", 1);
    for _ in 0..300 {
        let mut outer = Document::new();
        outer.insert("$and", vec![Bson::Document(filter)]);
        filter = outer;
    }
    assert_eq!(
        matches(&filter, &Document::new()).map_err(|e| e.code),
        Err(15)
    );
    let long_path = vec!["a"; 100_000].join(".");
    let mut f = Document::new();
    f.insert(long_path.clone(), 1);
    assert_eq!(matches(&f, &Document::new()), Ok(false));
    let mut set = Document::new();
    set.insert(long_path.clone(), 1);
    let mut u = Document::new();
    u.insert("$set", set);
    let mut doc = Document::new();
    assert!(apply_update(
        &mut doc,
        &UpdateModification::Document(u),
        &UpdateContext::default()
    )
    .is_err());
    let mut proj = Document::new();
    proj.insert(long_path, 1);
    let store = Store::new();
    let spec = FindSpec {
        projection: Some(proj),
        ..Default::default()
    };
    assert!(store.find("db", "c", &spec).is_err());
}
