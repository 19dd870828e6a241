//! Reading every table for `tally copy-to` (`crate::store::copy`).
//!
//! Contract: a [`Dump`] is a connection of its own holding SQLite's write lock (`BEGIN
//! IMMEDIATE`, waiting up to the busy timeout for a running writer's batch) from
//! [`Dump::open`] until it is dropped, which rolls back (it writes nothing). Its reads
//! are therefore one consistent state that no collector can change meanwhile. Rows are sent
//! in chunks of [`CHUNK_ROWS`], so memory stays bounded at any database size.

use rusqlite::types::ValueRef;

use super::*;
use crate::store::copy::{CHUNK_ROWS, Chunk, TABLES, Value};

/// SQLite's state under its write lock (see the module's contract).
pub struct Dump {
    conn: Connection,
}

impl Dump {
    /// Take the write lock of the database at `path` (opened by a [`SqliteStore`] first, so
    /// its schema is current) on a connection of its own, for a copy of every table.
    pub fn open(path: &Path) -> Result<Dump, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "temp_store", "FILE")?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        Ok(Dump { conn })
    }

    /// Send every table of [`TABLES`] to `out`, each followed by its end and expected count.
    /// Returns `false` when `out` was closed (the loader stopped: its error says why). After
    /// the last table's end nothing here can fail, or PostgreSQL would commit a copy this
    /// side reports as failed.
    pub fn read_all(&self, out: &tokio::sync::mpsc::Sender<Chunk>) -> Result<bool, StoreError> {
        for (i, table) in TABLES.iter().enumerate() {
            let mut stmt = self.conn.prepare(table.select)?;
            let width = stmt.column_count();
            let mut rows = stmt.query([])?;
            let mut chunk = Vec::with_capacity(CHUNK_ROWS);
            while let Some(row) = rows.next()? {
                let mut cells = Vec::with_capacity(width);
                for c in 0..width {
                    cells.push(value(row.get_ref(c)?));
                }
                chunk.push(cells);
                if chunk.len() == CHUNK_ROWS {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK_ROWS));
                    let sent = out.blocking_send(Chunk {
                        table: i,
                        rows: full,
                        end: None,
                    });
                    if sent.is_err() {
                        return Ok(false);
                    }
                }
            }
            let expect: i64 = self.conn.query_row(table.expect, [], |r| r.get(0))?;
            let end = Chunk {
                table: i,
                rows: chunk,
                end: Some(u64::try_from(expect).unwrap_or(0)),
            };
            if out.blocking_send(end).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Drop for Dump {
    fn drop(&mut self) {
        let _ = self.conn.execute_batch("ROLLBACK");
    }
}

fn value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        // No copied column is a float; kept exact if one ever is.
        ValueRef::Real(f) => Value::Text(f.to_string()),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}
