//! The fast path of [`decode_event_ref`](crate::decode_event_ref): a hand-written
//! reader for the shape producers write, one flat JSON object of the event's own
//! fields with no whitespace and no escapes (what [`encode`](crate::encode) and the
//! prefetcher write); and its writer, [`write`], behind
//! [`encode_event_into`](crate::encode_event_into).
//!
//! serde_json was about 60 % of pulse's per-event cost: it is general (any order,
//! escapes, unknown fields, whitespace, helpful errors), and this shape needs none of
//! that. The reader never refuses: whatever it is not sure of (an escape, whitespace,
//! an unknown or repeated field, a number that is not a plain integer, an invalid id,
//! another version) makes it return `None`, and the caller decodes the message with
//! serde_json, which accepts it or names the problem. So it accepts nothing serde
//! would refuse; `codec`'s proptests and the `decode_access_event` fuzz target check
//! that the two agree on arbitrary input.

use crate::SCHEMA_VERSION;
use crate::event::{AccessEventRef, EdgeKind, Outcome};
use crate::ids::{CacheKeyRef, DomainRef, NodeRef, RegionRef, TenantRef};

/// The event in `bytes` if it has the compact shape and is valid, else `None`.
#[inline]
pub(crate) fn parse(bytes: &[u8]) -> Option<AccessEventRef<'_>> {
    let mut reader = Reader { bytes, pos: 0 };
    reader.byte(b'{')?;
    let mut seen = 0u16;
    let (mut v, mut ts_ms, mut tenant, mut key) = (None, None, None, None);
    let (mut region, mut node, mut outcome) = (None, None, None);
    let (mut referrer, mut sent, mut fill_ms, mut edge) = (None, 0, None, None);
    // Where the next field probably is in `IN_ORDER`.
    let mut next = 0;
    loop {
        let field = reader.field(&mut next)?;
        if seen & field.bit() != 0 {
            return None; // serde reports the duplicate
        }
        seen |= field.bit();
        match field {
            Field::V => v = Some(reader.integer()?),
            Field::TsMs => ts_ms = Some(reader.integer()?),
            Field::Tenant => tenant = Some(TenantRef::new(reader.string()?).ok()?),
            Field::Key => key = Some(CacheKeyRef::new(reader.string()?).ok()?),
            Field::Region => region = Some(RegionRef::new(reader.string()?).ok()?),
            Field::Node => node = Some(NodeRef::new(reader.string()?).ok()?),
            Field::Outcome => outcome = Some(outcome_named(reader.raw_string()?)?),
            Field::Referrer if !reader.null() => {
                referrer = Some(DomainRef::new(reader.string()?).ok()?);
            }
            Field::Bytes => sent = reader.integer()?,
            Field::FillMs if !reader.null() => {
                fill_ms = Some(u32::try_from(reader.integer()?).ok()?);
            }
            Field::Edge if !reader.null() => edge = Some(edge_named(reader.raw_string()?)?),
            Field::Edge | Field::Referrer | Field::FillMs => {} // null: absent
        }
        match reader.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    // Nothing after the object: serde_json allows trailing whitespace, we don't need to.
    if reader.pos != bytes.len() {
        return None;
    }
    let v = u16::try_from(v?).ok().filter(|&v| v == SCHEMA_VERSION)?;
    Some(AccessEventRef {
        v,
        ts_ms: ts_ms?,
        tenant: tenant?,
        key: key?,
        region: region?,
        node: node?,
        outcome: outcome?,
        referrer,
        bytes: sent,
        fill_ms,
        edge,
    })
}

