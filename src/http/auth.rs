//! Who a request is: its bearer token, found among the tokens in force, which a SIGHUP
//! re-reads from the tokens file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode, header};
use base64::Engine as _;

use super::error::problem;
use crate::config::{Grant, MAX_TOKEN_LEN, Role, Token, Tokens, TokensFileError};

/// The tokens a server takes: `--token` (one admin token) and the tokens file's.
#[derive(Debug)]
pub struct Credentials {
    current: RwLock<Arc<Tokens>>,
    file: Option<PathBuf>,
    admin: Option<Token>,
}

/// Why the tokens could not be set up at start-up.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("--tokens-file (KEYSPREAD_TOKENS_FILE): {0}")]
    File(#[from] TokensFileError),
    #[error("--tokens-file (KEYSPREAD_TOKENS_FILE) {path}: {reason}")]
    Unsafe { path: PathBuf, reason: String },
    #[error("--token (KEYSPREAD_TOKEN) and --tokens-file: {0}")]
    Admin(String),
}

impl Credentials {
    /// The tokens of `file` and `admin`; `None` when neither is given (then only loopback
    /// clients may change anything).
    pub fn load(
        file: Option<&Path>,
        admin: Option<&Token>,
    ) -> Result<Option<Credentials>, CredentialsError> {
        if file.is_none() && admin.is_none() {
            return Ok(None);
        }
        let credentials = Credentials {
            current: RwLock::default(),
            file: file.map(Path::to_owned),
            admin: admin.cloned(),
        };
        let tokens = credentials.read()?;
        *credentials.current.write().expect("tokens lock") = Arc::new(tokens);
        Ok(Some(credentials))
    }

    /// Reads the file again: the new set is in force for every request after this returns.
    /// On any error the set in force stays, and the error says why.
    pub fn reload(&self) -> Result<usize, CredentialsError> {
        let tokens = self.read()?;
        let count = tokens.len();
        *self.current.write().expect("tokens lock") = Arc::new(tokens);
        Ok(count)
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The names of the tokens in force (never the tokens).
    pub fn names(&self) -> Vec<String> {
        self.tokens().names().map(str::to_owned).collect()
    }

    fn tokens(&self) -> Arc<Tokens> {
        Arc::clone(&self.current.read().expect("tokens lock"))
    }

    fn read(&self) -> Result<Tokens, CredentialsError> {
        let mut tokens = Tokens::default();
        if let Some(path) = &self.file {
            check_mode(path)?;
            tokens = Tokens::load(path)?;
        }
        if let Some(admin) = &self.admin {
            tokens = tokens
                .with_admin_token(admin.expose())
                .map_err(CredentialsError::Admin)?;
        }
        Ok(tokens)
    }

    /// The grant of the request's token; else why there is none. `role` is what the
    /// request needs: it says so when refused, and a read may present its token as a
    /// browser's Basic password.
    pub fn authenticate(&self, headers: &HeaderMap, role: Role) -> Result<Grant, Refused> {
        let token = presented(headers, role)?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(unknown(
                role,
                &format!(
                    "the token is {} characters long, and no token of this server is longer \
                     than {MAX_TOKEN_LEN}",
                    token.len()
                ),
            ));
        }
        let tokens = self.tokens();
        let grant = tokens.find(&token).ok_or_else(|| {
            unknown(
                role,
                "the token in Authorization: Bearer is not one this server takes (wrong, or \
                 removed from the tokens file)",
            )
        })?;
        Ok(grant.clone())
    }
}

/// Why a request presents no grant (the answer boxed: refusals are the rare case).
#[derive(Debug)]
pub enum Refused {
    /// No token, or one this server does not take: 401, and a guess if it was one.
    Unknown(Box<Response<Body>>),
    /// An `Authorization` header no client sends (several, two tokens in one): 400.
    Malformed(Box<Response<Body>>),
}

impl Refused {
    /// The answer to send.
    pub fn into_answer(self) -> Response<Body> {
        match self {
            Refused::Unknown(answer) | Refused::Malformed(answer) => *answer,
        }
    }
}

