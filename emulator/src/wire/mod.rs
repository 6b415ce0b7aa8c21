//! MongoDB wire protocol framing: message headers, OP_MSG decoding and encoding, and the
//! legacy OP_QUERY / OP_REPLY pair of the opening handshake.
//!
//! Commands are served over OP_MSG (2013). As mongod does at every version, an OP_QUERY (2004)
//! on `<db>.$cmd` is still decoded ([`read_request`], [`Request::Query`]) because drivers
//! without `serverApi` or `loadBalanced` (the Node.js driver, mongosh) send their first
//! `hello`/`isMaster` that way; the server answers it with an OP_REPLY ([`encode_op_reply`]).
//! The other legacy opcodes are recognised ([`Request::Legacy`]) only so the server can refuse
//! them as mongod does. Every decoding failure is a [`WireError`] (never a panic), after which
//! the server closes that one connection.

use bson::Document;
use tokio::io::{AsyncRead, AsyncReadExt};

/// `maxMessageSizeBytes` advertised in hello and enforced on requests.
pub const MAX_MESSAGE_SIZE_BYTES: i32 = 48_000_000;
/// `maxBsonObjectSize` advertised in hello and enforced on every document of a request.
pub const MAX_BSON_OBJECT_SIZE: i32 = 16 * 1024 * 1024;
/// Extra room mongod allows for a command body over `maxBsonObjectSize` (16 KiB).
pub const BSON_OBJECT_SIZE_SLACK: i32 = 16 * 1024;

/// Legacy reply opcode.
pub const OP_REPLY: i32 = 1;
/// Legacy query opcode.
pub const OP_QUERY: i32 = 2004;
/// Legacy update opcode (removed from mongod; refused).
pub const OP_UPDATE: i32 = 2001;
/// Legacy insert opcode (removed from mongod; refused).
pub const OP_INSERT: i32 = 2002;
/// Legacy getMore opcode (removed from mongod; refused with an OP_REPLY error).
pub const OP_GET_MORE: i32 = 2005;
/// Legacy delete opcode (removed from mongod; refused).
pub const OP_DELETE: i32 = 2006;
/// Legacy killCursors opcode (removed from mongod; refused).
pub const OP_KILL_CURSORS: i32 = 2007;
/// OP_REPLY `responseFlags` bit: the query failed and the one document is a `$err` document.
pub const REPLY_QUERY_FAILURE: u32 = 1 << 1;
/// OP_REPLY `responseFlags` bit: the server accepts `awaitData` (mongod always sets it).
pub const REPLY_AWAIT_CAPABLE: u32 = 1 << 3;
/// Compressed message opcode.
pub const OP_COMPRESSED: i32 = 2012;
/// OP_MSG opcode.
pub const OP_MSG: i32 = 2013;

/// OP_MSG flag: a CRC-32C checksum follows the sections.
pub const FLAG_CHECKSUM_PRESENT: u32 = 1;
/// OP_MSG flag: another message follows without a request.
pub const FLAG_MORE_TO_COME: u32 = 1 << 1;
/// OP_MSG flag: the client accepts exhaust replies.
pub const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
/// Flags a client may legally set (the other required bits 2..15 must be zero).
const KNOWN_FLAGS: u32 = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME | FLAG_EXHAUST_ALLOWED;

/// Size of the standard message header.
pub const HEADER_LEN: usize = 16;

/// Why a frame could not be decoded. The connection that sent it is closed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the socket, or an I/O error occurred.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The stream ended in the middle of a message.
    #[error("truncated message: {0}")]
    Truncated(&'static str),
    /// `messageLength` is below the header size or above `maxMessageSizeBytes`.
    #[error("invalid message length {0} (allowed {min}..={max})", min = HEADER_LEN, max = MAX_MESSAGE_SIZE_BYTES)]
    BadLength(i32),
    /// An opcode the emulator does not serve.
    #[error("unsupported opcode {0}")]
    UnsupportedOpcode(i32),
    /// Structurally invalid OP_MSG.
    #[error("malformed OP_MSG: {0}")]
    Malformed(String),
    /// A document that is not valid BSON.
    #[error("invalid BSON: {0}")]
    InvalidBson(String),
}

