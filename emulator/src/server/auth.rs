//! Authentication as mongod does it: users with SCRAM credentials, `saslStart` /
//! `saslContinue`, speculative authentication and `saslSupportedMechs` in hello, per-connection
//! authentication state, and the check that refuses commands before authentication.
//!
//! Authentication is enforced only when users were configured at start
//! ([`super::EmulatorConfig::users`], `labd --user`), like a mongod started with `--auth`.
//! Without them, the user commands and SCRAM still work (as on a mongod without `--auth`) but
//! nothing requires them.
//!
//! Authorization is all-or-nothing: an authenticated user may run every command. Roles are
//! validated and stored, and reported by `usersInfo` and `connectionStatus`, but not enforced.

use std::collections::BTreeMap;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

use super::error::{codes, CommandError};
use super::scram::{self, Credential, Mechanism, ScramError, ServerFirst};
use super::{lock, Shared};

/// The only conversation id mongod hands out (one conversation per connection at a time).
const CONVERSATION_ID: i32 = 1;

/// A user configured at start.
#[derive(Debug, Clone, PartialEq)]
pub struct UserConfig {
    /// Authentication database (usually `admin`).
    pub db: String,
    /// User name.
    pub name: String,
    /// Password (only its SCRAM credentials are kept once the emulator starts).
    pub password: String,
    /// Roles, as `{role, db}` documents; `root` on `admin` when empty.
    pub roles: Vec<Document>,
}

impl UserConfig {
    /// A user of the `admin` database with the `root` role and both SCRAM mechanisms.
    pub fn admin(name: impl Into<String>, password: impl Into<String>) -> UserConfig {
        UserConfig {
            db: "admin".into(),
            name: name.into(),
            password: password.into(),
            roles: Vec::new(),
        }
    }

    /// Parses labd's `--user` value: `name:password` or `db.name:password` (the password may
    /// contain `:`; the name may not).
    pub fn parse(text: &str) -> Result<UserConfig, String> {
        let (who, password) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?}: expected NAME:PASSWORD or DB.NAME:PASSWORD"))?;
        let (db, name) = match who.split_once('.') {
            Some((db, name)) => (db, name),
            None => ("admin", who),
        };
        if db.is_empty() || name.is_empty() || password.is_empty() {
            return Err(format!(
                "{text:?}: the database, user name and password must not be empty"
            ));
        }
        Ok(UserConfig {
            db: db.into(),
            name: name.into(),
            password: password.into(),
            roles: Vec::new(),
        })
    }
}

/// A stored user.
#[derive(Debug, Clone)]
struct User {
    user_id: bson::Uuid,
    roles: Vec<Document>,
    custom_data: Option<Document>,
    credentials: BTreeMap<Mechanism, Credential>,
}

/// Every user of the deployment (mongod's `admin.system.users`), keyed by (db, name), and the
/// authentication counters of `serverStatus.security`.
#[derive(Debug, Default)]
pub(crate) struct Users {
    users: BTreeMap<(String, String), User>,
    stats: BTreeMap<Mechanism, MechanismStats>,
    sasl_supported_mechs_received: i64,
}

/// mongod's `security.authentication.mechanisms.<name>` counters.
#[derive(Debug, Default, Clone, Copy)]
struct MechanismStats {
    /// Conversations started (`saslStart` commands and speculative ones).
    received: i64,
    successful: i64,
    /// Conversations started in a hello's `speculativeAuthenticate` (also in `received`).
    speculative_received: i64,
    speculative_successful: i64,
}

impl Users {
    /// The users configured at start, each with credentials for both mechanisms at mongod's
    /// default iteration counts.
    pub(crate) fn from_config(configs: &[UserConfig]) -> Result<Users, String> {
        let mut users = Users::default();
        for c in configs {
            let roles = if c.roles.is_empty() {
                vec![doc! { "role": "root", "db": "admin" }]
            } else {
                c.roles.clone()
            };
            let credentials = derive_all(&c.name, &c.password, &Mechanism::ALL, |m| {
                m.default_iterations()
            })
            .map_err(|e| e.errmsg)?;
            users.users.insert(
                (c.db.clone(), c.name.clone()),
                User {
                    user_id: bson::Uuid::new(),
                    roles,
                    custom_data: None,
                    credentials,
                },
            );
        }
        Ok(users)
    }

