//! How an item's fields are laid out: written one after another with postcard, each record
//! (an item, a capability in a profile) behind its length, and read back by a reader that knows
//! which version of the record it holds and which version it knows itself.
//!
//! That is the whole compatibility rule in code: a field a newer version appended is read only
//! when the record has it ([`Fields::since`]), and whatever a newer version wrote after the
//! fields this sidecar knows is skipped ([`Fields::finish`]); the length prefix says where the
//! record ends, so the next one is read all the same.

use serde::{Deserialize, Serialize};

use super::WireError;

/// Builds one datagram's (or one item's) bytes.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    out: Vec<u8>,
}

impl Writer {
    /// Appends one field.
    pub(crate) fn put<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WireError> {
        let out = std::mem::take(&mut self.out);
        self.out = postcard::to_extend(value, out)?;
        Ok(())
    }

    /// Appends bytes as they are (an item's kind and version).
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Appends a record behind its length (a varint), so a reader can skip the part it does
    /// not know and go on after it.
    pub(crate) fn record(
        &mut self,
        fields: impl FnOnce(&mut Writer) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        let mut inner = Writer::default();
        fields(&mut inner)?;
        let len = u32::try_from(inner.out.len()).map_err(|_| WireError::Invalid("too long"))?;
        self.put(&len)?;
        self.out.extend_from_slice(&inner.out);
        Ok(())
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

/// The fields of one record, read in order.
#[derive(Debug)]
pub(crate) struct Fields<'a> {
    /// The version the sender wrote.
    version: u8,
    /// The newest version this reader knows.
    known: u8,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(version: u8, known: u8, bytes: &'a [u8]) -> Self {
        Self {
            version,
            known,
            rest: bytes,
        }
    }

    /// The next field (one every version of the record has).
    pub(crate) fn take<T: Deserialize<'a>>(&mut self) -> Result<T, WireError> {
        let (value, rest) = postcard::take_from_bytes(self.rest)?;
        self.rest = rest;
        Ok(value)
    }

    /// A field added in version `since`: `None` when the record is older than that (the reader
    /// then uses the field's default).
    pub(crate) fn since<T: Deserialize<'a>>(&mut self, since: u8) -> Result<Option<T>, WireError> {
        if self.version < since {
            return Ok(None);
        }
        self.take().map(Some)
    }

    /// The next nested record (written with [`Writer::record`]), read under the same versions.
    pub(crate) fn record(&mut self) -> Result<Fields<'a>, WireError> {
        let len: u32 = self.take()?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.rest.len() {
            return Err(WireError::Invalid("a record longer than what holds it"));
        }
        let (inner, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(Fields {
            version: self.version,
            known: self.known,
            rest: inner,
        })
    }

    /// Ends the record. What follows the fields this reader knows is a newer version's and is
    /// skipped; in a record no newer than the reader, nothing may follow.
    pub(crate) fn finish(self) -> Result<(), WireError> {
        if self.rest.is_empty() || self.version > self.known {
            Ok(())
        } else {
            Err(WireError::Invalid("bytes after the last field"))
        }
    }
}
