//! Country and region from a client address, for the agent dimensions
//! ([`crate::core::dims::AgentDims`]).
//!
//! Use: [`Geo::open`] the operator's file once (on the blocking pool); [`Geo::lookup`] per
//! visit, on any thread; [`Geo::refresh_if_changed`] from a timer (every 30 s or so, on the
//! blocking pool), logging the error it returns; [`Geo::is_dbip`] and
//! [`Geo::database_description`] for the dashboard.
//!
//! Contract:
//! - The database is a MaxMind DB file (`.mmdb`) the operator provides; none is bundled.
//!   `scripts/fetch-geoip.sh DIR` installs DB-IP's free country file (CC BY 4.0, which asks
//!   for a visible link to db-ip.com: [`Geo::is_dbip`], [`DBIP_ATTRIBUTION`]).
//! - Two record layouts are read: MaxMind's GeoIP2/GeoLite2 (`country.iso_code`, and
//!   `subdivisions[0].iso_code` in the City editions) and the flat DB-IP / ip-location-db lite
//!   layout (`country_code`). A record with neither is a miss.
//! - [`Geo::lookup`] canonicalises the address first (`::ffff:192.0.2.1` is `192.0.2.1`: the
//!   lite files do not alias IPv4-mapped addresses). A miss, a private or reserved address, an
//!   IPv6 address in an IPv4-only file and a record that does not decode are all `None`:
//!   never an error, never a panic, never a guess. The country is two ASCII letters,
//!   upper-cased (`ZZ` and `XX`, "unknown" in some files, are a miss); the region is ISO
//!   3166-2 (`US-MD`) when the file has a subdivision code, else empty.
//! - The address is neither logged nor kept: nothing in this module writes a log line.
//! - The file is read whole into memory (`Reader::open_readfile`: the memory-mapped reader is
//!   `unsafe`, which the workspace forbids): DB-IP's country file (8.2 MB) costs ~8.5 MB of
//!   memory and 12–50 ms to open; a lookup ~150 ns (IPv4) to ~200 ns (IPv6) in release builds. Opening and [`Geo::refresh_if_changed`] read the file: run them
//!   on the blocking pool.
//! - A replaced file is picked up without a restart: [`Geo::refresh_if_changed`] compares the
//!   file's modification time, length and inode with those of the file last tried, and loads
//!   a changed one; lookups meanwhile use the loaded reader (swapped whole, under a lock held
//!   only to clone an `Arc`). A changed file that does not load (missing, unreadable, not a
//!   MaxMind DB) leaves the loaded one in use and is reported once, until it changes again.
//!   Replace the file by renaming a complete one over it (as `fetch-geoip.sh` does): a file
//!   written in place can be read half-written, which then fails and waits for the next
//!   change.

use std::fs;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use maxminddb::{MaxMindDbError, Reader};
use serde::Deserialize;

/// The link DB-IP's licence (CC BY 4.0) asks every page showing its data to carry:
/// (text, address).
pub const DBIP_ATTRIBUTION: (&str, &str) = ("IP Geolocation by DB-IP", "https://db-ip.com");

/// Where an address is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// ISO 3166-1 alpha-2, upper-case ("DE").
    pub country: String,
    /// ISO 3166-2 ("US-MD") when the database has a subdivision code, else "".
    pub region: String,
}

/// Why a database could not be (re)loaded.
#[derive(Debug, thiserror::Error)]
pub enum GeoError {
    /// The file could not be read (missing, unreadable).
    #[error("GeoIP database {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a MaxMind DB file (or a damaged one).
    #[error("GeoIP database {path}: not a usable MaxMind DB file: {source}")]
    Database {
        path: PathBuf,
        source: MaxMindDbError,
    },
}

/// What identifies one version of the file at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Stamp {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode,
        }
    }
}

/// A loaded database.
struct Loaded {
    reader: Reader<Vec<u8>>,
    /// Whether the data is DB-IP's (its licence asks for a link).
    dbip: bool,
}

/// The parts of a record that are read; every other field is skipped.
#[derive(Deserialize)]
struct Record<'a> {
    /// MaxMind's layout.
    #[serde(borrow)]
    country: Option<Named<'a>>,
    /// DB-IP / ip-location-db's flat layout.
    #[serde(borrow)]
    country_code: Option<&'a str>,
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    iso_code: Option<&'a str>,
}