    fn credential(&self, db: &str, name: &str, mech: Mechanism) -> Option<Credential> {
        self.users
            .get(&(db.to_string(), name.to_string()))
            .and_then(|u| u.credentials.get(&mech))
            .cloned()
    }

    fn exists(&self, who: &(String, String)) -> bool {
        self.users.contains_key(who)
    }
}

fn derive_all(
    name: &str,
    password: &str,
    mechanisms: &[Mechanism],
    iterations: impl Fn(Mechanism) -> u32,
) -> Result<BTreeMap<Mechanism, Credential>, CommandError> {
    mechanisms
        .iter()
        .map(|m| {
            Credential::new(*m, name, password, iterations(*m))
                .map(|c| (*m, c))
                .map_err(CommandError::bad_value)
        })
        .collect()
}

/// One connection's authentication state.
#[derive(Debug, Default)]
pub(crate) struct ConnAuth {
    /// The user this connection authenticated as: (db, name).
    user: Option<(String, String)>,
    /// A SCRAM conversation in progress.
    conversation: Option<Conversation>,
}

#[derive(Debug)]
struct Conversation {
    db: String,
    user: String,
    mechanism: Mechanism,
    /// Started in a hello's `speculativeAuthenticate`.
    speculative: bool,
    skip_empty_exchange: bool,
    step: Step,
}

impl Conversation {
    /// The proof checked out and the conversation is done: the connection is authenticated.
    fn succeed(self, shared: &Shared, conn: &mut ConnAuth) {
        let mut users = lock(&shared.users);
        let stats = users.stats.entry(self.mechanism).or_default();
        stats.successful += 1;
        if self.speculative {
            stats.speculative_successful += 1;
        }
        conn.user = Some((self.db, self.user));
    }
}

/// `serverStatus.security`: mongod's authentication counters, for the whole deployment.
pub(crate) fn server_status(shared: &Shared) -> Document {
    let users = lock(&shared.users);
    let mut mechanisms = Document::new();
    for m in Mechanism::ALL {
        let s = users.stats.get(&m).copied().unwrap_or_default();
        mechanisms.insert(
            m.name(),
            doc! {
                "authenticate": { "received": s.received, "successful": s.successful },
                "speculativeAuthenticate": {
                    "received": s.speculative_received,
                    "successful": s.speculative_successful,
                },
            },
        );
    }
    doc! {
        "authentication": {
            "saslSupportedMechsReceived": users.sasl_supported_mechs_received,
            "mechanisms": mechanisms,
        },
    }
}

#[derive(Debug)]
enum Step {
    /// The server sent its first message and waits for the client's proof.
    AwaitProof(Box<ServerFirst>),
    /// The proof was good; without `skipEmptyExchange` the client sends one more, empty,
    /// message before the conversation is done.
    AwaitEmpty,
}

/// Commands mongod runs before authentication (their `requiresAuth()` is false): the
/// handshake, authentication itself, a few that reveal nothing, and `configureFailPoint`, a
/// test command that mongod lets anyone run once test commands are enabled. `logout`,
/// `endSessions` and `whatsmyuri` need an authenticated user, as in mongod.
pub(crate) fn allowed_without_auth(name: &str) -> bool {
    matches!(
        name,
        "hello"
            | "isMaster"
            | "ismaster"
            | "ping"
            | "buildInfo"
            | "buildinfo"
            | "saslStart"
            | "saslContinue"
            | "authenticate"
            | "connectionStatus"
            | "configureFailPoint"
    )
}

