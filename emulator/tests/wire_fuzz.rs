//! Seeded fuzzing of the wire-protocol frame decoder: random bytes and mutated valid frames
//! (bit flips, byte overwrites, truncation, extension, corrupted length fields, splices) must
//! give a `WireError` or a message, never a panic, both through `decode_message` and through
//! the streaming `read_message`. Legacy OP_QUERY frames (the opening handshake) get the same
//! treatment through `decode_request` and `read_request`. A live emulator fed mutated frames
//! keeps serving.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use bson::{doc, Bson, Document};
use emulator::wire::{
    self, Header, FLAG_CHECKSUM_PRESENT, FLAG_EXHAUST_ALLOWED, HEADER_LEN, OP_MSG,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0x005e_ed0f_f1a5;

fn random_value(rng: &mut StdRng, depth: usize) -> Bson {
    match rng.random_range(0..9) {
        0 => Bson::Int32(rng.random()),
        1 => Bson::Int64(rng.random()),
        2 => Bson::Double(rng.random::<f64>() * 1e6),
        3 => Bson::Boolean(rng.random()),
        4 => Bson::Null,
        5 => Bson::String("s".repeat(rng.random_range(0..40))),
        6 if depth < 3 => Bson::Document(random_doc(rng, depth + 1)),
        7 if depth < 3 => Bson::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: (0..rng.random_range(0..16)).map(|_| rng.random()).collect(),
        }),
    }
}

fn random_doc(rng: &mut StdRng, depth: usize) -> Document {
    let mut d = Document::new();
    for i in 0..rng.random_range(0..5) {
        d.insert(format!("f{i}"), random_value(rng, depth));
    }
    d
}

fn doc_bytes(d: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    d.to_writer(&mut out).unwrap();
    out
}

/// A valid OP_MSG: a body section, optional kind-1 sequences, optional checksum bytes.
fn valid_frame(rng: &mut StdRng) -> (Vec<u8>, Document) {
    let mut body = doc! { "insert": "c", "$db": "db" };
    body.extend(random_doc(rng, 0));
    let mut flags = 0u32;
    if rng.random_bool(0.2) {
        flags |= FLAG_EXHAUST_ALLOWED;
    }
    let checksum = rng.random_bool(0.2);
    if checksum {
        flags |= FLAG_CHECKSUM_PRESENT;
    }
    let mut payload = flags.to_le_bytes().to_vec();
    payload.push(0);
    payload.extend(doc_bytes(&body));
    let mut expected = body.clone();
    for s in 0..rng.random_range(0..3) {
        let ident = format!("seq{s}");
        let docs: Vec<Document> = (0..rng.random_range(0..4))
            .map(|_| random_doc(rng, 1))
            .collect();
        let mut section = Vec::new();
        section.extend_from_slice(ident.as_bytes());
        section.push(0);
        for d in &docs {
            section.extend(doc_bytes(d));
        }
        payload.push(1);
        payload.extend(((section.len() + 4) as i32).to_le_bytes());
        payload.extend(section);
        expected.insert(
            ident,
            docs.into_iter().map(Bson::Document).collect::<Vec<_>>(),
        );
    }
    if checksum {
        payload.extend(rng.random::<u32>().to_le_bytes());
    }
    let mut frame = Vec::new();
    Header {
        message_length: (HEADER_LEN + payload.len()) as i32,
        request_id: rng.random(),
        response_to: 0,
        op_code: OP_MSG,
    }
    .write_to(&mut frame);
    frame.extend(payload);
    (frame, expected)
}

