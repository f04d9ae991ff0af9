//! Refusing NaN and infinities at record time: serde_json would silently turn them into `null`,
//! so values are probed with a serializer that only looks at floats and remembers the path.
use serde::ser::{self, Impossible, Serialize};

/// `Err(path)` when `value` holds a NaN or infinite float, with the JSON path of the first one.
pub(crate) fn check_finite<T: Serialize + ?Sized>(value: &T) -> Result<(), String> {
    let mut probe = Probe { path: vec!["$".to_owned()], floats: true };
    match value.serialize(&mut probe) {
        Ok(()) => Ok(()),
        Err(NonFinite(path)) => Err(path),
    }
}

/// The JSON path of the part of `value` that failed to serialize (an `i128` or `u128` beyond 64
/// bits, a map key that is no string or number, a custom `Serialize` error), when found.
pub(crate) fn failing_path<T: Serialize + ?Sized>(value: &T) -> Option<String> {
    let mut probe = Probe { path: vec!["$".to_owned()], floats: false };
    match value.serialize(&mut probe) {
        Err(NonFinite(path)) if !path.is_empty() => Some(path),
        _ => None,
    }
}

#[derive(Debug)]
struct NonFinite(String);

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "non-finite number at {}", self.0)
    }
}

impl std::error::Error for NonFinite {}

impl ser::Error for NonFinite {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        // Other serialization errors are reported by serde_json itself later.
        NonFinite(String::new())
    }
}

struct Probe {
    path: Vec<String>,
    /// Whether NaN and infinities are what is looked for ([`check_finite`]); else any failure
    /// ([`failing_path`]).
    floats: bool,
}

impl Probe {
    fn float(&self, f: f64) -> Result<(), NonFinite> {
        if f.is_finite() || !self.floats {
            Ok(())
        } else {
            Err(NonFinite(self.path.concat()))
        }
    }
    fn nested<T: Serialize + ?Sized>(&mut self, part: String, value: &T) -> Result<(), NonFinite> {
        self.path.push(part);
        // A failure with no path yet (a custom error, an unsupported type) is at this part.
        let r = value.serialize(&mut *self).map_err(|e| match e.0.is_empty() {
            true => NonFinite(self.path.concat()),
            false => e,
        });
        self.path.pop();
        r
    }
    fn failure(&self) -> Result<(), NonFinite> {
        match self.floats {
            true => Ok(()),
            false => Err(NonFinite(self.path.concat())),
        }
    }
}

fn key_part(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!(".{key}")
    } else {
        format!("[{}]", serde_json::to_string(key).unwrap_or_default())
    }
}

/// Serializes a map key to a string for the path (non-string keys get their debug form).
struct KeyName;

macro_rules! key_prim {
    ($($m:ident: $t:ty),*) => { $(fn $m(self, v: $t) -> Result<String, NonFinite> { Ok(v.to_string()) })* };
}

impl ser::Serializer for KeyName {
    type Ok = String;
    type Error = NonFinite;
    type SerializeSeq = Impossible<String, NonFinite>;
    type SerializeTuple = Impossible<String, NonFinite>;
    type SerializeTupleStruct = Impossible<String, NonFinite>;
    type SerializeTupleVariant = Impossible<String, NonFinite>;
    type SerializeMap = Impossible<String, NonFinite>;
    type SerializeStruct = Impossible<String, NonFinite>;
    type SerializeStructVariant = Impossible<String, NonFinite>;
    key_prim!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64, serialize_f32: f32,
        serialize_f64: f64, serialize_char: char, serialize_str: &str);
    fn serialize_bytes(self, _: &[u8]) -> Result<String, NonFinite> {
        Ok("?".into())
    }
    fn serialize_none(self) -> Result<String, NonFinite> {
        Ok("?".into())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<String, NonFinite> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, NonFinite> {
        Ok("?".into())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, NonFinite> {
        Ok("?".into())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, v: &'static str) -> Result<String, NonFinite> {
        Ok(v.into())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<String, NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        _: &T,
    ) -> Result<String, NonFinite> {
        Ok(v.into())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NonFinite> {
        Err(NonFinite(String::new()))
    }
}

/// A compound being probed: counts elements for array paths, remembers the pending map key.
struct Compound<'a> {
    probe: &'a mut Probe,
    index: usize,
    key: String,
}

impl<'a> ser::Serializer for &'a mut Probe {
    type Ok = ();
    type Error = NonFinite;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;
    fn serialize_bool(self, _: bool) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), NonFinite> {
        match i64::try_from(v).is_ok() || u64::try_from(v).is_ok() {
            true => Ok(()),
            false => self.failure(),
        }
    }
    fn serialize_u128(self, v: u128) -> Result<(), NonFinite> {
        match u64::try_from(v).is_ok() {
            true => Ok(()),
            false => self.failure(),
        }
    }
    fn serialize_f32(self, v: f32) -> Result<(), NonFinite> {
        self.float(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), NonFinite> {
        self.float(v)
    }
    fn serialize_char(self, _: char) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_str(self, _: &str) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_none(self) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<(), NonFinite> {
        self.nested(key_part(variant), v)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_tuple(self, _: usize) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, NonFinite> {
        Ok(Compound { probe: self, index: 0, key: String::new() })
    }
}

impl Compound<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> {
        let part = format!("[{}]", self.index);
        self.index += 1;
        self.probe.nested(part, v)
    }
}

macro_rules! seq_like {
    ($($tr:ident :: $m:ident),*) => {$(
        impl ser::$tr for Compound<'_> {
            type Ok = ();
            type Error = NonFinite;
            fn $m<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> { self.element(v) }
            fn end(self) -> Result<(), NonFinite> { Ok(()) }
        }
    )*};
}
seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = NonFinite;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), NonFinite> {
        self.key = match k.serialize(KeyName) {
            Ok(key) => key,
            Err(_) if !self.probe.floats => {
                return Err(NonFinite(format!("{}[?]", self.probe.path.concat())))
            }
            Err(_) => "?".into(),
        };
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> {
        let part = key_part(&self.key);
        self.probe.nested(part, v)
    }
    fn end(self) -> Result<(), NonFinite> {
        Ok(())
    }
}

macro_rules! struct_like {
    ($($tr:ident),*) => {$(
        impl ser::$tr for Compound<'_> {
            type Ok = ();
            type Error = NonFinite;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Result<(), NonFinite> {
                self.probe.nested(key_part(key), v)
            }
            fn end(self) -> Result<(), NonFinite> { Ok(()) }
        }
    )*};
}
struct_like!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn finds_the_path_of_a_nan() {
        #[derive(serde::Serialize)]
        struct Row {
            name: String,
            scores: Vec<f64>,
        }
        let mut m = BTreeMap::new();
        m.insert("rows", vec![Row { name: "a".into(), scores: vec![1.0, f64::NAN] }]);
        assert_eq!(check_finite(&m), Err("$.rows[0].scores[1]".to_owned()));
        assert_eq!(check_finite(&serde_json::json!({"x": [1.5]})), Ok(()));
        assert_eq!(check_finite(&f64::INFINITY), Err("$".to_owned()));
    }
}