/// Appends `event` to `out` byte for byte as [`encode`](crate::encode) writes the owned
/// event (serde_json's compact form: the fields in declaration order, the optional ones
/// only when present), without serde's machinery or an allocation of its own.
pub(crate) fn write(event: &AccessEventRef<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"v\":");
    integer(out, u64::from(event.v));
    out.extend_from_slice(b",\"ts_ms\":");
    integer(out, event.ts_ms);
    out.extend_from_slice(b",\"tenant\":");
    plain(out, event.tenant.as_str());
    out.extend_from_slice(b",\"key\":");
    string(out, event.key.as_str());
    out.extend_from_slice(b",\"region\":");
    plain(out, event.region.as_str());
    out.extend_from_slice(b",\"node\":");
    plain(out, event.node.as_str());
    out.extend_from_slice(b",\"outcome\":");
    plain(out, event.outcome.as_str());
    if let Some(referrer) = &event.referrer {
        out.extend_from_slice(b",\"referrer\":");
        plain(out, referrer.as_str());
    }
    out.extend_from_slice(b",\"bytes\":");
    integer(out, event.bytes);
    if let Some(fill_ms) = event.fill_ms {
        out.extend_from_slice(b",\"fill_ms\":");
        integer(out, u64::from(fill_ms));
    }
    if let Some(edge) = event.edge {
        out.extend_from_slice(b",\"edge\":");
        plain(out, edge.as_str());
    }
    out.push(b'}');
}