/// The commands this module answers.
pub(crate) fn is_auth_command(name: &str) -> bool {
    matches!(
        name,
        "saslStart"
            | "saslContinue"
            | "authenticate"
            | "logout"
            | "createUser"
            | "updateUser"
            | "dropUser"
            | "dropAllUsersFromDatabase"
            | "usersInfo"
            | "connectionStatus"
    )
}

/// Refuses `name` on a connection that has not authenticated, when the deployment requires
/// authentication: 13 Unauthorized with mongod's message.
pub(crate) fn check(shared: &Shared, conn: &ConnAuth, name: &str) -> Result<(), CommandError> {
    if !shared.auth_required || allowed_without_auth(name) {
        return Ok(());
    }
    // A dropped user's connections lose their rights, as in mongod (its user cache is
    // invalidated).
    let authenticated = conn
        .user
        .as_ref()
        .is_some_and(|who| lock(&shared.users).exists(who));
    if authenticated {
        Ok(())
    } else {
        Err(CommandError::new(
            codes::UNAUTHORIZED,
            format!("Command {name} requires authentication"),
        ))
    }
}

fn authentication_failed() -> CommandError {
    CommandError::new(codes::AUTHENTICATION_FAILED, "Authentication failed.")
}

fn payload_bytes(value: Option<&Bson>) -> Result<Vec<u8>, CommandError> {
    match value {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        // mongod also takes the payload as a string (old shells sent it that way).
        Some(Bson::String(s)) => Ok(s.as_bytes().to_vec()),
        None => Err(CommandError::new(
            codes::IDL_MISSING_FIELD,
            "BSON field 'payload' is missing but a required field",
        )),
        Some(_) => Err(CommandError::type_mismatch(
            "BSON field 'payload' is the wrong type, expected types '[string, binData]'",
        )),
    }
}

fn payload(bytes: impl Into<Vec<u8>>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.into(),
    })
}

fn scram_error(e: ScramError) -> CommandError {
    match e {
        ScramError::Malformed(msg) => CommandError::bad_value(msg),
        ScramError::Failed => authentication_failed(),
    }
}

/// `saslStart` (or the `speculativeAuthenticate` document of a hello) on database `db`.
fn sasl_start(
    shared: &Shared,
    conn: &mut ConnAuth,
    db: &str,
    body: &Document,
    speculative: bool,
) -> Result<Document, CommandError> {
    // A new start abandons whatever conversation was in progress.
    conn.conversation = None;
    let mechanism =
        match body.get("mechanism") {
            Some(Bson::String(m)) => m.as_str(),
            Some(_) => return Err(CommandError::type_mismatch(
                "BSON field 'saslStart.mechanism' is the wrong type 'int', expected type 'string'",
            )),
            None => {
                return Err(CommandError::new(
                    codes::IDL_MISSING_FIELD,
                    "BSON field 'saslStart.mechanism' is missing but a required field",
                ))
            }
        };
    let Some(mech) = Mechanism::from_name(mechanism) else {
        return Err(CommandError::new(
            codes::MECHANISM_UNAVAILABLE,
            format!("Received authentication for mechanism {mechanism} which is not enabled"),
        ));
    };
    let message = payload_bytes(body.get("payload"))?;
    let credential = {
        let mut users = lock(&shared.users);
        let stats = users.stats.entry(mech).or_default();
        stats.received += 1;
        if speculative {
            stats.speculative_received += 1;
        }
        let message = String::from_utf8(message)
            .map_err(|_| CommandError::bad_value("SCRAM payload is not valid UTF-8"))?;
        let first = scram::parse_client_first(&message).map_err(scram_error)?;
        // An unknown user, or one without this mechanism's credential, fails at once with the
        // same error as a wrong password.
        let credential = users
            .credential(db, &first.user, mech)
            .ok_or_else(authentication_failed)?;
        (first, credential)
    };
    let (first, credential) = credential;
    let skip_empty_exchange = body
        .get_document("options")
        .ok()
        .map(|o| matches!(o.get("skipEmptyExchange"), Some(Bson::Boolean(true))))
        .unwrap_or(false);
    let user = first.user.clone();
    let server_first = ServerFirst::new(mech, credential, first);
    let reply = doc! {
        "conversationId": CONVERSATION_ID,
        "done": false,
        "payload": payload(server_first.message.clone().into_bytes()),
        "ok": 1.0,
    };
    conn.conversation = Some(Conversation {
        db: db.to_string(),
        user,
        mechanism: mech,
        speculative,
        skip_empty_exchange,
        step: Step::AwaitProof(Box::new(server_first)),
    });
    Ok(reply)
}

