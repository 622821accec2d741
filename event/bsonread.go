package event

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file reads the top level of a change the way the driver's
// bsoncore.ReadElement and Document.LookupErr do (same elements found,
// same failures on malformed input; TestReadElementMatchesDriver and
// FuzzReadElement compare them), in one pass and without re-reading each
// element's key and length as Element.KeyBytes and Element.Value do.

// valueLength is bsoncore's valueLength: the length of the value of type
// t at the start of src, as ReadElement computes it.
func valueLength(src []byte, t byte) (int32, bool) {
	var length int32
	switch bsoncore.Type(t) {
	case bsoncore.TypeArray, bsoncore.TypeEmbeddedDocument, bsoncore.TypeCodeWithScope:
		if len(src) < 4 {
			return 0, false
		}
		length = int32(binary.LittleEndian.Uint32(src))
	case bsoncore.TypeBinary:
		if len(src) < 4 {
			return 0, false
		}
		l := int32(binary.LittleEndian.Uint32(src))
		if l < 0 {
			return 0, false
		}
		length = l + 4 + 1 // may wrap negative: refused below, as bsoncore does
	case bsoncore.TypeBoolean:
		length = 1
	case bsoncore.TypeDBPointer:
		if len(src) < 4 {
			return 0, false
		}
		l := int32(binary.LittleEndian.Uint32(src))
		if l < 0 {
			return 0, false
		}
		length = l + 4 + 12
	case bsoncore.TypeDateTime, bsoncore.TypeDouble, bsoncore.TypeInt64, bsoncore.TypeTimestamp:
		length = 8
	case bsoncore.TypeDecimal128:
		length = 16
	case bsoncore.TypeInt32:
		length = 4
	case bsoncore.TypeJavaScript, bsoncore.TypeString, bsoncore.TypeSymbol:
		if len(src) < 4 {
			return 0, false
		}
		l := int32(binary.LittleEndian.Uint32(src))
		if l < 0 {
			return 0, false
		}
		length = l + 4
	case bsoncore.TypeMaxKey, bsoncore.TypeMinKey, bsoncore.TypeNull, bsoncore.TypeUndefined:
		length = 0
	case bsoncore.TypeObjectID:
		length = 12
	case bsoncore.TypeRegex:
		regex := bytes.IndexByte(src, 0x00)
		if regex < 0 {
			return 0, false
		}
		pattern := bytes.IndexByte(src[regex+1:], 0x00)
		if pattern < 0 {
			return 0, false
		}
		length = int32(int64(regex) + 1 + int64(pattern) + 1)
	default:
		return 0, false
	}
	return length, length >= 0
}

// element is one element of a BSON document, split into its parts.
type element struct {
	t     byte   // the type
	key   []byte // the key, without its NUL
	value []byte // the value's bytes, as Element.Value gives them
	size  int    // the element's length in bytes (type, key, value)
}

// coreValue is the element's value as bsoncore's Element.ValueErr reads
// it, ok false where ValueErr fails: ReadElement accepts a document,
// array or code-with-scope value declaring a length of 0 to 3 bytes (it
// reads the length from the bytes that follow), ValueErr, reading within
// the element, cannot.
func (el element) coreValue() (bsoncore.Value, bool) {
	switch bsoncore.Type(el.t) {
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray, bsoncore.TypeCodeWithScope:
		if len(el.value) < 4 {
			return bsoncore.Value{}, false
		}
	}
	return bsoncore.Value{Type: bsoncore.Type(el.t), Data: el.value}, true
}

// readElement is bsoncore.ReadElement, returning the element's parts:
// ok is false exactly when ReadElement's is, and then rest is src.
func readElement(src []byte) (el element, rest []byte, ok bool) {
	keyEnd, end, ok := elementBounds(src)
	if !ok {
		return el, src, false
	}
	return element{t: src[0], key: src[1:keyEnd], value: src[keyEnd+1 : end], size: end}, src[end:], true
}

