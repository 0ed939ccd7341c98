//! Who may do what: roles, and the tokens file that grants them.
//!
//! A tokens file has one token a line, `NAME ROLE[,ROLE…] sha256:HEX`, blank lines and `#`
//! comments allowed. Only the SHA-256 digest of each token is stored, so the file can be
//! read by more people than the tokens themselves; a token is found by its digest, compared
//! with every line's in constant time.

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What a token may do. Every role reads; `admin` does everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Every `GET` but `/metrics`.
    Read,
    /// Reads, and allocates keys (one or a batch).
    Produce,
    /// Reads, and a consumer worker's calls: join/heartbeat/leave, checkpoints, load reports.
    Consume,
    /// Everything: releases, reweights, rebalances, streams.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Read, Role::Produce, Role::Consume, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Produce => "produce",
            Role::Consume => "consume",
            Role::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}: a role is read, produce, consume or admin"))
    }
}

/// The roles one token holds.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Roles(u8);

impl Roles {
    pub fn of(roles: &[Role]) -> Roles {
        Roles(roles.iter().fold(0, |bits, role| bits | role.bit()))
    }

    /// Whether these roles grant what `needed` names: every role reads, admin does all.
    pub fn allow(self, needed: Role) -> bool {
        self.0 & (Role::Admin.bit() | needed.bit()) != 0 || (needed == Role::Read && self.0 != 0)
    }

    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.0 & r.bit() != 0)
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Role::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// A token the server knows: its name (what the event log records), its roles, and the
/// SHA-256 of the token itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    pub roles: Roles,
    digest: [u8; 32],
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("name", &self.name)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// The longest token looked up: longer ones are refused unhashed.
pub const MAX_TOKEN_LEN: usize = 512;
/// The longest name a token may have.
pub const MAX_NAME_LEN: usize = 64;
/// Names the server writes in the log itself; no token may take one.
pub const RESERVED_NAMES: [&str; 6] = [
    "loopback",
    "controller",
    "import",
    "config",
    "unrecorded",
    "kinesis",
];
/// The name `--token` goes by; no line of a tokens file may take it.
pub const ADMIN_TOKEN_NAME: &str = "admin";

/// Every token the server takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    grants: Vec<Grant>,
}

/// Why a tokens file is refused: the line, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    pub line: usize,
    pub reason: String,
}

/// Why a tokens file could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TokensFileError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tokens file {path}, {source} (each line is `NAME ROLE[,ROLE…] sha256:HEX`)")]
    Line { path: PathBuf, source: LineError },
}

impl Tokens {
    /// Parses a tokens file's text.
    pub fn parse(text: &str) -> Result<Tokens, LineError> {
        let mut tokens = Tokens::default();
        // The byte order mark Windows editors write; `lines` drops their `\r` already.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (number, line) in text.lines().enumerate() {
            let line_error = |reason: String| LineError {
                line: number + 1,
                reason,
            };
            let content = line.split_once('#').map_or(line, |(before, _)| before);
            let fields: Vec<&str> = content.split_whitespace().collect();
            let grant = match fields[..] {
                [] => continue,
                [name, roles, digest] => {
                    let name = check_name(name).map_err(line_error)?;
                    let roles = parse_roles(roles).map_err(line_error)?;
                    let digest = parse_digest(digest).map_err(line_error)?;
                    Grant {
                        name,
                        roles,
                        digest,
                    }
                }
                _ => {
                    let n = fields.len();
                    return Err(line_error(format!(
                        "{n} field{} where 3 are expected (a name has no spaces)",
                        if n == 1 { "" } else { "s" }
                    )));
                }
            };
            tokens.add(grant).map_err(line_error)?;
        }
        Ok(tokens)
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Tokens, TokensFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Tokens::parse(&text).map_err(|source| TokensFileError::Line {
            path: path.to_owned(),
            source,
        })
    }

    /// Adds `--token`: one admin token named `admin`.
    pub fn with_admin_token(mut self, token: &str) -> Result<Tokens, String> {
        self.add(Grant {
            name: ADMIN_TOKEN_NAME.to_owned(),
            roles: Roles::of(&[Role::Admin]),
            digest: digest(token),
        })?;
        Ok(self)
    }

    fn add(&mut self, grant: Grant) -> Result<(), String> {
        // Without case: the log must tell its actors apart however it is read.
        if let Some(taken) = self
            .grants
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(&grant.name))
        {
            return Err(if taken.name == grant.name {
                format!("the name {:?} is given twice", grant.name)
            } else {
                format!(
                    "the name {:?} is {:?} again (names are compared without case)",
                    grant.name, taken.name
                )
            });
        }
        if self.grants.iter().any(|g| g.digest == grant.digest) {
            return Err(format!(
                "{:?} has the same token as {:?}: give each its own",
                grant.name,
                self.grants
                    .iter()
                    .find(|g| g.digest == grant.digest)
                    .unwrap()
                    .name
            ));
        }
        self.grants.push(grant);
        Ok(())
    }

    /// The grant of `token`, if any. Its digest is compared with every line's, whole, so the
    /// time taken says nothing about which line nor how much of one matched.
    pub fn find(&self, token: &str) -> Option<&Grant> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let given = digest(token);
        let mut found = None;
        for grant in &self.grants {
            if same_digest(&given, &grant.digest) {
                found = Some(grant);
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.grants.iter().map(|g| g.name.as_str())
    }
}