/// The standard 16-byte header of every wire message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Total message length including the header.
    pub message_length: i32,
    /// Identifier chosen by the sender.
    pub request_id: i32,
    /// For replies: the `request_id` being answered.
    pub response_to: i32,
    /// Opcode.
    pub op_code: i32,
}

impl Header {
    /// Parses a header from exactly 16 little-endian bytes.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Header {
        let field =
            |i: usize| i32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Header {
            message_length: field(0),
            request_id: field(4),
            response_to: field(8),
            op_code: field(12),
        }
    }

    /// Appends the header's 16 bytes to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.message_length.to_le_bytes());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(&self.response_to.to_le_bytes());
        out.extend_from_slice(&self.op_code.to_le_bytes());
    }
}

/// A decoded OP_MSG request.
#[derive(Debug, Clone, PartialEq)]
pub struct OpMsg {
    /// The request's header.
    pub header: Header,
    /// OP_MSG flag bits (checksum bit included if it was set).
    pub flags: u32,
    /// The command body with every kind-1 document sequence merged in as an array under its
    /// identifier.
    pub body: Document,
}

impl OpMsg {
    /// Whether the client set `exhaustAllowed`.
    pub fn exhaust_allowed(&self) -> bool {
        self.flags & FLAG_EXHAUST_ALLOWED != 0
    }

    /// Whether the client set `moreToCome` (it expects no reply).
    pub fn more_to_come(&self) -> bool {
        self.flags & FLAG_MORE_TO_COME != 0
    }
}

/// A decoded legacy OP_QUERY (only ever answered when it is a handshake on `<db>.$cmd`).
#[derive(Debug, Clone, PartialEq)]
pub struct OpQuery {
    /// The request's header.
    pub header: Header,
    /// OP_QUERY flag bits (`secondaryOk` and the like; they do not matter for a command).
    pub flags: u32,
    /// `<db>.<collection>`; commands go to `<db>.$cmd`.
    pub full_collection_name: String,
    /// Documents to skip (ignored for commands).
    pub number_to_skip: i32,
    /// Documents to return (`-1` for a command: one reply document).
    pub number_to_return: i32,
    /// The query document: the command itself, or `{$query: <command>, $readPreference: …}`.
    pub query: Document,
    /// The optional field selector that may follow the query.
    pub return_fields_selector: Option<Document>,
}

impl OpQuery {
    /// The database of a `<db>.$cmd` namespace, or `None` when the namespace is not a command
    /// namespace (a legacy find, which mongod refuses).
    pub fn command_database(&self) -> Option<&str> {
        self.full_collection_name
            .strip_suffix(".$cmd")
            .filter(|db| !db.is_empty())
    }

    /// The command document: the query itself, or what `$query` / `query` wraps (drivers wrap
    /// the command when they add `$readPreference`).
    pub fn command(&self) -> Document {
        let first = self.query.keys().next().map(String::as_str);
        match first {
            Some("$query") | Some("query") => match self.query.iter().next() {
                Some((_, bson::Bson::Document(inner))) => inner.clone(),
                _ => self.query.clone(),
            },
            _ => self.query.clone(),
        }
    }
}

/// A decoded OP_REPLY (what the server answers an OP_QUERY with; decoded by test clients).
#[derive(Debug, Clone, PartialEq)]
pub struct OpReply {
    /// The reply's header.
    pub header: Header,
    /// `responseFlags` ([`REPLY_QUERY_FAILURE`], [`REPLY_AWAIT_CAPABLE`]).
    pub flags: u32,
    /// Cursor id (always 0 for a command reply).
    pub cursor_id: i64,
    /// Position of the first document in the cursor.
    pub starting_from: i32,
    /// The documents returned.
    pub documents: Vec<Document>,
}

/// Any message a client may send, as the server reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// An OP_MSG command.
    Msg(OpMsg),
    /// A legacy OP_QUERY (a handshake on `<db>.$cmd`, or something to refuse).
    Query(OpQuery),
    /// A legacy opcode mongod no longer serves (OP_UPDATE, OP_INSERT, OP_GET_MORE, OP_DELETE,
    /// OP_KILL_CURSORS): its body is skipped unparsed, and the server refuses it.
    Legacy(Header),
}