fn put_i32(bytes: &mut [u8], at: usize, v: i32) {
    if at + 4 <= bytes.len() {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

fn interesting_i32(rng: &mut StdRng, actual: usize) -> i32 {
    let a = actual as i32;
    *[
        0,
        -1,
        i32::MIN,
        i32::MAX,
        4,
        5,
        15,
        16,
        17,
        a - 1,
        a + 1,
        a * 2,
        48_000_000,
        48_000_001,
        16 * 1024 * 1024 + 1,
        rng.random(),
    ]
    .get(rng.random_range(0..16))
    .unwrap()
}

/// One to three random mutations of `frame`.
fn mutate(rng: &mut StdRng, mut frame: Vec<u8>, other: &[u8]) -> Vec<u8> {
    for _ in 0..rng.random_range(1..=3) {
        let len = frame.len();
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                frame[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                frame[i] = rng.random();
            }
            2 => frame.truncate(rng.random_range(0..=len)),
            3 => frame.extend((0..rng.random_range(1..32)).map(|_| rng.random::<u8>())),
            // messageLength.
            4 => {
                let v = interesting_i32(rng, len);
                put_i32(&mut frame, 0, v);
            }
            // The body document's length (after header, flags and the kind byte).
            5 => {
                let v = interesting_i32(rng, len.saturating_sub(HEADER_LEN + 5));
                put_i32(&mut frame, HEADER_LEN + 5, v);
            }
            // Any 4-byte window, e.g. a sequence size or a nested document length.
            6 if len >= 4 => {
                let at = rng.random_range(0..=len - 4);
                let v = interesting_i32(rng, len - at);
                put_i32(&mut frame, at, v);
            }
            _ if len > 0 && !other.is_empty() => {
                let at = rng.random_range(0..len);
                let from = rng.random_range(0..other.len());
                let n = rng.random_range(0..=(other.len() - from).min(64));
                frame.splice(at..at, other[from..from + n].iter().copied());
            }
            _ => {}
        }
    }
    frame
}

fn decode_without_panic(bytes: &[u8]) -> Result<wire::OpMsg, String> {
    match catch_unwind(AssertUnwindSafe(|| wire::decode_message(bytes))) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => panic!(
            "decode_message panicked on {} bytes: {bytes:02x?}",
            bytes.len()
        ),
    }
}

#[test]
fn valid_frames_round_trip() {
    let mut rng = StdRng::seed_from_u64(SEED);
    for _ in 0..1_000 {
        let (frame, expected) = valid_frame(&mut rng);
        let msg = decode_without_panic(&frame).expect("a valid frame decodes");
        assert_eq!(msg.body, expected);
        assert_eq!(msg.header.message_length as usize, frame.len());
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 1);
    let mut decoded = 0;
    for i in 0..20_000 {
        let len = rng.random_range(0..200);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        // Half of the inputs get a consistent header so the body parser is reached.
        if i % 2 == 0 && len >= HEADER_LEN {
            put_i32(&mut bytes, 0, len as i32);
            put_i32(&mut bytes, 12, OP_MSG);
        }
        if decode_without_panic(&bytes).is_ok() {
            decoded += 1;
        }
    }
    // Random bytes almost never form a valid OP_MSG.
    assert!(decoded < 100, "{decoded} random inputs decoded");
}

#[test]
fn mutated_frames_never_panic() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 2);
    let (mut errors, mut decoded) = (0, 0);
    let (mut previous, _) = valid_frame(&mut rng);
    for _ in 0..20_000 {
        let (frame, _) = valid_frame(&mut rng);
        let bad = mutate(&mut rng, frame.clone(), &previous);
        match decode_without_panic(&bad) {
            Ok(msg) => {
                decoded += 1;
                // Whatever decodes re-encodes.
                wire::encode_op_msg(1, 0, 0, &msg.body).expect("decoded body re-encodes");
            }
            Err(_) => errors += 1,
        }
        previous = frame;
    }
    assert!(
        errors > 10_000,
        "mutations should mostly be rejected: {errors}"
    );
    assert!(
        decoded > 0,
        "some mutations (e.g. in string bytes) stay valid"
    );
}

#[test]
fn length_field_corruption_is_rejected() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 3);
    for _ in 0..2_000 {
        let (frame, _) = valid_frame(&mut rng);
        let len = frame.len() as i32;
        for bad in [0, -1, i32::MIN, 15, len - 1, len + 1, 48_000_001] {
            let mut f = frame.clone();
            put_i32(&mut f, 0, bad);
            assert!(
                decode_without_panic(&f).is_err(),
                "messageLength {bad} of {len}"
            );
        }
        // Truncation anywhere is an error.
        let cut = rng.random_range(0..frame.len());
        assert!(decode_without_panic(&frame[..cut]).is_err(), "cut at {cut}");
    }
}

/// A few frames back to back from `frame`, about half of them mutated: returns the bytes and
/// how many frames went in. `previous` is the last unmutated frame, which mutations splice from.
fn mixed_stream(
    rng: &mut StdRng,
    previous: &mut Vec<u8>,
    frame: impl Fn(&mut StdRng) -> (Vec<u8>, Document),
) -> (Vec<u8>, usize) {
    let mut stream = Vec::new();
    let mut frames = 0;
    for _ in 0..rng.random_range(1..4) {
        let (valid, _) = frame(rng);
        let f = if rng.random_bool(0.5) {
            mutate(rng, valid.clone(), previous)
        } else {
            valid.clone()
        };
        stream.extend(f);
        *previous = valid;
        frames += 1;
    }
    (stream, frames)
}