/// Nothing when `grant` holds `role`; else the 403 that names the role needed.
#[allow(clippy::result_large_err)] // an answer, made only for refused requests
pub fn permit(grant: &Grant, role: Role) -> Result<(), Response<Body>> {
    if grant.roles.allow(role) {
        return Ok(());
    }
    Err(problem(
        StatusCode::FORBIDDEN,
        "forbidden",
        &format!(
            "this needs a token with the {role} role{}; the token {:?} has {}",
            if role == Role::Admin {
                ""
            } else {
                " (or admin)"
            },
            grant.name,
            grant.roles
        ),
    ))
}

/// A tokens file anyone but root and this server's user may write could grant them admin:
/// refused, as ssh refuses such keys. One anyone may read shows who holds which role: a warning.
#[cfg(unix)]
fn check_mode(path: &Path) -> Result<(), CredentialsError> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // reading it says why
    };
    let owner = std::os::unix::fs::MetadataExt::uid(&meta);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let us = unsafe { libc::geteuid() };
    if owner != 0 && owner != us {
        return Err(CredentialsError::Unsafe {
            path: path.to_owned(),
            reason: format!(
                "it belongs to uid {owner}, neither root nor this server's user (uid {us}), who \
                 could rewrite it and grant themselves any role; chown it"
            ),
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(CredentialsError::Unsafe {
            path: path.to_owned(),
            reason: format!(
                "its mode is {mode:04o}: users other than its owner may write it, and so grant \
                 themselves any role; chmod 600 it"
            ),
        });
    }
    if mode & 0o004 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{mode:04o}"),
            "the tokens file is readable by every user: it holds digests, not tokens, but \
             shows who holds which role; chmod 600 it"
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_mode(_: &Path) -> Result<(), CredentialsError> {
    Ok(())
}

/// The token the request presents: `Authorization: Bearer <token>`, or, for a read (a
/// browser asked for the page), `Basic` with the token as the password.
fn presented(headers: &HeaderMap, role: Role) -> Result<String, Refused> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(unknown(
            role,
            &format!("this needs a token with the {role} role: send Authorization: Bearer <token>"),
        ));
    };
    if values.next().is_some() {
        return Err(bad_authorization(
            "send one Authorization header, not several",
        ));
    }
    let value = value.to_str().map_err(|_| {
        bad_authorization("Authorization holds bytes a token never has (visible ASCII only)")
    })?;
    let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.trim().to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") && role == Role::Read {
        basic_password(rest.trim())
            .ok_or_else(|| bad_authorization("Authorization: Basic is not base64 of NAME:TOKEN"))?
    } else {
        return Err(unknown(role, "Authorization must be `Bearer <token>`"));
    };
    if token.is_empty() {
        return Err(unknown(role, "Authorization: Bearer carries no token"));
    }
    if token.contains(' ') {
        return Err(bad_authorization(
            "Authorization carries one bearer token, without spaces (two tokens in one header \
             are refused, not tried in turn)",
        ));
    }
    Ok(token)
}

fn basic_password(encoded: &str) -> Option<String> {
    if encoded.len() > 4 * MAX_TOKEN_LEN {
        return Some("x".repeat(MAX_TOKEN_LEN + 1));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_, password) = text.split_once(':')?;
    Some(password.to_owned())
}

/// 401, asking for a bearer token (and, for reads, offering browsers `Basic`).
pub fn unauthorized(role: Role, detail: &str) -> Response<Body> {
    let mut denied = problem(StatusCode::UNAUTHORIZED, "unauthorized", detail);
    let challenge = if role == Role::Read {
        "Bearer, Basic realm=\"keyspread\", charset=\"UTF-8\""
    } else {
        "Bearer"
    };
    denied.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        challenge.parse().expect("static header"),
    );
    denied
}

fn unknown(role: Role, detail: &str) -> Refused {
    Refused::Unknown(Box::new(unauthorized(role, detail)))
}

fn bad_authorization(detail: &str) -> Refused {
    Refused::Malformed(Box::new(problem(
        StatusCode::BAD_REQUEST,
        "bad-authorization",
        detail,
    )))
}