/// Reads one frame's header and body. Returns `Ok(None)` on a clean end of stream before any
/// byte of a new message.
async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<(Header, Vec<u8>)>, WireError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = reader.read(&mut head[filled..]).await?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(WireError::Truncated("header"))
            };
        }
        filled += n;
    }
    let header = Header::parse(&head);
    check_length(header.message_length)?;
    let mut rest = vec![0u8; header.message_length as usize - HEADER_LEN];
    match reader.read_exact(&mut rest).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(WireError::Truncated("body"))
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Some((header, rest)))
}

/// Reads one OP_MSG from `reader` (any other opcode is [`WireError::UnsupportedOpcode`]).
/// Returns `Ok(None)` on a clean end of stream before any byte of a new message.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<OpMsg>, WireError> {
    match read_frame(reader).await? {
        Some((header, rest)) => decode_body(header, &rest).map(Some),
        None => Ok(None),
    }
}

/// Reads one client message of any opcode the server knows (OP_MSG, OP_QUERY, the refused
/// legacy opcodes). Returns `Ok(None)` on a clean end of stream before a new message.
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Request>, WireError> {
    match read_frame(reader).await? {
        Some((header, rest)) => decode_request_body(header, &rest).map(Some),
        None => Ok(None),
    }
}

/// Reads one OP_REPLY (test clients that sent an OP_QUERY). `Ok(None)` at a clean end.
pub async fn read_reply<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<OpReply>, WireError> {
    match read_frame(reader).await? {
        Some((header, rest)) if header.op_code == OP_REPLY => {
            decode_op_reply(header, &rest).map(Some)
        }
        Some((header, _)) => Err(WireError::UnsupportedOpcode(header.op_code)),
        None => Ok(None),
    }
}

fn check_length(len: i32) -> Result<(), WireError> {
    if len < HEADER_LEN as i32 || len > MAX_MESSAGE_SIZE_BYTES {
        return Err(WireError::BadLength(len));
    }
    Ok(())
}

/// Decodes a complete message held in `bytes` (header included).
pub fn decode_message(bytes: &[u8]) -> Result<OpMsg, WireError> {
    let (header, body) = split_message(bytes)?;
    decode_body(header, body)
}

/// Splits a complete message held in `bytes` into its header and body, checking the length.
fn split_message(bytes: &[u8]) -> Result<(Header, &[u8]), WireError> {
    let head: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(WireError::Truncated("header"))?;
    let header = Header::parse(head);
    check_length(header.message_length)?;
    let len = header.message_length as usize;
    if bytes.len() < len {
        return Err(WireError::Truncated("body"));
    }
    if bytes.len() > len {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes after the message",
            bytes.len() - len
        )));
    }
    Ok((header, &bytes[HEADER_LEN..]))
}

/// Decodes a complete client message held in `bytes` (header included), of any opcode the
/// server knows.
pub fn decode_request(bytes: &[u8]) -> Result<Request, WireError> {
    let (header, body) = split_message(bytes)?;
    decode_request_body(header, body)
}

/// Decodes a complete OP_REPLY held in `bytes` (header included).
pub fn decode_reply(bytes: &[u8]) -> Result<OpReply, WireError> {
    let (header, body) = split_message(bytes)?;
    match header.op_code {
        OP_REPLY => decode_op_reply(header, body),
        other => Err(WireError::UnsupportedOpcode(other)),
    }
}

/// Decodes the bytes after the header according to the header's opcode (OP_MSG only).
pub fn decode_body(header: Header, body: &[u8]) -> Result<OpMsg, WireError> {
    match header.op_code {
        OP_MSG => decode_op_msg(header, body),
        other => Err(WireError::UnsupportedOpcode(other)),
    }
}