fn sasl_continue(
    shared: &Shared,
    conn: &mut ConnAuth,
    body: &Document,
) -> Result<Document, CommandError> {
    let id = match body.get("conversationId") {
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(d)) if d.fract() == 0.0 => *d as i64,
        _ => {
            return Err(CommandError::new(
                codes::IDL_MISSING_FIELD,
                "BSON field 'saslContinue.conversationId' is missing but a required field",
            ))
        }
    };
    let message = payload_bytes(body.get("payload"))?;
    let Some(mut conversation) = conn.conversation.take() else {
        return Err(CommandError::new(
            codes::PROTOCOL_ERROR,
            "No SASL session state found",
        ));
    };
    if id != i64::from(CONVERSATION_ID) {
        return Err(CommandError::new(
            codes::PROTOCOL_ERROR,
            "sasl: Mismatched conversation id",
        ));
    }
    // A failed step ends the conversation (it was taken out of `conn` above).
    match std::mem::replace(&mut conversation.step, Step::AwaitEmpty) {
        Step::AwaitProof(server_first) => {
            let message = String::from_utf8(message)
                .map_err(|_| CommandError::bad_value("SCRAM payload is not valid UTF-8"))?;
            let server_final = server_first.finish(&message).map_err(scram_error)?;
            let done = conversation.skip_empty_exchange;
            if done {
                conversation.succeed(shared, conn);
            } else {
                conn.conversation = Some(conversation);
            }
            Ok(doc! {
                "conversationId": CONVERSATION_ID,
                "done": done,
                "payload": payload(server_final.into_bytes()),
                "ok": 1.0,
            })
        }
        Step::AwaitEmpty => {
            if !message.is_empty() {
                return Err(CommandError::bad_value(
                    "SCRAM: the exchange is complete; expected an empty message",
                ));
            }
            conversation.succeed(shared, conn);
            Ok(doc! {
                "conversationId": CONVERSATION_ID,
                "done": true,
                "payload": payload(Vec::new()),
                "ok": 1.0,
            })
        }
    }
}

/// Adds the authentication fields of a hello reply: `saslSupportedMechs` for a
/// `saslSupportedMechs: "<db>.<user>"` request (omitted for an unknown user), and the reply to
/// `speculativeAuthenticate` (omitted when it fails: the client then authenticates normally
/// and gets the error there, as with mongod).
pub(crate) fn hello_fields(
    shared: &Shared,
    conn: &mut ConnAuth,
    hello: &Document,
    reply: &mut Document,
) {
    if let Ok(who) = hello.get_str("saslSupportedMechs") {
        let mut users = lock(&shared.users);
        users.sasl_supported_mechs_received += 1;
        if let Some((db, name)) = who.split_once('.') {
            if let Some(user) = users.users.get(&(db.to_string(), name.to_string())) {
                let mechs: Vec<Bson> = user
                    .credentials
                    .keys()
                    .map(|m| Bson::String(m.name().into()))
                    .collect();
                reply.insert("saslSupportedMechs", mechs);
            }
        }
    }
    if let Ok(spec) = hello.get_document("speculativeAuthenticate") {
        let db = spec.get_str("db").unwrap_or("admin").to_string();
        if spec.contains_key("saslStart") {
            match sasl_start(shared, conn, &db, spec, true) {
                Ok(mut r) => {
                    r.remove("ok");
                    reply.insert("speculativeAuthenticate", r);
                }
                Err(e) => {
                    tracing::debug!(error = %e.errmsg, "speculative authentication failed");
                }
            }
        }
    }
}

