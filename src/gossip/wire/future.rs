//! A sidecar from the future, for tests (`NodeOptions::newer_wire`): it writes every item one
//! version newer than this one, with a field appended to the item and to each capability or pin
//! in it, and it publishes a kind of item this one does not know. What this sidecar must make of
//! it is the compatibility rule.

use super::{write_frame, Body, Item, Pins, Profile, WireError, Writer};
#[cfg(test)]
use super::{ItemKind, Live};

/// The kind a newer sidecar added.
pub(crate) const NEW_KIND: u8 = 0x7e;

/// The field a newer version appended (to items and to capabilities).
pub(crate) const EXTRA: &str = "a field from a newer version";

/// `item` as the next version writes it.
pub(crate) fn encode_item(item: &Item) -> Result<Vec<u8>, WireError> {
    let mut w = Writer::default();
    write_item(&mut w, item)?;
    Ok(w.into_bytes())
}

fn write_item(w: &mut Writer, item: &Item) -> Result<(), WireError> {
    let kind = item.kind();
    write_frame(w, kind.code(), kind.version() + 1, item, |w| {
        match &item.body {
            Body::Profile(p) => write_profile(w, p)?,
            Body::Live(l) => l.write(w)?,
            Body::Pins(p) => write_pins(w, p)?,
        }
        w.put(EXTRA)
    })
}

/// A profile whose capabilities carry a newer field too.
fn write_profile(w: &mut Writer, p: &Profile) -> Result<(), WireError> {
    w.put(&p.inbound)?;
    w.put(&p.zone)?;
    w.put(&p.region)?;
    w.put(&p.max_concurrency)?;
    w.put(&(p.capabilities.len() as u32))?;
    for c in &p.capabilities {
        w.record(|w| {
            c.write(w)?;
            w.put(EXTRA)
        })?;
    }
    w.put(&p.version)?;
    w.put(&p.identity)
}

/// Pins whose records carry a newer field too.
fn write_pins(w: &mut Writer, p: &Pins) -> Result<(), WireError> {
    w.put(&(p.pins.len() as u32))?;
    for pin in &p.pins {
        w.record(|w| {
            w.put(&pin.capability)?;
            w.put(&pin.tool)?;
            w.put(&pin.digest)?;
            w.put(EXTRA)
        })?;
    }
    Ok(())
}

/// An item of a kind this sidecar does not know, about `head`'s node.
pub(crate) fn new_kind_item(head: &Item) -> Result<Vec<u8>, WireError> {
    let mut w = Writer::default();
    write_frame(&mut w, NEW_KIND, 1, head, |w| {
        w.put(EXTRA)?;
        w.put(&[1u32, 2, 3])
    })?;
    Ok(w.into_bytes())
}

#[cfg(test)]
/// Items one after another as the next version sends them directly: an item of the new kind
/// first (the known ones after it must still be read), then each item in the newer version.
pub(crate) fn encode_items<'a>(
    items: impl IntoIterator<Item = &'a Item>,
) -> Result<Vec<u8>, WireError> {
    let mut w = Writer::default();
    let mut first = true;
    for item in items {
        if std::mem::take(&mut first) {
            w.raw(&new_kind_item(item)?);
        }
        write_item(&mut w, item)?;
    }
    Ok(w.into_bytes())
}

/// The next version's `Live`: this one's fields and one more, with its default when absent.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NextLive {
    pub(crate) live: Live,
    /// The appended field (here: a queue limit), 0 when an older sidecar sent the item.
    pub(crate) queue_limit: u32,
}

#[cfg(test)]
impl NextLive {
    pub(crate) const VERSION: u8 = 6;

    pub(crate) fn encode(&self, head: &Item) -> Result<Vec<u8>, WireError> {
        let mut w = Writer::default();
        write_frame(&mut w, ItemKind::Live.code(), Self::VERSION, head, |w| {
            self.live.write(w)?;
            w.put(&self.queue_limit)
        })?;
        Ok(w.into_bytes())
    }

    /// How the next version reads a live item: the known fields, then the new one if present.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Item, Self), WireError> {
        let (frame, _) = super::split_frame(bytes)?;
        if frame.kind != ItemKind::Live.code() {
            return Err(WireError::Invalid("not a live item"));
        }
        let mut f = super::Fields::new(frame.version, Self::VERSION, frame.record);
        let name = f.take()?;
        let node = f.take()?;
        let seq = f.take()?;
        let live = Live::read(&mut f)?;
        let queue_limit = f.since(Self::VERSION)?.unwrap_or_default();
        f.finish()?;
        let item = Item {
            name,
            node,
            seq,
            body: Body::Live(live.clone()),
        };
        Ok((item, Self { live, queue_limit }))
    }
}
