use super::*;
use bson::doc;

fn doc_bytes(d: &Document) -> Vec<u8> {
    let mut v = Vec::new();
    d.to_writer(&mut v).unwrap();
    v
}

/// Builds an OP_MSG with the given flags, body and kind-1 sequences.
fn build(flags: u32, body: &Document, seqs: &[(&str, Vec<Document>)], checksum: bool) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&flags.to_le_bytes());
    payload.push(0);
    payload.extend_from_slice(&doc_bytes(body));
    for (name, docs) in seqs {
        let mut seq = Vec::new();
        seq.extend_from_slice(name.as_bytes());
        seq.push(0);
        for d in docs {
            seq.extend_from_slice(&doc_bytes(d));
        }
        payload.push(1);
        payload.extend_from_slice(&((seq.len() + 4) as u32).to_le_bytes());
        payload.extend_from_slice(&seq);
    }
    if checksum {
        payload.extend_from_slice(&[1, 2, 3, 4]);
    }
    let mut out = Vec::new();
    Header {
        message_length: (HEADER_LEN + payload.len()) as i32,
        request_id: 7,
        response_to: 0,
        op_code: OP_MSG,
    }
    .write_to(&mut out);
    out.extend_from_slice(&payload);
    out
}

#[test]
fn round_trip_body() {
    let body = doc! { "ping": 1, "$db": "admin" };
    let bytes = encode_op_msg(3, 9, 0, &body).unwrap();
    let msg = decode_message(&bytes).unwrap();
    assert_eq!(msg.header.request_id, 3);
    assert_eq!(msg.header.response_to, 9);
    assert_eq!(msg.body, body);
}

#[test]
fn sequences_merge_into_body() {
    let bytes = build(
        0,
        &doc! { "insert": "c", "$db": "d" },
        &[("documents", vec![doc! {"_id": 1}, doc! {"_id": 2}])],
        false,
    );
    let msg = decode_message(&bytes).unwrap();
    assert_eq!(
        msg.body,
        doc! { "insert": "c", "$db": "d", "documents": [{"_id": 1}, {"_id": 2}] }
    );
}

#[test]
fn empty_sequence_is_an_empty_array() {
    let bytes = build(
        0,
        &doc! { "bulkWrite": 1 },
        &[("ops", vec![]), ("nsInfo", vec![doc! {"ns": "a.b"}])],
        false,
    );
    let msg = decode_message(&bytes).unwrap();
    assert_eq!(
        msg.body,
        doc! { "bulkWrite": 1, "ops": [], "nsInfo": [{"ns": "a.b"}] }
    );
}

#[test]
fn checksum_is_stripped() {
    let bytes = build(FLAG_CHECKSUM_PRESENT, &doc! { "ping": 1 }, &[], true);
    let msg = decode_message(&bytes).unwrap();
    assert_eq!(msg.body, doc! { "ping": 1 });
}

#[test]
fn exhaust_flag_is_reported() {
    let bytes = build(FLAG_EXHAUST_ALLOWED, &doc! { "hello": 1 }, &[], false);
    assert!(decode_message(&bytes).unwrap().exhaust_allowed());
}