/// Runs one of the commands [`is_auth_command`] names.
pub(crate) fn run(
    shared: &Shared,
    conn: &mut ConnAuth,
    name: &str,
    db: &str,
    body: &Document,
) -> Result<Document, CommandError> {
    match name {
        "saslStart" => sasl_start(shared, conn, db, body, false),
        "saslContinue" => sasl_continue(shared, conn, body),
        "authenticate" => {
            let mech = body.get_str("mechanism").unwrap_or("");
            Err(CommandError::new(
                codes::MECHANISM_UNAVAILABLE,
                format!("Received authentication for mechanism {mech} which is not enabled"),
            ))
        }
        "logout" => {
            conn.user = None;
            conn.conversation = None;
            Ok(doc! { "ok": 1.0 })
        }
        "connectionStatus" => Ok(connection_status(shared, conn)),
        "createUser" => create_user(shared, db, body),
        "updateUser" => update_user(shared, db, body),
        "dropUser" => {
            let user = user_name_argument(name, body)?;
            let removed = lock(&shared.users)
                .users
                .remove(&(db.to_string(), user.clone()));
            match removed {
                Some(_) => Ok(doc! { "ok": 1.0 }),
                None => Err(user_not_found(&user, db)),
            }
        }
        "dropAllUsersFromDatabase" => {
            let mut users = lock(&shared.users);
            let before = users.users.len();
            users.users.retain(|(d, _), _| d != db);
            let n = (before - users.users.len()) as i32;
            Ok(doc! { "n": n, "ok": 1.0 })
        }
        "usersInfo" => users_info(shared, db, body),
        other => Err(CommandError::new(
            codes::COMMAND_NOT_FOUND,
            format!("no such command: '{other}'"),
        )),
    }
}

fn connection_status(shared: &Shared, conn: &ConnAuth) -> Document {
    let users = lock(&shared.users);
    let mut authenticated = Vec::new();
    let mut roles = Vec::new();
    if let Some((db, name)) = &conn.user {
        if let Some(u) = users.users.get(&(db.clone(), name.clone())) {
            authenticated.push(Bson::Document(
                doc! { "user": name.clone(), "db": db.clone() },
            ));
            roles.extend(u.roles.iter().cloned().map(Bson::Document));
        }
    }
    doc! {
        "authInfo": { "authenticatedUsers": authenticated, "authenticatedUserRoles": roles },
        "ok": 1.0,
    }
}

fn user_not_found(user: &str, db: &str) -> CommandError {
    CommandError::new(
        codes::USER_NOT_FOUND,
        format!("Could not find user \"{user}\" for db \"{db}\""),
    )
}

fn user_name_argument(command: &str, body: &Document) -> Result<String, CommandError> {
    match body.get(command) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Bson::String(_)) => Err(CommandError::bad_value("User name must not be empty")),
        _ => Err(CommandError::type_mismatch(format!(
            "BSON field '{command}.{command}' is the wrong type, expected type 'string'"
        ))),
    }
}

/// mongod's built-in roles, and whether each exists only on `admin`.
const BUILT_IN_ROLES: &[(&str, bool)] = &[
    ("read", false),
    ("readWrite", false),
    ("dbAdmin", false),
    ("dbOwner", false),
    ("userAdmin", false),
    ("enableSharding", false),
    ("root", true),
    ("readAnyDatabase", true),
    ("readWriteAnyDatabase", true),
    ("userAdminAnyDatabase", true),
    ("dbAdminAnyDatabase", true),
    ("clusterAdmin", true),
    ("clusterManager", true),
    ("clusterMonitor", true),
    ("hostManager", true),
    ("backup", true),
    ("restore", true),
    ("directShardOperations", true),
    ("searchCoordinator", true),
    ("__system", true),
];

