//! Reading inputs within bounds, and the reject file: lines of at most [`MAX_LINE_BYTES`]
//! whatever the input ([`LineCapped`]), and rejected lines with their number and reason, at
//! most [`MAX_REJECT_BYTES`] of them ([`Rejects`]).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;

/// Longest input line read; a longer one is rejected with its line number (`line too long`)
/// and its bytes are skipped as they are read, never kept.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;
/// The line a [`LineCapped`] reader gives in place of a longer one (a NUL starts no real row).
pub(crate) const TOO_LONG: &str = "\0tally: line too long";
/// Most bytes written to the reject file; rejects beyond are counted, and the file's last line
/// says how many were not written.
pub const MAX_REJECT_BYTES: u64 = 16 * 1024 * 1024;
/// Most bytes of one rejected line copied into the reject file.
pub const REJECT_LINE_BYTES: usize = 512;

/// A reader that passes lines of at most [`MAX_LINE_BYTES`] through and gives [`TOO_LONG`]
/// (one line, so line numbers stay right) for a longer one, whose bytes it reads and drops:
/// whatever the input, no line costs more memory than the cap.
pub(crate) struct LineCapped<R> {
    inner: R,
    line: Vec<u8>,
    at: usize,
}

impl<R: BufRead> LineCapped<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            line: Vec::new(),
            at: 0,
        }
    }

    /// Read the next line into `self.line` (empty at the end of the input).
    fn next_line(&mut self) -> std::io::Result<()> {
        self.line.clear();
        self.at = 0;
        let mut too_long = false;
        loop {
            let chunk = self.inner.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !too_long {
                if self.line.len() + take > MAX_LINE_BYTES + 1 {
                    too_long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&chunk[..take]);
                }
            }
            self.inner.consume(take);
            if done {
                break;
            }
        }
        if too_long {
            self.line.clear();
            self.line.extend_from_slice(TOO_LONG.as_bytes());
            self.line.push(b'\n');
        }
        Ok(())
    }
}

impl<R: BufRead> std::io::Read for LineCapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.line.len() {
            self.next_line()?;
        }
        let n = buf.len().min(self.line.len() - self.at);
        buf[..n].copy_from_slice(&self.line[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for LineCapped<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.at >= self.line.len() {
            self.next_line()?;
        }
        Ok(&self.line[self.at..])
    }

    fn consume(&mut self, amount: usize) {
        self.at = (self.at + amount).min(self.line.len());
    }
}

/// The reject file, opened on the first rejected line; at most [`MAX_REJECT_BYTES`].
pub(crate) struct Rejects {
    path: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
    /// Bytes written so far.
    written: u64,
    /// Rejected lines not written (the file was full).
    unwritten: u64,
    pub count: u64,
}

impl Rejects {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            written: 0,
            unwritten: 0,
            count: 0,
        }
    }

    pub(crate) fn write(&mut self, line_no: u64, reason: &str, line: &str) -> anyhow::Result<()> {
        self.count += 1;
        if self.file.is_none() {
            let f = std::fs::File::create(&self.path)
                .with_context(|| format!("cannot create {}", self.path.display()))?;
            self.file = Some(std::io::BufWriter::new(f));
        }
        let (reason, line) = if line.trim_end() == TOO_LONG {
            (format!("line longer than {MAX_LINE_BYTES} bytes"), "")
        } else {
            (reason.to_owned(), line)
        };
        let line = line.trim_end_matches(['\r', '\n']);
        let cut = crate::core::ids::truncate(line, REJECT_LINE_BYTES);
        let more = if cut.len() < line.len() { " …" } else { "" };
        let text = format!(
            "{line_no}\t{reason}\t{}{more}\n",
            cut.replace(['\t', '\0'], " ")
        );
        if self.written + text.len() as u64 > MAX_REJECT_BYTES {
            self.unwritten += 1;
            return Ok(());
        }
        if let Some(f) = &mut self.file {
            f.write_all(text.as_bytes())?;
            self.written += text.len() as u64;
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(f) = &mut self.file {
            if self.unwritten > 0 {
                writeln!(
                    f,
                    "-\tnot written\t{} more rejected lines (the reject file stops at {} MiB)",
                    self.unwritten,
                    MAX_REJECT_BYTES / (1024 * 1024)
                )?;
            }
            f.flush()?;
        }
        Ok(())
    }
}