#[test]
fn malformed_inputs_are_errors() {
    let good = build(
        0,
        &doc! { "ping": 1 },
        &[("documents", vec![doc! {"a": 1}])],
        false,
    );
    // Every truncation of a valid message fails cleanly.
    for cut in 0..good.len() {
        let mut b = good[..cut].to_vec();
        if b.len() >= 4 {
            b[..4].copy_from_slice(&(cut as i32).to_le_bytes());
        }
        // Cutting exactly after the body section leaves a valid, shorter message.
        let boundary = HEADER_LEN + 5 + doc_bytes(&doc! { "ping": 1 }).len();
        assert_eq!(decode_message(&b).is_ok(), cut == boundary, "cut at {cut}");
    }
    // Flipping any single byte never panics.
    for i in 0..good.len() {
        for v in [0u8, 0xff, 0x7f, 0x05] {
            let mut b = good.clone();
            b[i] = v;
            let _ = decode_message(&b);
        }
    }
    // Length out of bounds.
    let mut big = good.clone();
    big[..4].copy_from_slice(&(MAX_MESSAGE_SIZE_BYTES + 1).to_le_bytes());
    assert!(matches!(decode_message(&big), Err(WireError::BadLength(_))));
    let mut neg = good.clone();
    neg[..4].copy_from_slice(&(-5i32).to_le_bytes());
    assert!(matches!(decode_message(&neg), Err(WireError::BadLength(_))));
    // An OP_MSG reader refuses other opcodes; the request reader knows OP_QUERY's layout, and
    // these OP_MSG bytes are not a valid OP_QUERY (no NUL-terminated namespace where one goes).
    let mut q = good.clone();
    q[12..16].copy_from_slice(&OP_QUERY.to_le_bytes());
    assert!(matches!(
        decode_message(&q),
        Err(WireError::UnsupportedOpcode(OP_QUERY))
    ));
    assert!(decode_request(&q).is_err());
    let mut compressed = good.clone();
    compressed[12..16].copy_from_slice(&OP_COMPRESSED.to_le_bytes());
    assert!(matches!(
        decode_request(&compressed),
        Err(WireError::UnsupportedOpcode(OP_COMPRESSED))
    ));
    // Unknown required flag bit.
    let bad_flag = build(1 << 3, &doc! { "ping": 1 }, &[], false);
    assert!(decode_message(&bad_flag).is_err());
    // No body section.
    let mut only_seq = Vec::new();
    let payload = [0u8, 0, 0, 0];
    Header {
        message_length: 20,
        request_id: 1,
        response_to: 0,
        op_code: OP_MSG,
    }
    .write_to(&mut only_seq);
    only_seq.extend_from_slice(&payload);
    assert!(decode_message(&only_seq).is_err());
    // Duplicate field in body and sequence.
    let dup = build(
        0,
        &doc! { "insert": "c", "documents": [] },
        &[("documents", vec![])],
        false,
    );
    assert!(decode_message(&dup).is_err());
    // Invalid BSON: a string element whose length runs past the document.
    let mut bad = doc_bytes(&doc! { "ping": "x" });
    bad[10] = 0x7f;
    let mut msg = Vec::new();
    Header {
        message_length: (HEADER_LEN + 5 + bad.len()) as i32,
        request_id: 1,
        response_to: 0,
        op_code: OP_MSG,
    }
    .write_to(&mut msg);
    msg.extend_from_slice(&[0, 0, 0, 0, 0]);
    msg.extend_from_slice(&bad);
    assert!(matches!(
        decode_message(&msg),
        Err(WireError::InvalidBson(_))
    ));
}

#[tokio::test]
async fn read_message_from_stream() {
    let a = build(0, &doc! { "ping": 1 }, &[], false);
    let b = build(0, &doc! { "hello": 1 }, &[], false);
    let mut all = a.clone();
    all.extend_from_slice(&b);
    let mut r = &all[..];
    assert_eq!(
        read_message(&mut r).await.unwrap().unwrap().body,
        doc! {"ping": 1}
    );
    assert_eq!(
        read_message(&mut r).await.unwrap().unwrap().body,
        doc! {"hello": 1}
    );
    assert!(read_message(&mut r).await.unwrap().is_none());
    let mut t = &a[..a.len() - 1];
    assert!(matches!(
        read_message(&mut t).await,
        Err(WireError::Truncated(_))
    ));
    let mut h = &a[..5];
    assert!(matches!(
        read_message(&mut h).await,
        Err(WireError::Truncated(_))
    ));
}

#[test]
fn deep_nesting_is_rejected_without_recursing_deeply() {
    // 100,000 nested documents: {a: {a: {a: ...}}}, built as raw bytes.
    let levels = 100_000usize;
    let mut inner: Vec<u8> = vec![5, 0, 0, 0, 0];
    for _ in 0..levels {
        let mut d = Vec::with_capacity(inner.len() + 8);
        let len = (4 + 1 + 2 + inner.len() + 1) as i32;
        d.extend_from_slice(&len.to_le_bytes());
        d.push(0x03);
        d.extend_from_slice(b"a\0");
        d.extend_from_slice(&inner);
        d.push(0);
        inner = d;
    }
    let mut msg = Vec::new();
    Header {
        message_length: (HEADER_LEN + 5 + inner.len()) as i32,
        request_id: 1,
        response_to: 0,
        op_code: OP_MSG,
    }
    .write_to(&mut msg);
    msg.extend_from_slice(&[0, 0, 0, 0, 0]);
    msg.extend_from_slice(&inner);
    assert!(matches!(
        decode_message(&msg),
        Err(WireError::InvalidBson(_))
    ));
    // 50 levels are fine.
    let mut d = doc! { "x": 1 };
    for _ in 0..50 {
        d = doc! { "a": d };
    }
    let ok = encode_op_msg(1, 0, 0, &d).unwrap();
    assert!(decode_message(&ok).is_ok());
}