/// Parses a `roles` array (names on `db`, or `{role, db}`), refusing roles mongod does not
/// have with 31 RoleNotFound.
fn parse_roles(db: &str, value: &Bson) -> Result<Vec<Document>, CommandError> {
    let Bson::Array(items) = value else {
        return Err(CommandError::type_mismatch(
            "BSON field 'roles' is the wrong type, expected type 'array'",
        ));
    };
    let mut roles = Vec::new();
    for item in items {
        let (role, role_db) = match item {
            Bson::String(r) => (r.clone(), db.to_string()),
            Bson::Document(d) => match (d.get_str("role"), d.get_str("db")) {
                (Ok(r), Ok(d)) => (r.to_string(), d.to_string()),
                _ => {
                    return Err(CommandError::bad_value(
                        "A role document must have string fields 'role' and 'db'",
                    ))
                }
            },
            _ => {
                return Err(CommandError::bad_value(
                    "Roles must be strings or {role, db} documents",
                ))
            }
        };
        let known = BUILT_IN_ROLES
            .iter()
            .any(|(name, admin_only)| *name == role && (!admin_only || role_db == "admin"));
        if !known {
            return Err(CommandError::new(
                codes::ROLE_NOT_FOUND,
                format!("Could not find role: {role}@{role_db}"),
            ));
        }
        roles.push(doc! { "role": role, "db": role_db });
    }
    Ok(roles)
}

/// The mechanisms a `createUser`/`updateUser` asks for (both when absent).
fn parse_mechanisms(body: &Document, command: &str) -> Result<Vec<Mechanism>, CommandError> {
    match body.get("mechanisms") {
        None => Ok(Mechanism::ALL.to_vec()),
        Some(Bson::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|m| match m {
                Bson::String(s) => Mechanism::from_name(s).ok_or_else(|| {
                    CommandError::bad_value(format!("Unknown auth mechanism '{s}'"))
                }),
                _ => Err(CommandError::bad_value(
                    "mechanisms field must be an array of strings",
                )),
            })
            .collect(),
        Some(_) => Err(CommandError::bad_value(format!(
            "{command}: mechanisms field must not be empty and must be an array of strings"
        ))),
    }
}

fn iterations(shared: &Shared, mech: Mechanism) -> u32 {
    let st = shared.state();
    match st.params.values.get(mech.iteration_parameter()) {
        Some(Bson::Int32(i)) if *i > 0 => *i as u32,
        Some(Bson::Int64(i)) if *i > 0 => (*i).min(i64::from(u32::MAX)) as u32,
        _ => mech.default_iterations(),
    }
}

fn password_argument(body: &Document) -> Result<Option<String>, CommandError> {
    match body.get("pwd") {
        None => Ok(None),
        Some(Bson::String(p)) if !p.is_empty() => Ok(Some(p.clone())),
        Some(Bson::String(_)) => Err(CommandError::bad_value("Password cannot be empty")),
        Some(_) => Err(CommandError::type_mismatch(
            "BSON field 'pwd' is the wrong type, expected type 'string'",
        )),
    }
}

fn custom_data_argument(body: &Document) -> Result<Option<Document>, CommandError> {
    match body.get("customData") {
        None => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d.clone())),
        Some(_) => Err(CommandError::type_mismatch(
            "BSON field 'customData' is the wrong type, expected type 'object'",
        )),
    }
}

