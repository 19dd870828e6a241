//! `tally backup` on PostgreSQL: a consistent logical copy of Tally's schema by `pg_dump`.
//!
//! Contract:
//! - The copy is `pg_dump --format=custom` of the one schema the store uses (its
//!   `current_schema()`, so a `search_path` in the URL is honoured): every table, the
//!   migration record and the identity sequences, read in ONE snapshot, so it is consistent
//!   while collectors keep counting (every hit acknowledged before the dump began is in it).
//! - The password never appears on a command line: it goes to `pg_dump` as `PGPASSWORD`, and
//!   the commands printed show the URL without it.
//! - The file is never overwritten; a failed dump leaves no file behind.
//! - Without `pg_dump` installed the error says which package and which exact command.
//!   Restoring is `pg_restore` (printed after the dump): [`restore_command`].

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::store::postgres::PgStore;

/// What a backup wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBackup {
    pub schema: String,
    pub bytes: u64,
    /// The command that restores the file (password left out).
    pub restore: String,
}

/// `url` without its password, and the password.
fn split_password(url: &str) -> anyhow::Result<(String, Option<String>)> {
    let mut parsed = url::Url::parse(url).context("the database URL does not parse")?;
    let password = parsed.password().map(|p| {
        percent_encoding::percent_decode_str(p)
            .decode_utf8_lossy()
            .into_owned()
    });
    if password.is_some() {
        parsed
            .set_password(None)
            .map_err(|()| anyhow::anyhow!("cannot take the password out of the URL"))?;
    }
    Ok((parsed.to_string(), password))
}

/// Shell-quote one argument for a command shown to the operator.
fn quote(arg: &str) -> String {
    if arg
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn dump_args(url: &str, schema: &str, file: &Path) -> Vec<String> {
    vec![
        "--format=custom".into(),
        "--no-owner".into(),
        format!("--schema={schema}"),
        format!("--file={}", file.display()),
        format!("--dbname={url}"),
    ]
}

/// The command that restores `file` into the database at `url` (its schema must not exist,
/// or add `--clean --if-exists` to replace it; stop every `tally` process first).
pub fn restore_command(url: &str, file: &Path) -> anyhow::Result<String> {
    let (url, _) = split_password(url)?;
    Ok(format!(
        "pg_restore --no-owner --exit-on-error --dbname={} {}",
        quote(&url),
        quote(&file.display().to_string())
    ))
}

/// Dump the schema of `store` (opened from `url`) to `file` (see the module doc).
pub async fn postgres(store: &PgStore, url: &str, file: &Path) -> anyhow::Result<PgBackup> {
    anyhow::ensure!(
        !file.exists(),
        "{} exists; a backup never overwrites a file",
        file.display()
    );
    let schema = store.current_schema().await?;
    let (bare, password) = split_password(url)?;
    let args = dump_args(&bare, &schema, file);
    let shown = format!(
        "pg_dump {}",
        args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
    );
    let mut command = Command::new("pg_dump");
    command.args(&args);
    if let Some(password) = password {
        command.env("PGPASSWORD", password);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .context("the pg_dump task failed")?;
    let output = match output {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "pg_dump is not installed (Debian/Ubuntu: apt-get install postgresql-client, the \
             server's major version or newer); then run: {shown}"
        ),
        Err(e) => return Err(e).context("cannot run pg_dump"),
    };
    if !output.status.success() {
        let _ = std::fs::remove_file(file);
        anyhow::bail!(
            "pg_dump failed ({}): {}\nthe command was: {shown}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let bytes = std::fs::metadata(file)
        .with_context(|| format!("pg_dump wrote no {}", file.display()))?
        .len();
    Ok(PgBackup {
        schema,
        bytes,
        restore: restore_command(url, file)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_leaves_the_url_and_arguments_are_quoted() {
        let (url, password) =
            split_password("postgres://tally:s%40cret@db.example:5432/tally?sslmode=require")
                .expect("url");
        assert_eq!(
            url,
            "postgres://tally@db.example:5432/tally?sslmode=require"
        );
        assert_eq!(password.as_deref(), Some("s@cret"));
        let (url, password) = split_password("postgres://postgres@127.0.0.1/test").expect("url");
        assert_eq!(url, "postgres://postgres@127.0.0.1/test");
        assert_eq!(password, None);
        assert_eq!(quote("/var/backups/tally.dump"), "/var/backups/tally.dump");
        assert_eq!(quote("it's here"), r"'it'\''s here'");
        let restore = restore_command(
            "postgres://u:pw@h/db?options=-csearch_path%3Dx",
            Path::new("b.dump"),
        )
        .expect("restore");
        assert!(!restore.contains("pw"), "{restore}");
        assert!(restore.starts_with("pg_restore "), "{restore}");
    }
}