#[test]
fn op_query_round_trip_and_command_unwrapping() {
    let hello =
        doc! { "isMaster": 1, "helloOk": true, "client": { "driver": { "name": "nodejs" } } };
    let bytes = encode_op_query(11, "admin.$cmd", -1, &hello).unwrap();
    let Request::Query(q) = decode_request(&bytes).unwrap() else {
        panic!("an OP_QUERY decodes as one");
    };
    assert_eq!(q.header.request_id, 11);
    assert_eq!(q.header.op_code, OP_QUERY);
    assert_eq!(q.full_collection_name, "admin.$cmd");
    assert_eq!(q.number_to_return, -1);
    assert_eq!(q.command_database(), Some("admin"));
    assert_eq!(q.command(), hello);
    assert_eq!(q.return_fields_selector, None);
    // The `$query` wrapper drivers use with `$readPreference`.
    let wrapped = doc! { "$query": { "ismaster": 1 }, "$readPreference": { "mode": "primary" } };
    let Request::Query(w) =
        decode_request(&encode_op_query(1, "app.$cmd", 1, &wrapped).unwrap()).unwrap()
    else {
        panic!("an OP_QUERY decodes as one");
    };
    assert_eq!(w.command(), doc! { "ismaster": 1 });
    assert_eq!(w.command_database(), Some("app"));
    // A collection namespace is not a command namespace; neither is a bare `.$cmd`.
    let find = encode_op_query(1, "app.coll", 0, &doc! { "x": 1 }).unwrap();
    let Request::Query(f) = decode_request(&find).unwrap() else {
        panic!("an OP_QUERY decodes as one");
    };
    assert_eq!(f.command_database(), None);
    let bare = encode_op_query(1, ".$cmd", 0, &doc! { "x": 1 }).unwrap();
    let Request::Query(b) = decode_request(&bare).unwrap() else {
        panic!("an OP_QUERY decodes as one");
    };
    assert_eq!(b.command_database(), None);
}

#[test]
fn op_query_with_field_selector_and_trailing_bytes() {
    let mut bytes = encode_op_query(1, "admin.$cmd", -1, &doc! { "hello": 1 }).unwrap();
    bytes.extend_from_slice(&doc_bytes(&doc! { "a": 1 }));
    let len = bytes.len() as i32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    let Request::Query(q) = decode_request(&bytes).unwrap() else {
        panic!("an OP_QUERY decodes as one");
    };
    assert_eq!(q.return_fields_selector, Some(doc! { "a": 1 }));
    // Anything after the selector is malformed.
    bytes.extend_from_slice(&[1, 2, 3]);
    let len = bytes.len() as i32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        decode_request(&bytes),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn truncated_op_query_is_an_error_at_every_cut() {
    let full = encode_op_query(1, "admin.$cmd", -1, &doc! { "hello": 1, "x": "abc" }).unwrap();
    for cut in HEADER_LEN..full.len() {
        let mut b = full[..cut].to_vec();
        b[..4].copy_from_slice(&(cut as i32).to_le_bytes());
        assert!(decode_request(&b).is_err(), "cut at {cut}");
    }
    assert!(decode_request(&full).is_ok());
}

#[test]
fn removed_legacy_opcodes_are_recognised_unparsed() {
    for op in [
        OP_UPDATE,
        OP_INSERT,
        OP_GET_MORE,
        OP_DELETE,
        OP_KILL_CURSORS,
    ] {
        let mut b = Vec::new();
        Header {
            message_length: (HEADER_LEN + 7) as i32,
            request_id: 5,
            response_to: 0,
            op_code: op,
        }
        .write_to(&mut b);
        b.extend_from_slice(&[9; 7]);
        assert!(matches!(decode_request(&b), Ok(Request::Legacy(h)) if h.op_code == op));
    }
}

#[test]
fn op_reply_round_trip() {
    let docs = [doc! { "ok": 1.0, "ismaster": true }];
    let bytes = encode_op_reply(4, 11, 0, &docs).unwrap();
    let reply = decode_reply(&bytes).unwrap();
    assert_eq!(reply.header.response_to, 11);
    assert_eq!(reply.header.op_code, OP_REPLY);
    assert_eq!(reply.flags, REPLY_AWAIT_CAPABLE);
    assert_eq!(reply.cursor_id, 0);
    assert_eq!(reply.documents, docs);
    // A count that disagrees with the documents is malformed.
    let mut wrong = bytes.clone();
    wrong[HEADER_LEN + 16..HEADER_LEN + 20].copy_from_slice(&2i32.to_le_bytes());
    assert!(matches!(decode_reply(&wrong), Err(WireError::Malformed(_))));
    // An OP_MSG is not a reply to an OP_QUERY.
    let msg = encode_op_msg(1, 0, 0, &doc! { "ok": 1 }).unwrap();
    assert!(matches!(
        decode_reply(&msg),
        Err(WireError::UnsupportedOpcode(OP_MSG))
    ));
}
