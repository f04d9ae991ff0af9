//! Canonical JSON written straight from a `Serialize` value: the bytes
//! `write_canonical_value(&serde_json::to_value(v))` writes, without building the `Value` (its
//! maps, key strings and number boxes were most of the cost of hashing and exporting an event).
//!
//! Members are written as they come and put in key order when their object ends (a struct's
//! order is found once per thread and remembered, see `KeyOrders`). Anything this
//! writer doesn't handle exactly as `serde_json::to_value` would (128-bit and `f32` numbers,
//! non-string map keys, raw values, a repeated key) makes it give up; callers then take the
//! `Value` path, so the bytes never depend on which path wrote them.
use std::borrow::Cow;
use std::fmt::{self, Display, Write as _};

use serde::ser::{self, Impossible, Serialize};

use super::{key_order, write_escaped, write_f64, write_u64};

/// Writes the canonical form of `value` to `out`; `Err` when the caller must take the `Value`
/// path (`out` then holds a partial write).
pub(crate) fn write_serialized<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), GiveUp> {
    let mut ser = Ser { out, scratch: String::new() };
    value.serialize(&mut ser)
}

/// This writer can't match `serde_json::to_value` here.
#[derive(Debug)]
pub(crate) struct GiveUp;

impl Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not written directly")
    }
}

impl std::error::Error for GiveUp {}

impl ser::Error for GiveUp {
    fn custom<T: Display>(_: T) -> GiveUp {
        GiveUp
    }
}

struct Ser<'o> {
    out: &'o mut Vec<u8>,
    /// Reused for `collect_str` (digests).
    scratch: String,
}

impl Ser<'_> {
    /// `{"variant":` before a variant's content; `}` follows it.
    fn open_variant(&mut self, variant: &str) {
        self.out.push(b'{');
        write_escaped(self.out, variant);
        self.out.push(b':');
    }
}

/// An object being written: its members' values so far, each with its key and where it lies.
struct Object<'s, 'o> {
    ser: &'s mut Ser<'o>,
    start: usize,
    members: Vec<(Cow<'static, str>, usize, usize)>,
    /// A map's key, until its value comes.
    key: Option<String>,
}

impl<'s, 'o> Object<'s, 'o> {
    fn member<T: Serialize + ?Sized>(&mut self, key: Cow<'static, str>, value: &T) -> Result<(), GiveUp> {
        let from = self.ser.out.len();
        value.serialize(&mut *self.ser)?;
        self.members.push((key, from, self.ser.out.len()));
        Ok(())
    }

    /// Writes `{`, the members in key order, `}` where the values were; gives the writer back.
    fn finish(self) -> Result<&'s mut Ser<'o>, GiveUp> {
        let values = self.ser.out.split_off(self.start);
        let Object { ser, start, members, .. } = self;
        let out = &mut *ser.out;
        let write =
            |out: &mut Vec<u8>, order: &mut dyn Iterator<Item = &(Cow<'static, str>, usize, usize)>| {
                out.push(b'{');
                for (i, (key, from, to)) in order.enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_escaped(out, key);
                    out.push(b':');
                    out.extend_from_slice(&values[from - start..to - start]);
                }
                out.push(b'}');
            };
        let known = KEY_ORDERS.with_borrow_mut(|orders| match orders.of(&members) {
            Some(order) => {
                write(out, &mut order.iter().map(|&i| &members[usize::from(i)]));
                true
            }
            None => false,
        });
        if !known {
            let mut order: Vec<u16> = (0..members.len()).filter_map(|i| u16::try_from(i).ok()).collect();
            order.sort_by(|&a, &b| key_order(&members[usize::from(a)].0, &members[usize::from(b)].0));
            if order.len() != members.len()
                || order.windows(2).any(|w| members[usize::from(w[0])].0 == members[usize::from(w[1])].0)
            {
                return Err(GiveUp);
            }
            write(out, &mut order.iter().map(|&i| &members[usize::from(i)]));
            KEY_ORDERS.with_borrow_mut(|orders| orders.remember(&members, order));
        }
        Ok(ser)
    }
}

/// How many members' orders [`KeyOrders`] remembers, at most.
const KEY_ORDERS_KEPT: usize = 64;

thread_local! {
    /// The key order of the structs this thread wrote.
    static KEY_ORDERS: std::cell::RefCell<KeyOrders> = const { std::cell::RefCell::new(KeyOrders(Vec::new())) };
}