/// Decodes the bytes after the header of a client message of any opcode the server knows.
pub fn decode_request_body(header: Header, body: &[u8]) -> Result<Request, WireError> {
    match header.op_code {
        OP_MSG => decode_op_msg(header, body).map(Request::Msg),
        OP_QUERY => decode_op_query(header, body).map(Request::Query),
        OP_UPDATE | OP_INSERT | OP_GET_MORE | OP_DELETE | OP_KILL_CURSORS => {
            Ok(Request::Legacy(header))
        }
        other => Err(WireError::UnsupportedOpcode(other)),
    }
}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    read_u32(bytes, at).map(|v| v as i32)
}

/// Decodes the OP_QUERY payload: flags, `fullCollectionName`, skip, return, the query and an
/// optional field selector, and nothing after them.
pub fn decode_op_query(header: Header, payload: &[u8]) -> Result<OpQuery, WireError> {
    let flags = read_u32(payload, 0).ok_or(WireError::Truncated("OP_QUERY flags"))?;
    let rest = payload
        .get(4..)
        .ok_or(WireError::Truncated("fullCollectionName"))?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| WireError::Malformed("unterminated fullCollectionName".into()))?;
    let full_collection_name = std::str::from_utf8(&rest[..end])
        .map_err(|_| WireError::Malformed("fullCollectionName is not UTF-8".into()))?
        .to_string();
    let mut pos = 4 + end + 1;
    let number_to_skip = read_i32(payload, pos).ok_or(WireError::Truncated("numberToSkip"))?;
    let number_to_return =
        read_i32(payload, pos + 4).ok_or(WireError::Truncated("numberToReturn"))?;
    pos += 8;
    let (query, len) = parse_document(&payload[pos.min(payload.len())..])?;
    pos += len;
    let return_fields_selector = if pos < payload.len() {
        let (doc, len) = parse_document(&payload[pos..])?;
        pos += len;
        Some(doc)
    } else {
        None
    };
    if pos != payload.len() {
        return Err(WireError::Malformed(format!(
            "{} bytes after the OP_QUERY documents",
            payload.len() - pos
        )));
    }
    Ok(OpQuery {
        header,
        flags,
        full_collection_name,
        number_to_skip,
        number_to_return,
        query,
        return_fields_selector,
    })
}