fn create_user(shared: &Shared, db: &str, body: &Document) -> Result<Document, CommandError> {
    let name = user_name_argument("createUser", body)?;
    if db == "$external" {
        return Err(CommandError::bad_value(
            "Users on $external (X.509, LDAP, Kerberos) are not supported by the emulator",
        ));
    }
    let password = password_argument(body)?
        .ok_or_else(|| CommandError::bad_value("Must provide a 'pwd' field for all user documents, except those with '$external' as the user's source db"))?;
    if matches!(body.get("digestPassword"), Some(Bson::Boolean(false))) {
        return Err(CommandError::bad_value(
            "Use of digestPassword: false is not supported",
        ));
    }
    let roles = match body.get("roles") {
        Some(r) => parse_roles(db, r)?,
        None => {
            return Err(CommandError::new(
                codes::IDL_MISSING_FIELD,
                "BSON field 'createUser.roles' is missing but a required field",
            ))
        }
    };
    let custom_data = custom_data_argument(body)?;
    let mechanisms = parse_mechanisms(body, "createUser")?;
    // Derived outside the users lock: PBKDF2 takes a while.
    let credentials = derive_all(&name, &password, &mechanisms, |m| iterations(shared, m))?;
    let mut users = lock(&shared.users);
    let key = (db.to_string(), name.clone());
    if users.users.contains_key(&key) {
        return Err(CommandError::new(
            codes::LOCATION_USER_EXISTS,
            format!("User \"{name}@{db}\" already exists"),
        ));
    }
    users.users.insert(
        key,
        User {
            user_id: bson::Uuid::new(),
            roles,
            custom_data,
            credentials,
        },
    );
    Ok(doc! { "ok": 1.0 })
}

fn update_user(shared: &Shared, db: &str, body: &Document) -> Result<Document, CommandError> {
    let name = user_name_argument("updateUser", body)?;
    let password = password_argument(body)?;
    let roles = body.get("roles").map(|r| parse_roles(db, r)).transpose()?;
    let custom_data = custom_data_argument(body)?;
    let mechanisms = match body.contains_key("mechanisms") {
        true => Some(parse_mechanisms(body, "updateUser")?),
        false => None,
    };
    if password.is_none() && roles.is_none() && custom_data.is_none() && mechanisms.is_none() {
        return Err(CommandError::bad_value(
            "Must specify at least one field to update in updateUser",
        ));
    }
    let key = (db.to_string(), name.clone());
    let current: Vec<Mechanism> = match lock(&shared.users).users.get(&key) {
        Some(u) => u.credentials.keys().copied().collect(),
        None => return Err(user_not_found(&name, db)),
    };
    let new_credentials = match (&password, &mechanisms) {
        (Some(pwd), m) => {
            let mechs = m.clone().unwrap_or_else(|| Mechanism::ALL.to_vec());
            Some(derive_all(&name, pwd, &mechs, |m| iterations(shared, m))?)
        }
        (None, Some(m)) => {
            // Without a new password, mechanisms can only be narrowed: the credentials of the
            // others cannot be derived.
            if let Some(missing) = m.iter().find(|m| !current.contains(m)) {
                return Err(CommandError::bad_value(format!(
                    "mechanisms field must be a subset of previously set mechanisms; {} is not",
                    missing.name()
                )));
            }
            None
        }
        (None, None) => None,
    };
    let mut users = lock(&shared.users);
    let Some(user) = users.users.get_mut(&key) else {
        return Err(user_not_found(&name, db));
    };
    if let Some(c) = new_credentials {
        user.credentials = c;
    } else if let Some(m) = mechanisms {
        user.credentials.retain(|mech, _| m.contains(mech));
    }
    if let Some(r) = roles {
        user.roles = r;
    }
    if let Some(d) = custom_data {
        user.custom_data = Some(d);
    }
    Ok(doc! { "ok": 1.0 })
}

/// Which users a `usersInfo` argument names: `1` (all of `db`), a name, `{user, db}`, or an
/// array of those; `{forAllDBs: true}` lists every user.
fn users_wanted(db: &str, arg: &Bson) -> Result<Option<Vec<(String, String)>>, CommandError> {
    let one = |v: &Bson| -> Result<(String, String), CommandError> {
        match v {
            Bson::String(name) => Ok((db.to_string(), name.clone())),
            Bson::Document(d) => match (d.get_str("user"), d.get_str("db")) {
                (Ok(u), Ok(d)) => Ok((d.to_string(), u.to_string())),
                _ => Err(CommandError::bad_value(
                    "User name documents must contain string fields 'user' and 'db'",
                )),
            },
            _ => Err(CommandError::bad_value(
                "User names must be strings or {user, db} documents",
            )),
        }
    };
    match arg {
        Bson::Int32(1) | Bson::Int64(1) | Bson::Double(1.0) => Ok(Some(Vec::new())),
        Bson::Document(d) if matches!(d.get("forAllDBs"), Some(Bson::Boolean(true))) => Ok(None),
        Bson::Array(items) => items.iter().map(one).collect::<Result<_, _>>().map(Some),
        other => one(other).map(|u| Some(vec![u])),
    }
}