// elementBounds is the arithmetic of readElement: the element at the
// start of src has its key in src[1:keyEnd] and its value in
// src[keyEnd+1:end]. The key's NUL is looked for eight bytes at a time.
func elementBounds(src []byte) (keyEnd, end int, ok bool) {
	if len(src) < 1 {
		return 0, 0, false
	}
	idx := 1
	for idx+8 <= len(src) {
		w := binary.LittleEndian.Uint64(src[idx:])
		if z := (w - swarOnes) &^ w & swarHigh; z != 0 {
			idx += bits.TrailingZeros64(z) >> 3 // the lowest flag is exact
			goto found
		}
		idx += 8
	}
	for idx < len(src) && src[idx] != 0 {
		idx++
	}
	if idx >= len(src) {
		return 0, 0, false
	}
found:
	length, ok := valueLength(src[idx+1:], src[0])
	if !ok {
		return 0, 0, false
	}
	end = idx + 1 + int(length)
	if end > len(src) {
		return 0, 0, false
	}
	return idx, end, true
}

// forElements calls fn for each element of doc as Document.LookupErr
// visits them (the declared length bounds the walk, an element that
// cannot be read ends it) until fn returns false; it reports whether the
// walk ended at an element that cannot be read (LookupErr's error).
func forElements(doc []byte, fn func(el element) bool) (malformed bool) {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok {
		return true
	}
	length -= 4
	for length > 1 {
		el, rest, ok := readElement(rem)
		length -= int32(el.size)
		if !ok {
			return true
		}
		rem = rest
		if !fn(el) {
			return false
		}
	}
	return false
}

// lookup is bsoncore.Document(doc).LookupErr(key) (a single key): the
// value of the first element named key, ok false when there is none, an
// element before it cannot be read or its value cannot (ValueErr).
func lookup(doc []byte, key string) (v bsoncore.Value, ok bool) {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok {
		return v, false
	}
	length -= 4
	for length > 1 {
		keyEnd, end, ok := elementBounds(rem)
		if !ok {
			return v, false
		}
		length -= int32(end)
		if string(rem[1:keyEnd]) == key {
			return element{t: rem[0], value: rem[keyEnd+1 : end]}.coreValue()
		}
		rem = rem[end:]
	}
	return v, false
}

// lookup2 is lookup of two keys in one pass, as two LookupErr calls would
// find them (both walks end at the same malformed element).
func lookup2(doc []byte, key1, key2 string) (v1 bsoncore.Value, ok1 bool, v2 bsoncore.Value, ok2 bool) {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok {
		return
	}
	length -= 4
	var seen1, seen2 bool
	for length > 1 && !(seen1 && seen2) {
		keyEnd, end, ok := elementBounds(rem)
		if !ok {
			return
		}
		length -= int32(end)
		switch key := rem[1:keyEnd]; {
		case !seen1 && string(key) == key1:
			seen1 = true
			v1, ok1 = element{t: rem[0], value: rem[keyEnd+1 : end]}.coreValue()
		case !seen2 && string(key) == key2:
			seen2 = true
			v2, ok2 = element{t: rem[0], value: rem[keyEnd+1 : end]}.coreValue()
		}
		rem = rem[end:]
	}
	return
}

// mayHaveDollarKey reports false only when bsonraw.DollarPath(doc) is
// surely "": doc holds no '$' byte at all, or a walk of every key
// DollarPath could visit (documents, arrays, code-with-scope scopes at
// any depth) finds none starting with '$'. It is the cheap test before
// the canonical encoding's DollarPath, which copies each document's
// elements and validates them at every level.
func mayHaveDollarKey(doc []byte) bool {
	if bytes.IndexByte(doc, '$') < 0 {
		return false
	}
	return dollarWalk(doc)
}

// dollarWalk is mayHaveDollarKey's walk: true for a key starting with
// '$', and for anything it does not read as DollarPath would (a scope, an
// element that cannot be read) that holds a '$' byte.
func dollarWalk(doc []byte) bool {
	found := false
	malformed := forElements(doc, func(el element) bool {
		if len(el.key) > 0 && el.key[0] == '$' {
			found = true
			return false
		}
		switch bson.Type(el.t) {
		case bson.TypeEmbeddedDocument, bson.TypeArray:
			found = dollarWalk(el.value)
		case bson.TypeCodeWithScope:
			found = bytes.IndexByte(el.value, '$') >= 0
		}
		return !found
	})
	return found || malformed
}