impl Loaded {
    fn read(path: &Path) -> Result<(Self, Stamp), GeoError> {
        let io = |source| GeoError::Io {
            path: path.to_owned(),
            source,
        };
        // The stamp of the very file read (not of the path a moment earlier or later).
        let mut file = fs::File::open(path).map_err(io)?;
        let stamp = Stamp::of(&file.metadata().map_err(io)?);
        let mut bytes = Vec::with_capacity(usize::try_from(stamp.len).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(io)?;
        let reader = Reader::from_source(bytes).map_err(|source| GeoError::Database {
            path: path.to_owned(),
            source,
        })?;
        let dbip = names_dbip(&reader, path);
        Ok((Loaded { reader, dbip }, stamp))
    }

    fn lookup(&self, ip: IpAddr) -> Option<Location> {
        if ip.is_ipv6() && self.reader.metadata().ip_version == 4 {
            return None;
        }
        let result = self.reader.lookup(ip).ok()?;
        let record: Record = result.decode().ok()??;
        let (code, maxmind) = match (record.country.and_then(|c| c.iso_code), record.country_code) {
            (Some(code), _) => (code, true),
            (None, Some(code)) => (code, false),
            (None, None) => return None,
        };
        let country = country_code(code)?;
        let region = if maxmind {
            result
                .decode_path::<&str>(&maxminddb::path!["subdivisions", 0, "iso_code"])
                .ok()
                .flatten()
                .and_then(subdivision_code)
                .map(|sub| format!("{country}-{sub}"))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Some(Location { country, region })
    }

    fn description(&self) -> String {
        let meta = self.reader.metadata();
        meta.description
            .get("en")
            .or_else(|| meta.description.values().next())
            .cloned()
            .unwrap_or_else(|| meta.database_type.clone())
    }
}

/// Whether a database is DB-IP's: its metadata says so (DB-IP's own files), or its file name
/// does (ip-location-db's repackaged `dbip-*.mmdb` carry no vendor in their metadata).
fn names_dbip(reader: &Reader<Vec<u8>>, path: &Path) -> bool {
    let meta = reader.metadata();
    let says = |text: &str| {
        let text = text.to_ascii_lowercase();
        text.contains("db-ip") || text.contains("dbip")
    };
    says(&meta.database_type)
        || meta.description.values().any(|d| says(d))
        || path.file_name().is_some_and(|n| says(&n.to_string_lossy()))
}

/// An ISO 3166-1 alpha-2 code, upper-cased; "unknown" placeholders are none.
fn country_code(code: &str) -> Option<String> {
    let code = code.to_ascii_uppercase();
    (code.len() == 2
        && code.bytes().all(|b| b.is_ascii_uppercase())
        && code != "ZZ"
        && code != "XX")
        .then_some(code)
}

/// The part of an ISO 3166-2 code after the country: 1 to 3 ASCII letters or digits.
fn subdivision_code(code: &str) -> Option<String> {
    (!code.is_empty() && code.len() <= 3 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| code.to_ascii_uppercase())
}

/// A location database, reloaded when its file is replaced. `Send + Sync`.
pub struct Geo {
    path: PathBuf,
    /// The database in use.
    loaded: RwLock<Arc<Loaded>>,
    /// The file last tried, loaded or not (`None`: it could not be looked at), so a bad file
    /// is reported once, not at every refresh.
    tried: Mutex<Option<Stamp>>,
}

impl std::fmt::Debug for Geo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Geo")
            .field("path", &self.path)
            .field("database", &self.database_description())
            .finish_non_exhaustive()
    }
}

impl Geo {
    /// Load the database at `path` (reads the whole file: blocking).
    pub fn open(path: impl Into<PathBuf>) -> Result<Geo, GeoError> {
        let path = path.into();
        let (loaded, stamp) = Loaded::read(&path)?;
        Ok(Geo {
            path,
            loaded: RwLock::new(Arc::new(loaded)),
            tried: Mutex::new(Some(stamp)),
        })
    }

    /// Where `ip` is, if the database knows (see the module's contract).
    pub fn lookup(&self, ip: IpAddr) -> Option<Location> {
        self.current().lookup(ip.to_canonical())
    }

    /// Load the file again if it changed since it was last tried: `Ok(true)` when a new
    /// database is now in use, `Ok(false)` when the file did not change, and the error when
    /// the changed file did not load (the previous database stays in use; the same file is
    /// not reported again). Blocking: reads the file when it changed.
    pub fn refresh_if_changed(&self) -> Result<bool, GeoError> {
        let mut tried = self.tried.lock().unwrap_or_else(PoisonError::into_inner);
        let now = fs::metadata(&self.path).map(|m| Stamp::of(&m));
        if now.as_ref().ok() == tried.as_ref() {
            return Ok(false);
        }
        if let Err(source) = now {
            *tried = None;
            return Err(GeoError::Io {
                path: self.path.clone(),
                source,
            });
        }
        match Loaded::read(&self.path) {
            Ok((loaded, stamp)) => {
                *tried = Some(stamp);
                *self.loaded.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(loaded);
                Ok(true)
            }
            Err(error) => {
                *tried = now.ok();
                Err(error)
            }
        }
    }

    /// The file this database is read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the loaded database says it is: its English description, else its type
    /// ("GeoLite2-Country", "country ipvAll").
    pub fn database_description(&self) -> String {
        self.current().description()
    }

    /// Whether the loaded database is DB-IP's, whose licence asks pages showing its data to
    /// link to db-ip.com ([`DBIP_ATTRIBUTION`]): its metadata names DB-IP, or its file name
    /// does (`dbip-country.mmdb`; the repackaged lite files name no vendor inside).
    pub fn is_dbip(&self) -> bool {
        self.current().dbip
    }

    fn current(&self) -> Arc<Loaded> {
        Arc::clone(&self.loaded.read().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests;