fn users_info(shared: &Shared, db: &str, body: &Document) -> Result<Document, CommandError> {
    let arg = body
        .get("usersInfo")
        .ok_or_else(|| CommandError::bad_value("usersInfo requires an argument"))?;
    let wanted = users_wanted(db, arg)?;
    let show_credentials = matches!(body.get("showCredentials"), Some(Bson::Boolean(true)));
    let users = lock(&shared.users);
    let mut out = Vec::new();
    for ((udb, name), user) in &users.users {
        let selected = match &wanted {
            None => true,
            Some(list) if list.is_empty() => udb == db,
            Some(list) => list.iter().any(|(d, n)| d == udb && n == name),
        };
        if !selected {
            continue;
        }
        let mechanisms: Vec<Bson> = user
            .credentials
            .keys()
            .map(|m| Bson::String(m.name().into()))
            .collect();
        let mut d = doc! {
            "_id": format!("{udb}.{name}"),
            "userId": Binary { subtype: BinarySubtype::Uuid, bytes: user.user_id.bytes().to_vec() },
            "user": name.clone(),
            "db": udb.clone(),
        };
        if let Some(c) = &user.custom_data {
            d.insert("customData", c.clone());
        }
        d.insert(
            "roles",
            user.roles
                .iter()
                .cloned()
                .map(Bson::Document)
                .collect::<Vec<_>>(),
        );
        if show_credentials {
            let mut creds = Document::new();
            for (m, c) in &user.credentials {
                creds.insert(m.name(), c.to_document());
            }
            d.insert("credentials", creds);
        }
        d.insert("mechanisms", mechanisms);
        out.push(Bson::Document(d));
    }
    Ok(doc! { "users": out, "ok": 1.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_flags_parse() {
        let u = UserConfig::parse("alice:s3cr:et").unwrap();
        assert_eq!(
            (u.db.as_str(), u.name.as_str(), u.password.as_str()),
            ("admin", "alice", "s3cr:et")
        );
        let u = UserConfig::parse("app.bob:pw").unwrap();
        assert_eq!((u.db.as_str(), u.name.as_str()), ("app", "bob"));
        for bad in ["alice", ":pw", "alice:", ".bob:pw", "app.:pw"] {
            assert!(UserConfig::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn roles_must_exist_on_their_database() {
        assert!(parse_roles("app", &bson::bson!(["readWrite"])).is_ok());
        let e = parse_roles("app", &bson::bson!(["root"])).unwrap_err();
        assert_eq!(e.code, codes::ROLE_NOT_FOUND);
        assert_eq!(e.errmsg, "Could not find role: root@app");
        assert!(parse_roles("app", &bson::bson!([{"role": "root", "db": "admin"}])).is_ok());
        assert!(parse_roles("app", &bson::bson!(["nope"])).is_err());
        assert!(parse_roles("app", &bson::bson!("read")).is_err());
    }

    #[test]
    fn users_info_arguments() {
        assert_eq!(users_wanted("d", &Bson::Int32(1)).unwrap(), Some(vec![]));
        assert_eq!(
            users_wanted("d", &Bson::String("u".into())).unwrap(),
            Some(vec![("d".into(), "u".into())])
        );
        assert_eq!(
            users_wanted("d", &bson::bson!([{"user": "u", "db": "x"}, "v"])).unwrap(),
            Some(vec![("x".into(), "u".into()), ("d".into(), "v".into())])
        );
        assert_eq!(
            users_wanted("d", &bson::bson!({"forAllDBs": true})).unwrap(),
            None
        );
        assert!(users_wanted("d", &Bson::Boolean(true)).is_err());
    }
}
