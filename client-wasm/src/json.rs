//! A deliberately tiny JSON writer for the wire types, built on serde.
//!
//! Contract:
//! - [`to_string`] writes any value made of structs, strings, integers, booleans, options and
//!   unit enum variants as compact JSON (no whitespace, non-ASCII passed through as UTF-8,
//!   control characters escaped), byte for byte as `serde_json::to_string` would. Floats,
//!   byte arrays, maps, sequences and data-carrying enum variants are refused with [`Error`]:
//!   the wire types the client sends use none of them. Nothing here panics.
//! - The client reads no JSON: the one answer it looks into (the counts for in-page
//!   counters) is handed to the browser's own `JSON.parse` in `js/host.js`.
//!
//! Why not `serde_json`: it adds ~36 KB to the WebAssembly module, more than four times the
//! whole size budget (see ARCHITECTURE.md, "The browser client"). The serde derives of `tally-wire` stay
//! the one definition of the format; only the byte-level encoder is ours.

use serde::ser::{self, Impossible, Serialize};
use std::fmt;

/// A value the writer does not support. Carries no text: the client never shows it to anyone,
/// and formatting machinery costs bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid JSON")
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Error
    }
}

/// Serialises `value` as compact JSON.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    let mut out = String::new();
    value.serialize(Writer { out: &mut out })?;
    Ok(out)
}

/// Appends the decimal form of `n` (no `format!`: it would pull in `core::fmt`'s integer code).
pub fn push_u64(out: &mut String, mut n: u64) {
    // Index loops: iterator adapters cost several times more WebAssembly here.
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while i < buf.len() {
        out.push(char::from(buf[i]));
        i += 1;
    }
}

/// Appends `s` as a JSON string literal, quotes included.
pub fn push_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    // Byte by byte: only ASCII bytes are ever escaped, so every cut below is at a char
    // boundary and the runs in between (UTF-8 included) are copied as they are.
    let b = s.as_bytes();
    let (mut run, mut i) = (0, 0);
    while i < b.len() {
        let c = b[i];
        let short = match c {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            8 => "\\b",
            12 => "\\f",
            0..=31 => "\\u00",
            _ => "",
        };
        if !short.is_empty() {
            out.push_str(&s[run..i]);
            out.push_str(short);
            if short.len() > 2 {
                out.push(char::from(HEX[usize::from(c >> 4)]));
                out.push(char::from(HEX[usize::from(c & 15)]));
            }
            run = i + 1;
        }
        i += 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

struct Writer<'a> {
    out: &'a mut String,
}

/// The `{...}` being written by [`Writer::serialize_struct`].
struct Fields<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> ser::Serializer for Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        if v < 0 {
            self.out.push('-');
        }
        push_u64(self.out, v.unsigned_abs());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        push_u64(self.out, v);
        Ok(())
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Error> {
        Err(Error)
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Error> {
        Err(Error)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        push_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Error> {
        Err(Error)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Error> {
        Err(Error)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(Error)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(Error)
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(Error)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(Error)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(Error)
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        self.out.push('{');
        Ok(Fields {
            out: self.out,
            first: true,
        })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(Error)
    }
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        push_str(self.out, key);
        self.out.push(':');
        value.serialize(Writer { out: self.out })
    }

    fn end(self) -> Result<(), Error> {
        self.out.push('}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_wire::{Hit, HitResponse, Status};

    fn hit() -> Hit {
        Hit {
            site: "blog".into(),
            kind: "pageview".into(),
            event_id: "0190b2a0-0000-7000-8000-000000000000".into(),
            visitor_id: None,
            url: "https://a.example/p?q=\"x\"\n\u{1f}\u{7f}".into(),
            referrer: Some("https://b.example/é😀".into()),
            name: None,
            dedupe: None,
        }
    }

    #[test]
    fn hit_is_written_as_the_wire_format_says() {
        let json = to_string(&hit()).expect("writes");
        assert_eq!(
            json,
            "{\"site\":\"blog\",\"type\":\"pageview\",\"event_id\":\"0190b2a0-0000-7000-8000-000000000000\",\"visitor_id\":null,\"url\":\"https://a.example/p?q=\\\"x\\\"\\n\\u001f\u{7f}\",\"referrer\":\"https://b.example/é😀\"}"
        );
    }

    #[test]
    fn output_matches_serde_json_for_every_hit_shape() {
        let mut h = hit();
        assert_eq!(
            to_string(&h),
            Ok(serde_json::to_string(&h).expect("serde_json"))
        );
        h.kind = "event".into();
        h.name = Some("sign\u{1}up\\\t\r".into());
        h.dedupe = Some("user_42".into());
        h.visitor_id = Some("v".into());
        let ours = to_string(&h).expect("writes");
        assert_eq!(ours, serde_json::to_string(&h).expect("serde_json"));
        assert_eq!(serde_json::from_str::<Hit>(&ours).expect("reads back"), h);
    }

    #[test]
    fn other_shapes() {
        let r = HitResponse {
            status: Status::Duplicate,
            counts: None,
        };
        assert_eq!(to_string(&r).as_deref(), Ok(r#"{"status":"duplicate"}"#));
        assert_eq!(to_string(&-5i32).as_deref(), Ok("-5"));
        assert_eq!(to_string(&true).as_deref(), Ok("true"));
        assert_eq!(to_string(&'x').as_deref(), Ok("\"x\""));
        assert_eq!(to_string(&1.5f64), Err(Error));
        assert_eq!(to_string(&vec![1u8]), Err(Error));
    }

    #[test]
    fn decimal_formatting() {
        let mut s = String::new();
        push_u64(&mut s, 0);
        s.push(' ');
        push_u64(&mut s, 1_234_567_890);
        s.push(' ');
        push_u64(&mut s, u64::MAX);
        assert_eq!(s, "0 1234567890 18446744073709551615");
    }
}