#[tokio::test]
async fn streaming_reader_never_panics() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 4);
    let (mut previous, _) = valid_frame(&mut rng);
    for _ in 0..3_000 {
        // The reader yields messages until the first error or the end, and never panics or
        // hangs.
        let (stream, frames) = mixed_stream(&mut rng, &mut previous, valid_frame);
        let mut reader: &[u8] = &stream;
        let mut read = 0;
        while let Ok(Some(_)) = wire::read_message(&mut reader).await {
            read += 1;
            assert!(read <= frames + 8, "more messages than bytes allow");
        }
    }
}

/// A valid OP_QUERY: a handshake or another command on a `$cmd` namespace, or a legacy find.
fn valid_op_query(rng: &mut StdRng) -> (Vec<u8>, Document) {
    let mut query = match rng.random_range(0..3) {
        0 => doc! { "isMaster": 1, "helloOk": true },
        1 => doc! { "hello": 1 },
        _ => doc! { "find": "c" },
    };
    query.extend(random_doc(rng, 0));
    if rng.random_bool(0.3) {
        query = doc! { "$query": query, "$readPreference": { "mode": "primary" } };
    }
    let ns = if rng.random_bool(0.8) {
        "admin.$cmd"
    } else {
        "db.coll"
    };
    let frame = wire::encode_op_query(rng.random(), ns, -1, &query).unwrap();
    (frame, query)
}

fn decode_request_without_panic(bytes: &[u8]) -> Result<wire::Request, String> {
    match catch_unwind(AssertUnwindSafe(|| wire::decode_request(bytes))) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => panic!(
            "decode_request panicked on {} bytes: {bytes:02x?}",
            bytes.len()
        ),
    }
}

#[test]
fn op_query_frames_round_trip_and_mutations_never_panic() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 6);
    let (mut previous, _) = valid_op_query(&mut rng);
    let (mut errors, mut decoded) = (0, 0);
    for _ in 0..20_000 {
        let (frame, query) = valid_op_query(&mut rng);
        match decode_request_without_panic(&frame) {
            Ok(wire::Request::Query(q)) => assert_eq!(q.query, query),
            other => panic!("a valid OP_QUERY decodes as one: {other:?}"),
        }
        let bad = mutate(&mut rng, frame.clone(), &previous);
        match decode_request_without_panic(&bad) {
            Ok(_) => decoded += 1,
            Err(_) => errors += 1,
        }
        previous = frame;
    }
    assert!(
        errors > 10_000,
        "mutations should mostly be rejected: {errors}"
    );
    assert!(decoded > 0, "some mutations stay valid");
}

#[tokio::test]
async fn streaming_request_reader_never_panics_on_mixed_frames() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 7);
    let (mut previous, _) = valid_op_query(&mut rng);
    for _ in 0..3_000 {
        let (stream, frames) = mixed_stream(&mut rng, &mut previous, |rng| {
            if rng.random_bool(0.5) {
                valid_op_query(rng)
            } else {
                valid_frame(rng)
            }
        });
        let mut reader: &[u8] = &stream;
        let mut read = 0;
        while let Ok(Some(_)) = wire::read_request(&mut reader).await {
            read += 1;
            assert!(read <= frames + 8, "more messages than bytes allow");
        }
    }
}

#[tokio::test]
async fn live_server_survives_mutated_frames() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let emu = emulator::Emulator::start(emulator::EmulatorConfig::default())
        .await
        .unwrap();
    let addr = emu.addresses()[0];
    let mut rng = StdRng::seed_from_u64(SEED ^ 5);
    let (mut previous, _) = valid_frame(&mut rng);
    for i in 0..200 {
        // A quarter are legacy OP_QUERY frames, which the server decodes too.
        let (frame, _) = if i % 4 == 0 {
            valid_op_query(&mut rng)
        } else {
            valid_frame(&mut rng)
        };
        let bad = mutate(&mut rng, frame.clone(), &previous);
        previous = frame;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&bad).await;
        let _ = s.shutdown().await;
        // The server replies (the frame stayed valid) or closes; it must not hang.
        let mut sink = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
        assert!(r.is_ok(), "server neither replied nor closed");
    }
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ping = wire::encode_op_msg(7, 0, 0, &doc! { "ping": 1, "$db": "admin" }).unwrap();
    s.write_all(&ping).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), wire::read_message(&mut s))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.body.get_f64("ok"), Ok(1.0));
    emu.shutdown().await;
}
