//! GGUF metadata values: the thirteen value types of the GGUF spec (`gguf_type` in ggml's
//! `gguf.h`, "GGUF" section of ggml's `docs/gguf.md`), kept with their types.

/// A GGUF metadata value type. The discriminant is the id written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetaValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaValueType {
    /// The type with GGUF id `id`, or `None` for an id the spec does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        use MetaValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The spec's name of the type (`"UINT32"`, `"STRING"`, ...), as the `gguf` package spells it.
    pub fn name(self) -> &'static str {
        use MetaValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    /// Bytes one value of a fixed-size type takes in the file, `None` for STRING and ARRAY.
    pub fn fixed_size(self) -> Option<usize> {
        use MetaValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take in the file: its fixed size, 8 for a
    /// string (the u64 length), 12 for an array (u32 element type + u64 count). Used to reject
    /// counts that cannot fit in the bytes left before allocating anything for them.
    pub fn min_size(self) -> usize {
        match self {
            MetaValueType::String => 8,
            MetaValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

/// One metadata value, with its GGUF type.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: every element has the same GGUF type; arrays may nest (each inner array
/// carries its own element type).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaValue {
    /// The GGUF type of this value.
    pub fn value_type(&self) -> MetaValueType {
        use MetaValue as V;
        use MetaValueType as T;
        match self {
            V::U8(_) => T::U8,
            V::I8(_) => T::I8,
            V::U16(_) => T::U16,
            V::I16(_) => T::I16,
            V::U32(_) => T::U32,
            V::I32(_) => T::I32,
            V::F32(_) => T::F32,
            V::Bool(_) => T::Bool,
            V::String(_) => T::String,
            V::Array(_) => T::Array,
            V::U64(_) => T::U64,
            V::I64(_) => T::I64,
            V::F64(_) => T::F64,
        }
    }

    /// A readable type name: `"UINT32"`, `"STRING"`, `"ARRAY[INT32]"`, `"ARRAY[ARRAY[UINT8]]"`.
    pub fn type_name(&self) -> String {
        match self {
            MetaValue::Array(a) => a.type_name(),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an `i128` if it is an integer of any width (BOOL is not an integer here).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f64` if it is FLOAT32 or FLOAT64 (exact for both).
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a STRING.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is a BOOL.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if this is an ARRAY.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetaArray {
    /// The GGUF type of the elements.
    pub fn elem_type(&self) -> MetaValueType {
        use MetaArray as A;
        use MetaValueType as T;
        match self {
            A::U8(_) => T::U8,
            A::I8(_) => T::I8,
            A::U16(_) => T::U16,
            A::I16(_) => T::I16,
            A::U32(_) => T::U32,
            A::I32(_) => T::I32,
            A::F32(_) => T::F32,
            A::Bool(_) => T::Bool,
            A::String(_) => T::String,
            A::Array(_) => T::Array,
            A::U64(_) => T::U64,
            A::I64(_) => T::I64,
            A::F64(_) => T::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        use MetaArray as A;
        match self {
            A::U8(v) => v.len(),
            A::I8(v) => v.len(),
            A::U16(v) => v.len(),
            A::I16(v) => v.len(),
            A::U32(v) => v.len(),
            A::I32(v) => v.len(),
            A::F32(v) => v.len(),
            A::Bool(v) => v.len(),
            A::String(v) => v.len(),
            A::Array(v) => v.len(),
            A::U64(v) => v.len(),
            A::I64(v) => v.len(),
            A::F64(v) => v.len(),
        }
    }

    /// True when the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `"ARRAY[elem]"`; an empty array of arrays reads `"ARRAY[ARRAY]"`, a non-empty one names
    /// its first inner array's type.
    pub fn type_name(&self) -> String {
        match self {
            MetaArray::Array(inner) => match inner.first() {
                Some(first) => format!("ARRAY[{}]", first.type_name()),
                None => "ARRAY[ARRAY]".to_string(),
            },
            a => format!("ARRAY[{}]", a.elem_type().name()),
        }
    }

    /// The strings, if the elements are STRING.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetaArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The values, if the elements are INT32.
    pub fn as_i32(&self) -> Option<&[i32]> {
        match self {
            MetaArray::I32(v) => Some(v),
            _ => None,
        }
    }

    /// The values, if the elements are UINT32.
    pub fn as_u32(&self) -> Option<&[u32]> {
        match self {
            MetaArray::U32(v) => Some(v),
            _ => None,
        }
    }

    /// The values, if the elements are FLOAT32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            MetaArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Element `i` as a [`MetaValue`] (cloned), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        use MetaArray as A;
        use MetaValue as V;
        Some(match self {
            A::U8(v) => V::U8(*v.get(i)?),
            A::I8(v) => V::I8(*v.get(i)?),
            A::U16(v) => V::U16(*v.get(i)?),
            A::I16(v) => V::I16(*v.get(i)?),
            A::U32(v) => V::U32(*v.get(i)?),
            A::I32(v) => V::I32(*v.get(i)?),
            A::F32(v) => V::F32(*v.get(i)?),
            A::Bool(v) => V::Bool(*v.get(i)?),
            A::String(v) => V::String(v.get(i)?.clone()),
            A::Array(v) => V::Array(v.get(i)?.clone()),
            A::U64(v) => V::U64(*v.get(i)?),
            A::I64(v) => V::I64(*v.get(i)?),
            A::F64(v) => V::F64(*v.get(i)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            let t = MetaValueType::from_id(id).unwrap();
            assert_eq!(t as u32, id);
        }
        assert_eq!(MetaValueType::from_id(13), None);
        assert_eq!(MetaValueType::String.min_size(), 8);
        assert_eq!(MetaValueType::Array.min_size(), 12);
        assert_eq!(MetaValueType::Bool.min_size(), 1);
    }

    #[test]
    fn type_names() {
        let a = MetaValue::Array(MetaArray::Array(vec![MetaArray::U8(vec![1])]));
        assert_eq!(a.type_name(), "ARRAY[ARRAY[UINT8]]");
        assert_eq!(MetaValue::U32(3).as_integer(), Some(3));
        assert_eq!(MetaValue::Bool(true).as_integer(), None);
        assert_eq!(MetaValue::F32(0.5).as_float(), Some(0.5));
    }
}
