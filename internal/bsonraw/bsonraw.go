package bsonraw

import (
	"bytes"
	"encoding/binary"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ValueLen returns the encoded length of a value of type t at the start of b,
// or -1 when b is too short or malformed.
func ValueLen(t bson.Type, b []byte) int {
	var n int
	switch t {
	case bson.TypeDouble, bson.TypeDateTime, bson.TypeTimestamp, bson.TypeInt64:
		n = 8
	case bson.TypeInt32:
		n = 4
	case bson.TypeDecimal128:
		n = 16
	case bson.TypeObjectID:
		n = 12
	case bson.TypeBoolean:
		n = 1
	case bson.TypeNull, bson.TypeUndefined, bson.TypeMinKey, bson.TypeMaxKey:
		n = 0
	case bson.TypeString, bson.TypeJavaScript, bson.TypeSymbol:
		if len(b) < 4 {
			return -1
		}
		n = 4 + int(int32(binary.LittleEndian.Uint32(b)))
		if n < 5 {
			return -1
		}
	case bson.TypeEmbeddedDocument, bson.TypeArray, bson.TypeCodeWithScope:
		if len(b) < 4 {
			return -1
		}
		n = int(int32(binary.LittleEndian.Uint32(b)))
		if n < 5 {
			return -1
		}
	case bson.TypeBinary:
		if len(b) < 5 {
			return -1
		}
		n = 5 + int(int32(binary.LittleEndian.Uint32(b)))
		if n < 5 {
			return -1
		}
	case bson.TypeRegex:
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return -1
		}
		j := bytes.IndexByte(b[i+1:], 0)
		if j < 0 {
			return -1
		}
		n = i + 1 + j + 1
	case bson.TypeDBPointer:
		if len(b) < 4 {
			return -1
		}
		n = 4 + int(int32(binary.LittleEndian.Uint32(b))) + 12
		if n < 17 {
			return -1
		}
	default:
		return -1
	}
	if n > len(b) {
		return -1
	}
	return n
}

// Iter walks the elements of an encoded document or array without
// allocating. Malformed input simply ends the iteration. The zero Iter
// yields nothing.
type Iter struct {
	b []byte
	i int
}

// NewIter returns an iterator over the elements of the encoded document or
// array doc.
func NewIter(doc []byte) Iter {
	if len(doc) < 5 {
		return Iter{}
	}
	n := int(int32(binary.LittleEndian.Uint32(doc)))
	if n < 5 || n > len(doc) {
		return Iter{}
	}
	return Iter{b: doc[:n-1], i: 4}
}

// Next returns the next element: its key, type and encoded value (slices of
// the document, not copies). ok is false at the end or at malformed input.
func (it *Iter) Next() (key []byte, t bson.Type, v []byte, ok bool) {
	if it.i >= len(it.b) {
		return nil, 0, nil, false
	}
	t = bson.Type(it.b[it.i])
	rest := it.b[it.i+1:]
	k := bytes.IndexByte(rest, 0)
	if k < 0 {
		it.i = len(it.b)
		return nil, 0, nil, false
	}
	key = rest[:k]
	rest = rest[k+1:]
	n := ValueLen(t, rest)
	if n < 0 {
		it.i = len(it.b)
		return nil, 0, nil, false
	}
	it.i += 1 + k + 1 + n
	return key, t, rest[:n], true
}

// Lookup returns the value of the first field named key in the encoded
// document doc. It is the innermost loop of query.Filter.Match, hence
// written out by hand.
func Lookup(doc []byte, key string) (bson.Type, []byte, bool) {
	if len(doc) < 5 {
		return 0, nil, false
	}
	n := int(int32(binary.LittleEndian.Uint32(doc)))
	if n < 5 || n > len(doc) {
		return 0, nil, false
	}
	b := doc[:n-1]
	kl := len(key)
	for i := 4; i < len(b); {
		t := bson.Type(b[i])
		rest := b[i+1:]
		var k int
		if len(rest) > kl && rest[kl] == 0 && string(rest[:kl]) == key {
			k = kl
		} else if k = bytes.IndexByte(rest, 0); k < 0 {
			return 0, nil, false
		}
		vl := ValueLen(t, rest[k+1:])
		if vl < 0 {
			return 0, nil, false
		}
		if k == kl && string(rest[:k]) == key {
			return t, rest[k+1 : k+1+vl], true
		}
		i += 1 + k + 1 + vl
	}
	return 0, nil, false
}

// Str returns the content of an encoded string, symbol or JavaScript value
// without its length prefix and terminating NUL.
func Str(v []byte) []byte {
	if len(v) < 5 {
		return nil
	}
	return v[4 : len(v)-1]
}

// RegexParts returns the pattern and options of an encoded regex value.
func RegexParts(v []byte) (pattern, options []byte) {
	i := bytes.IndexByte(v, 0)
	if i < 0 {
		return nil, nil
	}
	pattern = v[:i]
	rest := v[i+1:]
	j := bytes.IndexByte(rest, 0)
	if j < 0 {
		return pattern, nil
	}
	return pattern, rest[:j]
}

// Value returns the encoded value v of type t as a bson.RawValue.
func Value(t bson.Type, v []byte) bson.RawValue { return bson.RawValue{Type: t, Value: v} }

// CountElems returns the number of elements in an encoded array.
func CountElems(arr []byte) int {
	n := 0
	it := NewIter(arr)
	for {
		if _, _, _, ok := it.Next(); !ok {
			return n
		}
		n++
	}
}
