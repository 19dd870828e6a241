//! Filling an empty database from a SQLite copy (`tally copy-to`, `crate::store::copy`).
//!
//! Contract: ONE transaction. It locks every table of [`TABLES`] (`ACCESS EXCLUSIVE`: no
//! collector reads or writes them meanwhile; refused after [`LOCK_WAIT_SECS`] of waiting),
//! refuses when any holds a row (a copy never merges into live data), then calls `ready` (the
//! SQLite side takes its own lock only now), fills them with binary `COPY` in [`TABLES`] order as the chunks
//! arrive, checks each table's count against the count SQLite sent, moves the identity
//! sequences of `site_keys` and `pages` past the copied ids (so the next site or page gets a
//! new id), and commits. Any error, or a reader that stops before the last table, rolls it
//! all back.

use bytes::BytesMut;
use futures_util::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::{PgStore, StoreError};
use crate::store::copy::{Chunk, Col, TABLES, Value, refused};

/// One SQLite value written as the PostgreSQL type of its column.
#[derive(Debug)]
struct Cell<'a>(&'a Value, Col);

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// A function, not a closure: it stays general over lifetimes inside the `Send` future.
fn cell<'a>((value, col): (&'a Value, &Col)) -> Cell<'a> {
    Cell(value, *col)
}

impl ToSql for Cell<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match (self.1, self.0) {
            (_, Value::Null) => Ok(IsNull::Yes),
            (Col::I64, Value::Int(v)) => v.to_sql(ty, out),
            (Col::I32, Value::Int(v)) => i32::try_from(*v)?.to_sql(ty, out),
            (Col::I16, Value::Int(v)) => i16::try_from(*v)?.to_sql(ty, out),
            (Col::Bool, Value::Int(v)) => (*v != 0).to_sql(ty, out),
            (Col::Text, Value::Text(s)) => s.as_str().to_sql(ty, out),
            (Col::Bytes, Value::Blob(b)) => b.as_slice().to_sql(ty, out),
            (Col::Uuid, Value::Blob(b)) => uuid::Uuid::from_slice(b)?.to_sql(ty, out),
            (col, v) => Err(format!("a {v:?} cannot be copied into a {col:?} column").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn pg_type(col: Col) -> Type {
    match col {
        Col::I64 => Type::INT8,
        Col::I32 => Type::INT4,
        Col::I16 => Type::INT2,
        Col::Bool => Type::BOOL,
        Col::Text => Type::TEXT,
        Col::Bytes => Type::BYTEA,
        Col::Uuid => Type::UUID,
    }
}

/// How long the copy waits for the PostgreSQL tables' locks.
const LOCK_WAIT_SECS: u32 = 10;

fn stopped_early() -> StoreError {
    StoreError::Unavailable("the SQLite reader stopped before the last table".into())
}

impl PgStore {
    /// Fill this (empty) database from `chunks` (see the module's contract); returns the rows
    /// copied per table.
    pub async fn load(
        &self,
        mut chunks: tokio::sync::mpsc::Receiver<Chunk>,
        ready: impl FnOnce(),
    ) -> Result<Vec<(&'static str, u64)>, StoreError> {
        let mut client = self.client().await.map_err(StoreError::from)?;
        let tx = client.transaction().await?;
        let names: Vec<&str> = TABLES.iter().map(|t| t.name()).collect();
        // Collectors running on this database hold locks on these tables: say so instead of
        // waiting for them forever.
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{LOCK_WAIT_SECS}s'; \
             LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            names.join(", ")
        ))
        .await
        .map_err(|e| {
            refused(format!(
                "the PostgreSQL tables could not be locked within {LOCK_WAIT_SECS} s (is a \
                 collector running on this database?): {e}"
            ))
        })?;
        let any = names
            .iter()
            .map(|n| format!("SELECT '{n}' FROM {n} HAVING count(*) > 0"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let holding: Vec<String> = tx
            .query(&any, &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !holding.is_empty() {
            return Err(refused(format!(
                "the PostgreSQL database is not empty ({} hold rows): copy into a new database \
                 or schema, never over live data",
                holding.join(", ")
            )));
        }
        ready();
        let mut copied = Vec::with_capacity(TABLES.len());
        let mut next = chunks.recv().await;
        for (i, table) in TABLES.iter().enumerate() {
            let types: Vec<Type> = table.cols.iter().map(|c| pg_type(*c)).collect();
            let sink = tx
                .copy_in(&format!("COPY {} FROM STDIN BINARY", table.pg))
                .await?;
            let writer = BinaryCopyInWriter::new(sink, &types);
            pin_mut!(writer);
            let expect = loop {
                let Some(chunk) = next.take() else {
                    return Err(stopped_early());
                };
                if chunk.table != i {
                    return Err(stopped_early());
                }
                for row in &chunk.rows {
                    // Also what keeps `write_raw` (which panics on a wrong count) safe.
                    if row.len() != table.cols.len() {
                        return Err(refused(format!(
                            "{}: SQLite gave {} columns, {} expected",
                            table.name(),
                            row.len(),
                            table.cols.len()
                        )));
                    }
                    let cells = row.iter().zip(table.cols).map(cell);
                    writer.as_mut().write_raw(cells).await?;
                }
                let end = chunk.end;
                next = chunks.recv().await;
                if let Some(expect) = end {
                    break expect;
                }
            };
            let rows = writer.finish().await?;
            if rows != expect {
                return Err(refused(format!(
                    "{}: {rows} rows copied, SQLite holds {expect} (a row whose page or site is \
                     missing cannot be keyed here); nothing was copied",
                    table.name()
                )));
            }
            copied.push((table.name(), rows));
        }
        for (table, column) in [
            ("site_keys", "id"),
            ("pages", "id"),
            ("dims", "id"),
            ("visitor_numbers", "num"),
        ] {
            tx.batch_execute(&format!(
                "SELECT setval(pg_get_serial_sequence('{table}', '{column}'), \
                 COALESCE(max({column}), 0) + 1, false) FROM {table}"
            ))
            .await?;
        }
        tx.batch_execute(
            "SELECT setval('segment_versions', COALESCE(max(version), 0) + 1, false) \
             FROM segments",
        )
        .await?;
        // Visitor numbers were stored: a collector's missing keys are missing no more.
        tx.batch_execute(crate::store::numbers::BUMP_GENERATION)
            .await?;
        tx.commit().await?;
        Ok(copied)
    }
}