/// Decodes the OP_REPLY payload: flags, cursor id, starting point, count and the documents
/// (at most as many as the count says, and the count must match the bytes).
pub fn decode_op_reply(header: Header, payload: &[u8]) -> Result<OpReply, WireError> {
    let flags = read_u32(payload, 0).ok_or(WireError::Truncated("responseFlags"))?;
    let cursor_id = payload
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(i64::from_le_bytes)
        .ok_or(WireError::Truncated("cursorID"))?;
    let starting_from = read_i32(payload, 12).ok_or(WireError::Truncated("startingFrom"))?;
    let number_returned = read_i32(payload, 16).ok_or(WireError::Truncated("numberReturned"))?;
    let mut pos = 20;
    let mut documents = Vec::new();
    // Every document takes at least 5 bytes, so the loop is bounded by the payload's length.
    while pos < payload.len() {
        let (doc, len) = parse_document(&payload[pos..])?;
        documents.push(doc);
        pos += len;
    }
    if usize::try_from(number_returned).ok() != Some(documents.len()) {
        return Err(WireError::Malformed(format!(
            "numberReturned {number_returned} but {} documents",
            documents.len()
        )));
    }
    Ok(OpReply {
        header,
        flags,
        cursor_id,
        starting_from,
        documents,
    })
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Parses one BSON document at the start of `bytes`, returning it and its length.
fn parse_document(bytes: &[u8]) -> Result<(Document, usize), WireError> {
    let declared = read_u32(bytes, 0).ok_or(WireError::Truncated("document length"))? as usize;
    if declared < 5 {
        return Err(WireError::InvalidBson(format!(
            "document length {declared} is below 5"
        )));
    }
    if declared > MAX_BSON_OBJECT_SIZE as usize + BSON_OBJECT_SIZE_SLACK as usize {
        return Err(WireError::InvalidBson(format!(
            "document of {declared} bytes exceeds maxBsonObjectSize"
        )));
    }
    let slice = bytes
        .get(..declared)
        .ok_or(WireError::Truncated("document"))?;
    let raw =
        bson::RawDocument::from_bytes(slice).map_err(|e| WireError::InvalidBson(e.to_string()))?;
    // Validate every element and bound the nesting before building the owned document, whose
    // conversion recurses once per level.
    check_nesting(raw, 0)?;
    let doc = Document::try_from(raw).map_err(|e| WireError::InvalidBson(e.to_string()))?;
    Ok((doc, declared))
}

/// Deepest nesting of documents and arrays accepted in a request (mongod allows 180 levels in
/// user documents plus a few for the command around them).
pub const MAX_NESTING: usize = 200;

fn check_nesting(doc: &bson::RawDocument, depth: usize) -> Result<(), WireError> {
    if depth >= MAX_NESTING {
        return Err(WireError::InvalidBson(format!(
            "nesting deeper than {MAX_NESTING} levels"
        )));
    }
    for element in doc {
        let (_, value) = element.map_err(|e| WireError::InvalidBson(e.to_string()))?;
        check_value(value, depth)?;
    }
    Ok(())
}

fn check_value(value: bson::RawBsonRef<'_>, depth: usize) -> Result<(), WireError> {
    match value {
        bson::RawBsonRef::Document(d) => check_nesting(d, depth + 1),
        bson::RawBsonRef::JavaScriptCodeWithScope(c) => check_nesting(c.scope, depth + 1),
        bson::RawBsonRef::Array(a) => {
            if depth + 1 >= MAX_NESTING {
                return Err(WireError::InvalidBson(format!(
                    "nesting deeper than {MAX_NESTING} levels"
                )));
            }
            for item in a {
                check_value(
                    item.map_err(|e| WireError::InvalidBson(e.to_string()))?,
                    depth + 1,
                )?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn read_cstring(bytes: &[u8]) -> Result<(&str, usize), WireError> {
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| WireError::Malformed("unterminated sequence identifier".into()))?;
    let s = std::str::from_utf8(&bytes[..end])
        .map_err(|_| WireError::Malformed("sequence identifier is not UTF-8".into()))?;
    Ok((s, end + 1))
}

/// Decodes the OP_MSG payload (everything after the header).
pub fn decode_op_msg(header: Header, payload: &[u8]) -> Result<OpMsg, WireError> {
    let flags = read_u32(payload, 0).ok_or(WireError::Truncated("flagBits"))?;
    if flags & !KNOWN_FLAGS & 0xFFFF != 0 {
        return Err(WireError::Malformed(format!(
            "unknown required flag bits in {flags:#x}"
        )));
    }
    let mut end = payload.len();
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        // The checksum is accepted without verification: the driver never sends one, and the
        // sections are validated structurally anyway.
        end = end
            .checked_sub(4)
            .filter(|&e| e >= 4)
            .ok_or(WireError::Truncated("checksum"))?;
    }
    let mut pos = 4;
    let mut body: Option<Document> = None;
    let mut sequences: Vec<(String, Vec<bson::Bson>)> = Vec::new();
    while pos < end {
        let kind = payload[pos];
        pos += 1;
        let section = &payload[pos..end];
        match kind {
            0 => {
                if body.is_some() {
                    return Err(WireError::Malformed("more than one kind-0 section".into()));
                }
                let (doc, len) = parse_document(section)?;
                body = Some(doc);
                pos += len;
            }
            1 => {
                let size =
                    read_u32(section, 0).ok_or(WireError::Truncated("sequence size"))? as usize;
                if size < 5 || size > section.len() {
                    return Err(WireError::Malformed(format!(
                        "document sequence size {size} is out of bounds"
                    )));
                }
                let seq = &section[4..size];
                let (ident, mut off) = read_cstring(seq)?;
                if ident.is_empty() {
                    return Err(WireError::Malformed("empty sequence identifier".into()));
                }
                let mut docs = Vec::new();
                while off < seq.len() {
                    let (doc, len) = parse_document(&seq[off..])?;
                    docs.push(bson::Bson::Document(doc));
                    off += len;
                }
                if sequences.iter().any(|(name, _)| name == ident) {
                    return Err(WireError::Malformed(format!(
                        "duplicate document sequence '{ident}'"
                    )));
                }
                sequences.push((ident.to_string(), docs));
                pos += size;
            }
            other => {
                return Err(WireError::Malformed(format!(
                    "unknown section kind {other}"
                )))
            }
        }
    }
    let mut body = body.ok_or_else(|| WireError::Malformed("no kind-0 section".into()))?;
    for (ident, docs) in sequences {
        if body.contains_key(&ident) {
            return Err(WireError::Malformed(format!(
                "'{ident}' given both in the body and as a document sequence"
            )));
        }
        body.insert(ident, bson::Bson::Array(docs));
    }
    if body.is_empty() {
        return Err(WireError::Malformed("empty command body".into()));
    }
    Ok(OpMsg {
        header,
        flags,
        body,
    })
}

/// Encodes an OP_MSG with a single kind-0 section.
pub fn encode_op_msg(
    request_id: i32,
    response_to: i32,
    flags: u32,
    body: &Document,
) -> Result<Vec<u8>, WireError> {
    let mut doc_bytes = Vec::new();
    body.to_writer(&mut doc_bytes)
        .map_err(|e| WireError::InvalidBson(e.to_string()))?;
    let total = HEADER_LEN + 4 + 1 + doc_bytes.len();
    let message_length = i32::try_from(total).map_err(|_| WireError::BadLength(i32::MAX))?;
    let header = Header {
        message_length,
        request_id,
        response_to,
        op_code: OP_MSG,
    };
    let mut out = Vec::with_capacity(total);
    header.write_to(&mut out);
    out.extend_from_slice(&(flags & !FLAG_CHECKSUM_PRESENT).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&doc_bytes);
    Ok(out)
}

/// Encodes an OP_REPLY carrying `documents` (cursor id 0, starting from 0), the answer to an
/// OP_QUERY. mongod sets [`REPLY_AWAIT_CAPABLE`] on every reply; `flags` adds to it.
pub fn encode_op_reply(
    request_id: i32,
    response_to: i32,
    flags: u32,
    documents: &[Document],
) -> Result<Vec<u8>, WireError> {
    let mut docs_bytes = Vec::new();
    for doc in documents {
        doc.to_writer(&mut docs_bytes)
            .map_err(|e| WireError::InvalidBson(e.to_string()))?;
    }
    let total = HEADER_LEN + 4 + 8 + 4 + 4 + docs_bytes.len();
    let message_length = i32::try_from(total).map_err(|_| WireError::BadLength(i32::MAX))?;
    let number_returned =
        i32::try_from(documents.len()).map_err(|_| WireError::BadLength(i32::MAX))?;
    let header = Header {
        message_length,
        request_id,
        response_to,
        op_code: OP_REPLY,
    };
    let mut out = Vec::with_capacity(total);
    header.write_to(&mut out);
    out.extend_from_slice(&(flags | REPLY_AWAIT_CAPABLE).to_le_bytes());
    out.extend_from_slice(&0i64.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&number_returned.to_le_bytes());
    out.extend_from_slice(&docs_bytes);
    Ok(out)
}

/// Encodes an OP_QUERY (what a legacy client sends; used by tests and fuzzers).
pub fn encode_op_query(
    request_id: i32,
    full_collection_name: &str,
    number_to_return: i32,
    query: &Document,
) -> Result<Vec<u8>, WireError> {
    let mut doc_bytes = Vec::new();
    query
        .to_writer(&mut doc_bytes)
        .map_err(|e| WireError::InvalidBson(e.to_string()))?;
    let total = HEADER_LEN + 4 + full_collection_name.len() + 1 + 8 + doc_bytes.len();
    let message_length = i32::try_from(total).map_err(|_| WireError::BadLength(i32::MAX))?;
    let header = Header {
        message_length,
        request_id,
        response_to: 0,
        op_code: OP_QUERY,
    };
    let mut out = Vec::with_capacity(total);
    header.write_to(&mut out);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(full_collection_name.as_bytes());
    out.push(0);
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&number_to_return.to_le_bytes());
    out.extend_from_slice(&doc_bytes);
    Ok(out)
}

#[cfg(test)]
mod tests;