fn integer(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A JSON string that needs no escape: an id, a domain or a name of this crate (their
/// character sets have no quote, backslash or control character).
fn plain(out: &mut Vec<u8>, text: &str) {
    debug_assert!(!text.bytes().any(|b| STRING_STOP[usize::from(b)]));
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// A JSON string that may need escapes: a key (a quote is allowed in one). The rare
/// one that does is escaped by serde_json itself, so the escapes are serde's.
fn string(out: &mut Vec<u8>, text: &str) {
    if text.bytes().any(|b| STRING_STOP[usize::from(b)]) {
        // Writing to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
        return;
    }
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

#[derive(Clone, Copy)]
enum Field {
    V,
    TsMs,
    Tenant,
    Key,
    Region,
    Node,
    Outcome,
    Referrer,
    Bytes,
    FillMs,
    Edge,
}

/// The fields as `encode` writes them, each as `"name":`: a message in this order is
/// read without scanning its field names.
const IN_ORDER: [(&[u8], Field); 11] = [
    (b"\"v\":", Field::V),
    (b"\"ts_ms\":", Field::TsMs),
    (b"\"tenant\":", Field::Tenant),
    (b"\"key\":", Field::Key),
    (b"\"region\":", Field::Region),
    (b"\"node\":", Field::Node),
    (b"\"outcome\":", Field::Outcome),
    (b"\"referrer\":", Field::Referrer),
    (b"\"bytes\":", Field::Bytes),
    (b"\"fill_ms\":", Field::FillMs),
    (b"\"edge\":", Field::Edge),
];

impl Field {
    fn from_name(name: &[u8]) -> Option<Field> {
        Some(match name {
            b"v" => Field::V,
            b"ts_ms" => Field::TsMs,
            b"tenant" => Field::Tenant,
            b"key" => Field::Key,
            b"region" => Field::Region,
            b"node" => Field::Node,
            b"edge" => Field::Edge,
            b"outcome" => Field::Outcome,
            b"referrer" => Field::Referrer,
            b"bytes" => Field::Bytes,
            b"fill_ms" => Field::FillMs,
            _ => return None, // unknown fields are skipped by serde
        })
    }

    fn bit(self) -> u16 {
        1 << self as u16
    }
}

fn outcome_named(name: &[u8]) -> Option<Outcome> {
    Outcome::ALL
        .into_iter()
        .find(|o| o.as_str().as_bytes() == name)
}

/// Any name is a kind (unknown ones are `Other`), as serde reads it; the known names
/// are matched on their bytes, anything else must be UTF-8 (serde refuses it if not).
fn edge_named(name: &[u8]) -> Option<EdgeKind> {
    Some(match name {
        b"prefetcher" => EdgeKind::Prefetcher,
        b"nginx" => EdgeKind::Nginx,
        b"varnish" => EdgeKind::Varnish,
        other => EdgeKind::from_name(std::str::from_utf8(other).ok()?),
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn byte(&mut self, expected: u8) -> Option<()> {
        (self.next()? == expected).then_some(())
    }

    /// A field name and its colon. The fields usually come in `encode`'s order, so the
    /// ones expected next (from `IN_ORDER[*next..]`; optional ones may be missing) are
    /// tried first; any other name is read and looked up.
    fn field(&mut self, next: &mut usize) -> Option<Field> {
        let rest = &self.bytes[self.pos..];
        for (i, (quoted, field)) in IN_ORDER.iter().enumerate().skip(*next) {
            if rest.starts_with(quoted) {
                self.pos += quoted.len();
                *next = i + 1;
                return Some(*field);
            }
        }
        let field = Field::from_name(self.raw_string()?)?;
        self.byte(b':')?;
        Some(field)
    }

    /// `null`, consumed; anything else is left for the value reader.
    fn null(&mut self) -> bool {
        let is_null = self.bytes[self.pos..].starts_with(b"null");
        if is_null {
            self.pos += 4;
        }
        is_null
    }

    /// The bytes of a string with no escape and no control character.
    fn raw_string(&mut self) -> Option<&'a [u8]> {
        self.byte(b'"')?;
        let start = self.pos;
        // One pass: stop at the closing quote; an escape or a control character
        // (which serde unescapes or refuses) sends the message to serde.
        let len = self.bytes[start..]
            .iter()
            .position(|&b| STRING_STOP[usize::from(b)])?;
        if self.bytes[start + len] != b'"' {
            return None;
        }
        let text = &self.bytes[start..start + len];
        self.pos = start + len + 1;
        Some(text)
    }

    fn string(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.raw_string()?).ok()
    }

    /// A non-negative integer as JSON writes it: no sign, no leading zero, no fraction
    /// or exponent (those are serde's to accept or refuse).
    fn integer(&mut self) -> Option<u64> {
        let start = self.pos;
        let mut value = 0u64;
        while let Some(&b) = self.bytes.get(self.pos) {
            if !b.is_ascii_digit() {
                break;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            self.pos += 1;
        }
        let digits = self.pos - start;
        let leading_zero = digits > 1 && self.bytes[start] == b'0';
        let fraction = matches!(self.bytes.get(self.pos), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !fraction).then_some(value)
    }
}

/// Bytes that end the fast scan of a JSON string: the closing quote, the escape
/// character and the control characters (which serde refuses). The edge agent's log
/// reader scans with it too.
pub const STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, encode};
    use crate::event::AccessEvent;

    /// The writer's bytes are `encode`'s, with and without the optional fields, and
    /// with a key that needs escapes.
    #[test]
    fn writes_what_encode_writes() {
        let line = br#"{"v":1,"ts_ms":1764470000000,"tenant":"acme","key":"/img/a.png?v=2","region":"eu-west","node":"edge-1","outcome":"prefetch_useful","referrer":"news.example.com","bytes":5120,"fill_ms":42,"edge":"varnish"}"#;
        let mut event = decode::<AccessEvent>(line).unwrap();
        let mut out = Vec::new();
        write(&event.borrowed(), &mut out);
        assert_eq!(out, line.to_vec());
        // A quote is allowed in a key (serde escapes it); a control character is not.
        assert!(crate::CacheKey::new("/a\u{1}b").is_err());
        for key in ["/q\"uote", "/caf\u{e9}", "/"] {
            event.key = crate::CacheKey::new(key).unwrap();
            event.referrer = None;
            event.fill_ms = None;
            event.edge = None;
            event.bytes = u64::MAX;
            event.ts_ms = 0;
            out.clear();
            write(&event.borrowed(), &mut out);
            assert_eq!(out, encode(&event), "{key:?}");
        }
    }

    #[test]
    fn reads_what_encode_writes() {
        let line = br#"{"v":1,"ts_ms":1764470000000,"tenant":"acme","key":"/img/a.png?v=2","region":"eu-west","node":"edge-1","outcome":"prefetch_useful","referrer":"news.example.com","bytes":5120,"fill_ms":42,"edge":"varnish"}"#;
        let event = parse(line).expect("compact shape");
        assert_eq!(event.to_owned_event(), decode::<AccessEvent>(line).unwrap());
        assert_eq!(encode(&event.to_owned_event()), line.to_vec());
    }

    #[test]
    fn any_field_order_and_nulls_for_the_optional_fields() {
        let line = br#"{"outcome":"miss","fill_ms":null,"node":"n","edge":null,"referrer":null,"region":"r","key":"/k","tenant":"t","ts_ms":0,"v":1}"#;
        let event = parse(line).expect("compact shape");
        assert_eq!(event.to_owned_event(), decode::<AccessEvent>(line).unwrap());
        assert_eq!(
            (event.bytes, event.referrer, event.fill_ms, event.edge),
            (0, None, None, None)
        );
    }

    /// An edge kind this build does not know is `Other` on the fast path too, as
    /// serde reads it.
    #[test]
    fn an_unknown_edge_kind_is_other_on_both_paths() {
        let line = br#"{"v":1,"ts_ms":5,"tenant":"t","key":"/k","region":"r","node":"n","edge":"haproxy","outcome":"hit"}"#;
        let event = parse(line).expect("compact shape");
        assert_eq!(event.edge, Some(EdgeKind::Other));
        assert_eq!(event.to_owned_event(), decode::<AccessEvent>(line).unwrap());
    }

    /// Each of these is either refused by serde or accepted by it (unknown field,
    /// whitespace, escape): the fast path leaves all of them to serde.
    #[test]
    fn leaves_everything_else_to_serde() {
        let base =
            r#"{"v":1,"ts_ms":5,"tenant":"t","key":"/k","region":"r","node":"n","outcome":"hit"}"#;
        assert!(parse(base.as_bytes()).is_some());
        for (from, to) in [
            (r#""v":1"#, r#""v":2"#),
            (r#""v":1"#, r#""v":01"#),
            (r#""v":1"#, r#""v":1.0"#),
            (r#""v":1"#, r#""v":1e0"#),
            (r#""v":1"#, r#""v":-1"#),
            (r#""v":1"#, r#""v":65537"#),
            (r#""ts_ms":5"#, r#""ts_ms":18446744073709551616"#),
            (r#""ts_ms":5"#, r#""ts_ms":"5""#),
            (r#""ts_ms":5"#, r#""ts_ms":null"#),
            (r#""ts_ms":5,"#, ""),
            (r#""tenant":"t""#, r#""tenant":"t\u0000""#),
            (r#""tenant":"t""#, r#""tenant":"bad tenant""#),
            (r#""key":"/k""#, r#""key":"\/k""#),
            (r#""key":"/k""#, r#""key":"/a/../k""#),
            (r#""outcome":"hit""#, r#""outcome":"Hit""#),
            (r#""outcome":"hit""#, r#""outcome":"hit","v":1"#),
            (r#""outcome":"hit""#, r#""outcome":"hit","extra":true"#),
            (
                r#""outcome":"hit""#,
                r#""outcome":"hit","fill_ms":4294967296"#,
            ),
            (
                r#""outcome":"hit""#,
                r#""outcome":"hit","referrer":"not a host""#,
            ),
            (r#""outcome":"hit""#, r#""outcome":"hit","bytes":null"#),
            (r#""outcome":"hit""#, r#""outcome":"hit","edge":7"#),
            (
                r#""outcome":"hit""#,
                r#""outcome":"hit","edge":"ngin\u0078""#,
            ),
            (r#""outcome":"hit""#, r#""outcome": "hit""#),
            (r#""outcome":"hit"}"#, r#""outcome":"hit"} "#),
            (r#""outcome":"hit"}"#, r#""outcome":"hit""#),
            (r#""outcome":"hit"}"#, r#""outcome":"hit",}"#),
        ] {
            let line = base.replace(from, to);
            assert_ne!(line, base, "{to} replaced nothing");
            assert!(parse(line.as_bytes()).is_none(), "{line}");
        }
        let mut invalid_utf8 = base.as_bytes().to_vec();
        invalid_utf8[r#"{"v":1,"ts_ms":5,"tenant":""#.len()] = 0xff;
        assert!(parse(&invalid_utf8).is_none());
    }
}