/// The SHA-256 of a token.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A tokens file line for `token`: what `keyspread token new` prints.
pub fn line(name: &str, roles: Roles, token: &str) -> String {
    let hex: String = digest(token).iter().map(|b| format!("{b:02x}")).collect();
    format!("{name} {roles} sha256:{hex}")
}

fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A token's name: what the event log records as the actor. Neither the server's own names
/// nor `--token`'s.
pub fn check_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "a name is 1 to {MAX_NAME_LEN} characters, not {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@')))
    {
        return Err(format!(
            "the name {:?} has {bad:?}: a name is letters, digits, '-', '_', '.' and '@'",
            name.escape_debug().to_string()
        ));
    }
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "the name {name:?} is the server's own in the event log ({}, in any case): choose another",
            RESERVED_NAMES.join(", ")
        ));
    }
    // Refused even without `--token` today: the log's past `admin` changes are its holder's.
    if name.eq_ignore_ascii_case(ADMIN_TOKEN_NAME) {
        return Err(format!(
            "the name {name:?} is --token's (KEYSPREAD_TOKEN) in the event log, in any case: \
             choose another (the second field grants the admin role)"
        ));
    }
    Ok(name.to_owned())
}

/// `read`, or several roles joined by commas: `produce,consume`.
pub fn parse_roles(text: &str) -> Result<Roles, String> {
    let roles = text
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<Role>, String>>()?;
    Ok(Roles::of(&roles))
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let hex = text.strip_prefix("sha256:").ok_or_else(|| {
        "the third field is `sha256:` and the token's digest in hex (the token itself is \
         never written here: `keyspread token new` prints the line)"
            .to_owned()
    })?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "a SHA-256 digest is 64 hex digits, not {} characters",
            hex.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-token-of-producers";

    #[test]
    fn a_token_is_found_by_its_digest_with_its_roles() {
        let text = format!(
            "# producers\n\n{}\n{}  # the fleet\n",
            line("producers", Roles::of(&[Role::Produce]), TOKEN),
            line(
                "workers",
                Roles::of(&[Role::Consume, Role::Read]),
                "another-token-0123456789"
            ),
        );
        let tokens = Tokens::parse(&text).unwrap();
        assert_eq!(tokens.len(), 2);
        let grant = tokens.find(TOKEN).unwrap();
        assert_eq!(grant.name, "producers");
        assert!(grant.roles.allow(Role::Produce) && grant.roles.allow(Role::Read));
        assert!(!grant.roles.allow(Role::Admin) && !grant.roles.allow(Role::Consume));
        assert_eq!(
            tokens.find("another-token-0123456789").unwrap().name,
            "workers"
        );
        assert!(tokens.find("s3cr3t-token-of-producer").is_none());
        assert!(tokens.find(&"x".repeat(10_000)).is_none());
        assert!(!format!("{tokens:?}").contains(&format!("{:x?}", digest(TOKEN)[0])));
    }

    #[test]
    fn admin_allows_everything_and_every_role_reads() {
        for role in Role::ALL {
            assert!(Roles::of(&[role]).allow(Role::Read), "{role}");
            assert!(Roles::of(&[Role::Admin]).allow(role), "{role}");
        }
        assert!(!Roles::of(&[]).allow(Role::Read));
        assert!(!Roles::of(&[Role::Consume]).allow(Role::Produce));
        assert_eq!(
            Roles::of(&[Role::Consume, Role::Produce]).to_string(),
            "produce,consume"
        );
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number_and_never_its_digest() {
        let good = line("ok", Roles::of(&[Role::Read]), TOKEN);
        let cases = [
            ("a b read sha256:00", "line 2: 4 fields"),
            ("ops reader sha256:00", "line 2: unknown role \"reader\""),
            ("ops read 0123", "line 2: the third field is `sha256:`"),
            (
                "ops read sha256:abc",
                "line 2: a SHA-256 digest is 64 hex digits",
            ),
            ("loopback read sha256:", "line 2: the name \"loopback\""),
            (
                "admin read sha256:",
                "line 2: the name \"admin\" is --token's",
            ),
            (
                "ADMIN admin sha256:",
                "line 2: the name \"ADMIN\" is --token's",
            ),
            ("ops/1 read sha256:", "line 2: the name \"ops/1\" has '/'"),
        ];
        for (bad, said) in cases {
            let error = Tokens::parse(&format!("{good}\n{bad}\n")).unwrap_err();
            assert!(error.to_string().starts_with(said), "{bad}: {error}");
        }
        let twice = Tokens::parse(&format!("{good}\n{good}\n")).unwrap_err();
        assert_eq!(twice.line, 2);
        let same = good.replacen("ok", "other", 1);
        let error = Tokens::parse(&format!("{good}\n{same}\n")).unwrap_err();
        assert!(error.reason.contains("same token"), "{error}");
        assert!(!error.reason.contains("sha256"), "{error}");
    }

    /// Notepad saves UTF-8 with a byte order mark and CRLF line ends: the same tokens.
    #[test]
    fn a_file_saved_on_windows_reads_the_same() {
        let text = format!(
            "# fleet\n{}\n",
            line("producers", Roles::of(&[Role::Produce]), TOKEN)
        );
        let windows = format!("\u{feff}{}", text.replace('\n', "\r\n"));
        assert_eq!(Tokens::parse(&windows), Tokens::parse(&text));
        assert_eq!(Tokens::parse(&windows).unwrap().len(), 1);
    }

    /// The log could not tell `Loopback` from the server's own `loopback` when read by a
    /// person or a case-blind search, nor `Ops` from `ops`.
    #[test]
    fn names_differing_only_in_case_are_refused() {
        for reserved in RESERVED_NAMES {
            let upper = reserved.to_ascii_uppercase();
            assert!(check_name(&upper).is_err(), "{upper}");
            let title = format!("{}{}", &reserved[..1].to_ascii_uppercase(), &reserved[1..]);
            assert!(check_name(&title).is_err(), "{title}");
        }
        let ops = line("ops", Roles::of(&[Role::Admin]), TOKEN);
        let other = line("Ops", Roles::of(&[Role::Read]), "another-token-0123456789");
        let error = Tokens::parse(&format!("{ops}\n{other}\n")).unwrap_err();
        assert_eq!(error.line, 2, "{error}");
        let admin = line("Admin", Roles::of(&[Role::Read]), "x".repeat(16).as_str());
        assert_eq!(Tokens::parse(&admin).unwrap_err().line, 1);
    }

    #[test]
    fn the_admin_token_is_one_more_grant_named_admin() {
        let tokens = Tokens::default().with_admin_token(TOKEN).unwrap();
        let grant = tokens.find(TOKEN).unwrap();
        assert_eq!(grant.name, ADMIN_TOKEN_NAME);
        assert!(grant.roles.allow(Role::Admin));
    }

    /// `admin` in the log is `--token`'s holder: a line of the file may not pass for it,
    /// whether or not the server has `--token` today.
    #[test]
    fn a_line_named_admin_is_refused_with_its_number() {
        let ok = line("ok", Roles::of(&[Role::Read]), TOKEN);
        let admin = line("admin", Roles::of(&[Role::Admin]), "x".repeat(16).as_str());
        let error = Tokens::parse(&format!("# fleet\n{ok}\n{admin}\n")).unwrap_err();
        assert_eq!(error.line, 3, "{error}");
        assert!(error.reason.contains("--token"), "{error}");
        assert!(check_name("admin").is_err() && check_name("aDmin").is_err());
    }
}