/// The key order of a struct's members, by the exact `&'static str` keys it gave, in the order
/// it gave them (a struct that skips a field gives another list): sorting the same keys again
/// gives the same order, so a struct written many times (every event) is sorted once.
struct KeyOrders(Vec<(Vec<&'static str>, Vec<u16>)>);

impl KeyOrders {
    /// The order of `members` if they are a struct's keys seen before: same strings, same place.
    fn of(&self, members: &[(Cow<'static, str>, usize, usize)]) -> Option<&[u16]> {
        let same = |keys: &[&'static str]| {
            keys.len() == members.len()
                && keys.iter().zip(members).all(|(key, (member, _, _))| match member {
                    Cow::Borrowed(member) => std::ptr::eq(*key, *member),
                    Cow::Owned(_) => false,
                })
        };
        self.0.iter().find(|(keys, _)| same(keys)).map(|(_, order)| &order[..])
    }

    /// Remembers the (sorted, duplicate-free) `order` of a struct's `members`.
    fn remember(&mut self, members: &[(Cow<'static, str>, usize, usize)], order: Vec<u16>) {
        if self.0.len() >= KEY_ORDERS_KEPT {
            return;
        }
        let keys: Option<Vec<&'static str>> = members
            .iter()
            .map(|(key, _, _)| match key {
                Cow::Borrowed(key) => Some(*key),
                Cow::Owned(_) => None,
            })
            .collect();
        if let Some(keys) = keys {
            self.0.push((keys, order));
        }
    }
}

/// An array being written.
struct Array<'s, 'o> {
    ser: &'s mut Ser<'o>,
    first: bool,
    /// Whether a variant's `}` follows the `]`.
    variant: bool,
}

impl Array<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        if !std::mem::take(&mut self.first) {
            self.ser.out.push(b',');
        }
        value.serialize(&mut *self.ser)
    }

    fn finish(self) -> Result<(), GiveUp> {
        self.ser.out.push(b']');
        if self.variant {
            self.ser.out.push(b'}');
        }
        Ok(())
    }
}

impl<'s, 'o> ser::Serializer for &'s mut Ser<'o> {
    type Ok = ();
    type Error = GiveUp;
    type SerializeSeq = Array<'s, 'o>;
    type SerializeTuple = Array<'s, 'o>;
    type SerializeTupleStruct = Array<'s, 'o>;
    type SerializeTupleVariant = Array<'s, 'o>;
    type SerializeMap = Object<'s, 'o>;
    type SerializeStruct = Object<'s, 'o>;
    type SerializeStructVariant = Variant<'s, 'o>;

    fn serialize_bool(self, v: bool) -> Result<(), GiveUp> {
        self.out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), GiveUp> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), GiveUp> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), GiveUp> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), GiveUp> {
        if v < 0 {
            self.out.push(b'-');
        }
        write_u64(v.unsigned_abs(), self.out);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), GiveUp> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), GiveUp> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), GiveUp> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), GiveUp> {
        write_u64(v, self.out);
        Ok(())
    }
    fn serialize_f32(self, _: f32) -> Result<(), GiveUp> {
        Err(GiveUp)
    }
    fn serialize_f64(self, v: f64) -> Result<(), GiveUp> {
        // serde_json turns a non-finite double into null.
        if write_f64(v, self.out).is_err() {
            self.out.extend_from_slice(b"null");
        }
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), GiveUp> {
        write_escaped(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), GiveUp> {
        write_escaped(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), GiveUp> {
        Err(GiveUp)
    }
    fn serialize_none(self) -> Result<(), GiveUp> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), GiveUp> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), GiveUp> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), GiveUp> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), GiveUp> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), GiveUp> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), GiveUp> {
        self.open_variant(variant);
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Array<'s, 'o>, GiveUp> {
        self.out.push(b'[');
        Ok(Array { ser: self, first: true, variant: false })
    }
    fn serialize_tuple(self, len: usize) -> Result<Array<'s, 'o>, GiveUp> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Array<'s, 'o>, GiveUp> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Array<'s, 'o>, GiveUp> {
        self.open_variant(variant);
        self.out.push(b'[');
        Ok(Array { ser: self, first: true, variant: true })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Object<'s, 'o>, GiveUp> {
        Ok(self.object_owned())
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Object<'s, 'o>, GiveUp> {
        // serde_json's raw values and arbitrary-precision numbers are magic structs.
        if name.starts_with("$serde_json") {
            return Err(GiveUp);
        }
        Ok(self.object_owned())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<'s, 'o>, GiveUp> {
        self.open_variant(variant);
        Ok(Variant(self.object_owned()))
    }
    fn collect_str<T: Display + ?Sized>(self, value: &T) -> Result<(), GiveUp> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        write!(scratch, "{value}").map_err(|_| GiveUp)?;
        write_escaped(self.out, &scratch);
        self.scratch = scratch;
        Ok(())
    }
}

impl<'s, 'o> Ser<'o> {
    fn object_owned(&'s mut self) -> Object<'s, 'o> {
        Object { start: self.out.len(), ser: self, members: Vec::new(), key: None }
    }
}

impl ser::SerializeSeq for Array<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        self.element(value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish()
    }
}

