package mql

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// mval is a mutable BSON value used while applying updates: documents and
// arrays are decoded into fields/elems, everything else stays raw.
type mval struct {
	t      bson.Type
	raw    []byte
	fields []mfield
	elems  []*mval
}

type mfield struct {
	key string
	v   *mval
}

func decodeValue(t bson.Type, v []byte) *mval {
	m := &mval{t: t}
	switch t {
	case bson.TypeEmbeddedDocument:
		m.fields = []mfield{}
		it := bsonraw.NewIter(v)
		for {
			k, et, ev, ok := it.Next()
			if !ok {
				break
			}
			m.fields = append(m.fields, mfield{key: string(k), v: decodeValue(et, ev)})
		}
	case bson.TypeArray:
		m.elems = []*mval{}
		it := bsonraw.NewIter(v)
		for {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			m.elems = append(m.elems, decodeValue(et, ev))
		}
	default:
		m.raw = v
	}
	return m
}

func newDoc() *mval                 { return &mval{t: bson.TypeEmbeddedDocument, fields: []mfield{}} }
func newArray() *mval               { return &mval{t: bson.TypeArray, elems: []*mval{}} }
func nullValue() *mval              { return &mval{t: bson.TypeNull} }
func fromRaw(v bson.RawValue) *mval { return decodeValue(v.Type, v.Value) }

// encode appends the value's encoding (without type byte or key).
func (m *mval) encode(dst []byte) []byte {
	switch m.t {
	case bson.TypeEmbeddedDocument:
		start := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		for _, f := range m.fields {
			dst = append(dst, byte(f.v.t))
			dst = append(dst, f.key...)
			dst = append(dst, 0)
			dst = f.v.encode(dst)
		}
		dst = append(dst, 0)
		binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
		return dst
	case bson.TypeArray:
		start := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		for i, e := range m.elems {
			dst = append(dst, byte(e.t))
			dst = strconv.AppendInt(dst, int64(i), 10)
			dst = append(dst, 0)
			dst = e.encode(dst)
		}
		dst = append(dst, 0)
		binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
		return dst
	}
	return append(dst, m.raw...)
}

func (m *mval) rawValue() bson.RawValue {
	if m.t == bson.TypeEmbeddedDocument || m.t == bson.TypeArray {
		return bson.RawValue{Type: m.t, Value: m.encode(nil)}
	}
	return bson.RawValue{Type: m.t, Value: m.raw}
}

// same reports binary equality (same types and bytes), MongoDB's test for
// whether an update changed a value.
func same(a, b *mval) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.t != b.t {
		return false
	}
	switch a.t {
	case bson.TypeEmbeddedDocument:
		if len(a.fields) != len(b.fields) {
			return false
		}
		for i := range a.fields {
			if a.fields[i].key != b.fields[i].key || !same(a.fields[i].v, b.fields[i].v) {
				return false
			}
		}
		return true
	case bson.TypeArray:
		if len(a.elems) != len(b.elems) {
			return false
		}
		for i := range a.elems {
			if !same(a.elems[i], b.elems[i]) {
				return false
			}
		}
		return true
	}
	return bytes.Equal(a.raw, b.raw)
}

func (m *mval) field(key string) (*mval, int) {
	for i, f := range m.fields {
		if f.key == key {
			return f.v, i
		}
	}
	return nil, -1
}

func (m *mval) setField(key string, v *mval) {
	if _, i := m.field(key); i >= 0 {
		m.fields[i].v = v
		return
	}
	m.fields = append(m.fields, mfield{key: key, v: v})
}

func (m *mval) removeField(key string) bool {
	if _, i := m.field(key); i >= 0 {
		m.fields = append(m.fields[:i], m.fields[i+1:]...)
		return true
	}
	return false
}

// child returns the value a path component names inside m, if any.
func (m *mval) child(name string) *mval {
	switch m.t {
	case bson.TypeEmbeddedDocument:
		v, _ := m.field(name)
		return v
	case bson.TypeArray:
		if i := bsonraw.ArrayIndex(name); i >= 0 && i < len(m.elems) {
			return m.elems[i]
		}
	}
	return nil
}

// get resolves a dotted path without array traversal (only numeric
// components index arrays), as update paths do.
func (m *mval) get(parts []string) *mval {
	cur := m
	for _, p := range parts {
		if cur = cur.child(p); cur == nil {
			return nil
		}
	}
	return cur
}
