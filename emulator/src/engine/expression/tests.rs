//! Tests of expression evaluation, through [`evaluate`] and [`with_variables`].

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
    let remove = doc! { "$setField": { "field": "a.b", "value": "$$REMOVE", "input": "$$ROOT" } };
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

#[test]
fn every_routed_operator_is_evaluated_by_its_family() {
    // The router in mod.rs and each family's dispatch both name the operators; a name routed
    // to a family that does not know it would fail like an unknown operator (168). Grouped as
    // the router groups them.
    const FAMILIES: &[&str] = &[
        "$add $multiply $subtract $divide $mod $abs $floor $ceil $trunc $round $sqrt $exp",
        "$ln $log10 $pow",
        "$eq $ne $gt $gte $lt $lte $cmp $and $or $not",
        "$cond $ifNull $switch",
        "$concat $toUpper $toLower $strLenCP $toString $split $substrCP $substr",
        "$substrBytes $strcasecmp $regexMatch $trim $ltrim $rtrim",
        "$size $arrayElemAt $first $last $in $concatArrays $isArray $reverseArray $slice",
        "$range $indexOfArray $map $filter $reduce",
        "$setUnion",
        "$year $month $dayOfMonth $hour $minute $second $millisecond $dayOfWeek",
        "$dayOfYear $dateToString",
        "$type $toInt $toLong $toDouble $toBool",
        "$getField $setField $unsetField $mergeObjects $objectToArray $arrayToObject",
        "$sum $avg $min $max $stdDevPop $stdDevSamp",
        "$let $literal $rand",
    ];
    for op in FAMILIES.iter().flat_map(|family| family.split_whitespace()) {
        for arg in [Bson::Array(Vec::new()), Bson::Document(Document::new())] {
            let mut expr = Document::new();
            expr.insert(op, arg);
            if let Err(e) = evaluate(&Bson::Document(expr), &doc! {}) {
                assert_ne!(
                    e.code, 168,
                    "{op} was routed to a family that does not know it"
                );
            }
        }
    }
    let mut unknown = Document::new();
    unknown.insert("$notAnOperator", Bson::Array(Vec::new()));
    let err = evaluate(&Bson::Document(unknown), &doc! {}).expect_err("unknown operator");
    assert_eq!(err.code, 168);
}