impl ser::SerializeTuple for Array<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        self.element(value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Array<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        self.element(value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Array<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        self.element(value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish()
    }
}

impl ser::SerializeMap for Object<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), GiveUp> {
        self.key = Some(key.serialize(KeySer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), GiveUp> {
        let key = self.key.take().ok_or(GiveUp)?;
        self.member(Cow::Owned(key), value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish().map(|_| ())
    }
}

impl ser::SerializeStruct for Object<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), GiveUp> {
        self.member(Cow::Borrowed(key), value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.finish().map(|_| ())
    }
}

/// A struct variant: its object, then the variant's `}`.
struct Variant<'s, 'o>(Object<'s, 'o>);

impl ser::SerializeStructVariant for Variant<'_, '_> {
    type Ok = ();
    type Error = GiveUp;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), GiveUp> {
        self.0.member(Cow::Borrowed(key), value)
    }
    fn end(self) -> Result<(), GiveUp> {
        self.0.finish()?.out.push(b'}');
        Ok(())
    }
}

/// Map keys: strings only (serde_json would stringify numbers; this writer gives up instead).
struct KeySer;

impl ser::Serializer for KeySer {
    type Ok = String;
    type Error = GiveUp;
    type SerializeSeq = Impossible<String, GiveUp>;
    type SerializeTuple = Impossible<String, GiveUp>;
    type SerializeTupleStruct = Impossible<String, GiveUp>;
    type SerializeTupleVariant = Impossible<String, GiveUp>;
    type SerializeMap = Impossible<String, GiveUp>;
    type SerializeStruct = Impossible<String, GiveUp>;
    type SerializeStructVariant = Impossible<String, GiveUp>;

    fn serialize_str(self, v: &str) -> Result<String, GiveUp> {
        Ok(v.to_owned())
    }
    fn serialize_char(self, v: char) -> Result<String, GiveUp> {
        Ok(v.to_string())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, GiveUp> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, GiveUp> {
        value.serialize(self)
    }
    fn serialize_bool(self, _: bool) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_i8(self, _: i8) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_i16(self, _: i16) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_i32(self, _: i32) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_i64(self, _: i64) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_u8(self, _: u8) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_u16(self, _: u16) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_u32(self, _: u32) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_u64(self, _: u64) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_f32(self, _: f32) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_f64(self, _: f64) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_none(self) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_unit(self) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, GiveUp> {
        Err(GiveUp)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, GiveUp> {
        Err(GiveUp)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use serde::Serialize;
    use serde_json::Value;

    use super::write_serialized;
    use crate::canonical::canonical_value;

    /// The bytes of the `Value` path: `to_value`, then the canonical form.
    fn through_value<T: Serialize>(value: &T) -> Vec<u8> {
        canonical_value(&serde_json::to_value(value).unwrap()).unwrap()
    }

    fn direct<T: Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        write_serialized(value, &mut out).unwrap();
        out
    }

    fn any_value() -> impl Strategy<Value = Value> {
        let text = "[a-z\"\\\\\\x00-\\x1f\u{e9}\u{e000}\u{1F600}]{0,6}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text.prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::from),
                btree_map(text, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any JSON value is written as its `Value` path writes it (keys in UTF-16 order).
        #[test]
        fn values_are_written_as_the_value_path_writes_them(value in any_value()) {
            prop_assert_eq!(direct(&value), through_value(&value));
        }
    }

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Unit,
        Newtype(u8),
        Tuple(i32, String),
        Named { z: f64, a: Option<bool> },
    }

    #[derive(Serialize)]
    struct Record {
        zeta: Vec<Shape>,
        #[serde(rename = "type")]
        kind: Shape,
        hash: &'static str,
        alpha: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
        nan: f64,
        negative: i64,
        map: BTreeMap<String, Value>,
        unit: (),
        ch: char,
    }

    fn record() -> Record {
        Record {
            zeta: vec![
                Shape::Unit,
                Shape::Newtype(7),
                Shape::Tuple(-3, "t\"".into()),
                Shape::Named { z: 0.1, a: None },
            ],
            kind: Shape::Named { z: 1e21, a: Some(true) },
            hash: "h",
            alpha: None,
            skipped: None,
            nan: f64::NAN,
            negative: i64::MIN,
            map: [("b".to_owned(), Value::from(1.5)), ("a".to_owned(), Value::from(u64::MAX))].into(),
            unit: (),
            ch: '\n',
        }
    }

    #[test]
    fn structs_and_enums_match_the_value_path() {
        let record = record();
        assert_eq!(direct(&record), through_value(&record));
        assert_eq!(direct(&[&record]), through_value(&[&record]));
    }

    /// A struct's key order is remembered from its first write; one that skips a field gives
    /// other keys, and another order, and every write still equals the value path's.
    #[test]
    fn remembered_key_orders_match_the_value_path() {
        let mut record = record();
        for round in 0..3u8 {
            record.skipped = (round == 1).then_some(round);
            assert_eq!(direct(&record), through_value(&record), "round {round}");
        }
    }

    /// An event's nested parts and the event as a whole take the direct path (it never gives up).
    #[test]
    fn an_event_is_written_directly() {
        let mut event =
            crate::Event::new("01jd0000000000000000000000", "reviewer", crate::EventType::ModelCall);
        event.inbound = vec![5, 6];
        event.params = Some([("temperature".to_owned(), Value::from(0.7))].into());
        event.hash = crate::Digest::of(b"x");
        assert_eq!(direct(&event), through_value(&event));
    }
}
