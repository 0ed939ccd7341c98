//! The few SQLite C calls start-up and snapshots need to read every assignment quickly.
//!
//! sqlx copies each row into owned values on its connection thread and hands it to ours,
//! about a microsecond a row; stepping a statement on the connection directly costs a
//! fraction of that, and start-up at a million accounts is mostly this one read.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::ptr::NonNull;

use libsqlite3_sys as ffi;
use sqlx::sqlite::LockedSqliteHandle;

use super::{Result, StoreError};

/// A prepared statement on a connection this thread holds locked.
pub struct Statement<'conn> {
    db: NonNull<ffi::sqlite3>,
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// The statement must not outlive the lock on its connection.
    _conn: PhantomData<&'conn mut ()>,
}

impl<'conn> Statement<'conn> {
    pub fn prepare(handle: &'conn mut LockedSqliteHandle<'_>, sql: &str) -> Result<Self> {
        let db = handle.as_raw_handle();
        let mut stmt = std::ptr::null_mut();
        let len = c_int::try_from(sql.len()).expect("statement text fits in an int");
        // SAFETY: `db` is an open connection no other thread uses while `handle` is held,
        // and `sql` is valid for `len` bytes.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(
                db.as_ptr(),
                sql.as_ptr().cast(),
                len,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        match NonNull::new(stmt) {
            Some(stmt) if rc == ffi::SQLITE_OK => Ok(Statement {
                db,
                stmt,
                _conn: PhantomData,
            }),
            _ => Err(error(db)),
        }
    }

    /// Binds text to parameter `i` (from 1); SQLite copies it.
    pub fn bind_text(&mut self, i: c_int, value: &str) -> Result<()> {
        let len = c_int::try_from(value.len()).expect("a parameter fits in an int");
        // SAFETY: `stmt` is live; SQLITE_TRANSIENT makes SQLite copy the bytes before this
        // returns, so `value` need not outlive the call.
        let rc = unsafe {
            ffi::sqlite3_bind_text(
                self.stmt.as_ptr(),
                i,
                value.as_ptr().cast(),
                len,
                ffi::SQLITE_TRANSIENT(),
            )
        };
        self.bound(rc)
    }

    /// Binds an integer to parameter `i` (from 1).
    pub fn bind_int(&mut self, i: c_int, value: i64) -> Result<()> {
        // SAFETY: `stmt` is a live statement.
        let rc = unsafe { ffi::sqlite3_bind_int64(self.stmt.as_ptr(), i, value) };
        self.bound(rc)
    }

    fn bound(&self, rc: c_int) -> Result<()> {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(error(self.db))
        }
    }

    /// Whether column `i` of the current row is NULL.
    pub fn is_null(&self, i: c_int) -> bool {
        // SAFETY: as for `bytes`.
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), i) == ffi::SQLITE_NULL }
    }

    /// Moves to the next row; false once there is none.
    pub fn step(&mut self) -> Result<bool> {
        // SAFETY: `stmt` is a live statement of a connection this thread holds.
        match unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            _ => Err(error(self.db)),
        }
    }

    /// Column `i` of the current row as bytes (empty for NULL), valid until the next step.
    pub fn bytes(&self, i: c_int) -> &[u8] {
        // SAFETY: the current row's value stays valid until the statement steps or is
        // finalized, which needs `&mut self`; SQLite answers its length in bytes. Asking
        // for the blob converts nothing (unlike asking for text after the length).
        unsafe {
            let ptr = ffi::sqlite3_column_blob(self.stmt.as_ptr(), i);
            let len = ffi::sqlite3_column_bytes(self.stmt.as_ptr(), i);
            if ptr.is_null() || len <= 0 {
                &[]
            } else {
                std::slice::from_raw_parts(ptr.cast::<u8>(), len as usize)
            }
        }
    }

    /// Column `i` of the current row as text.
    pub fn text(&self, i: c_int) -> Result<&str> {
        std::str::from_utf8(self.bytes(i))
            .map_err(|_| StoreError::Corrupt(format!("column {i} is not UTF-8")))
    }

    /// Column `i` of the current row as an integer.
    pub fn int(&self, i: c_int) -> i64 {
        // SAFETY: as for `bytes`.
        unsafe { ffi::sqlite3_column_int64(self.stmt.as_ptr(), i) }
    }
}

impl Drop for Statement<'_> {
    fn drop(&mut self) {
        // SAFETY: `stmt` was prepared on this connection and is finalized once.
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// Whether the connection is outside any transaction (SQLite's autocommit mode).
pub fn autocommit(handle: &mut LockedSqliteHandle<'_>) -> bool {
    // SAFETY: the handle is an open connection this thread holds locked.
    unsafe { ffi::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) != 0 }
}

/// The connection's last error.
fn error(db: NonNull<ffi::sqlite3>) -> StoreError {
    // SAFETY: SQLite answers a NUL-terminated message owned by the connection, which we
    // copy before anything else runs on it.
    let message = unsafe {
        let ptr = ffi::sqlite3_errmsg(db.as_ptr());
        if ptr.is_null() {
            "unknown error".to_owned()
        } else {
            std::ffi::CStr::from_ptr(ptr).to_string_lossy().into_owned()
        }
    };
    StoreError::Read(message)
}
